"""End to end on one GPU (or two: --prefill-gpu, --decode-gpu): a Hugging Face model prefills in one process and decodes in
another, the KV pages moving layer by layer over the nvlink provider (docs/KV.md, "GPU").

    python -m ferry.kv.e2e --lengths 1000,4000,16000 --out results.json

The model is a transformers Qwen3 (Llama if this transformers has no Qwen3) built from a
config with random weights (the same seed in both processes: the same weights). Both
sides keep a paged KV cache (KvLayout, HND pages of 16 tokens); the prefill forward runs
as a CUDA graph captured once per prompt length, whose cache hook writes each layer's K
and V into the pages and bumps the StepSubmits watcher word (``word.add_(1)`` on the
host-mapped word): the engine's watcher thread posts that layer's writes, no Python runs
per layer. After the last layer the graph writes the context (first token, last hidden
state, last logits) and bumps once more. The decoder rebuilds transformers' DynamicCache
from its pages and decodes greedily; the prefill process decodes the same prompt
colocated; tokens and every page are compared. TTFT: from the router sending the
prompt to the prefiller and the request to the decoder (at once) to the first token in
the decoder, against the router sending the prompt to the prefill process and the first
token there (colocated: same process, same graph), in alternating rounds. The engines'
traces give where the time after the forward goes (ferry.kv.e2e_report).
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import sys
import time
import tempfile
import traceback

import numpy as np

TPP = 16
DECODE_TOKENS = 16


def model_config(args):
    import transformers

    common = dict(vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                  num_hidden_layers=args.layers, num_attention_heads=16, num_key_value_heads=4,
                  max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False)
    if hasattr(transformers, "Qwen3Config"):
        return transformers.Qwen3Config(head_dim=128, **common), "qwen3"
    return transformers.LlamaConfig(head_dim=128, **common), "llama"


def build_model(args, device):
    import torch
    import transformers

    cfg, arch = model_config(args)
    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(1234)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16,
                                                              attn_implementation="sdpa")
    model.eval().requires_grad_(False)
    return model, cfg, arch


def prompt(seed: int, n: int, device):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 32000, (1, n), generator=g).to(device)


def kv_layout(cfg, num_pages: int):
    from ferry.kv import KvLayout

    return KvLayout(model=f"e2e-{cfg.num_hidden_layers}x{cfg.hidden_size}", num_layers=cfg.num_hidden_layers,
                    num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, dtype="bfloat16",
                    tokens_per_page=TPP, num_pages=num_pages)


def ctx_len(cfg) -> int:
    return 8 + cfg.hidden_size * 2 + cfg.vocab_size * 2


class _WordView:
    """One int64 at a raw device address, for torch.as_tensor (CUDA array interface)."""

    def __init__(self, addr: int) -> None:
        self.__cuda_array_interface__ = {"shape": (1,), "typestr": "<i8", "data": (addr, False),
                                         "version": 3}


def paged_cache_class():
    """transformers' DynamicCache that also writes each layer into pages and bumps a word."""
    import torch
    from transformers import DynamicCache

    class PagingCache(DynamicCache):
        def attach(self, pages, page_ids, ntok, word):
            self._pages, self._ids, self._ntok, self._word = pages, page_ids, ntok, word
            return self

        def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
            out = super().update(key_states, value_states, layer_idx, cache_kwargs)
            pages = getattr(self, "_pages", None)
            if pages is not None:
                n = self._ids.numel()
                for kind, t in ((0, key_states), (1, value_states)):
                    h, d = t.shape[1], t.shape[3]
                    pad = torch.nn.functional.pad(t[0], (0, 0, 0, n * TPP - self._ntok))
                    pages[layer_idx, kind].index_copy_(
                        0, self._ids, pad.view(h, n, TPP, d).transpose(0, 1))
                if self._word is not None:
                    self._word.add_(1)  # layer done: the watcher posts its pages
            return out

    return PagingCache


def cache_from_pages(pages, page_ids, ntok):
    from transformers import DynamicCache

    cache = DynamicCache()
    n = page_ids.numel()
    for layer in range(pages.shape[0]):
        kv = []
        for kind in (0, 1):
            p = pages[layer, kind].index_select(0, page_ids)  # [n, H, TPP, D]
            kv.append(p.transpose(0, 1).reshape(p.shape[1], n * TPP, p.shape[3])[:, :ntok][None])
        cache.update(kv[0], kv[1], layer)
    return cache


def greedy(model, first_token, cache, ntok, steps, device):
    """Greedy tokens and, per step, the gap between the two best (float32) logits: a
    token that flips between two runs with identical inputs flips where that gap is a
    rounding step of the logits."""
    import torch

    toks, gaps = [int(first_token)], []
    cur = torch.tensor([[toks[0]]], device=device)
    # Decoding is compared token for token across processes; with random weights the
    # best two logits are often within a rounding step, so a kernel that reduces in a
    # different order between two runs flips a token (seen: one decode of the same pages
    # twice in one process gave two answers). Deterministic kernels for the decode only;
    # the prefill, which is what is timed, runs the default ones.
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        return _greedy_steps(model, cur, cache, ntok, steps, toks, gaps, device)
    finally:
        torch.use_deterministic_algorithms(was, warn_only=True)


def _greedy_steps(model, cur, cache, ntok, steps, toks, gaps, device):
    import torch

    # The argmax is taken over float32 logits: in bf16 the best two of 32 000 nearly
    # flat logits are often equal (seen: a gap of exactly 0.0), and a tie is broken by
    # the last bit of whatever reduction came first.
    w = model.lm_head.weight.float()
    with torch.no_grad():
        for i in range(steps - 1):
            pos = torch.tensor([ntok + i], device=device)
            out = model.model(input_ids=cur, past_key_values=cache, use_cache=True,
                              cache_position=pos)
            logits = torch.nn.functional.linear(out.last_hidden_state[0, -1].float(), w)
            top = logits.topk(2).values
            gaps.append(float(top[0] - top[1]))
            nxt = int(logits.argmax())
            toks.append(nxt)
            cur = torch.tensor([[nxt]], device=device)
    return toks, gaps


def cache_kv(cache, layer):
    if hasattr(cache, "layers"):  # transformers >= 4.54
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


def page_sums(pages, page_ids):
    import torch

    # Per page: the sum of its bf16 bit patterns and a position-weighted sum (a byte
    # swapped, moved or zeroed within the page changes the second).
    p = pages.index_select(2, page_ids).view(torch.int16).to(torch.int64)
    p = p.flatten(3)
    w = (torch.arange(p.shape[3], device=p.device, dtype=torch.int64) * 2654435761) % 65521 + 1
    return [p.sum(dim=3).cpu().tolist(), (p * w).sum(dim=3).cpu().tolist()]  # 2 x [L][2][n]


# ---------------------------------------------------------------------- prefill process

def _leave(res_q) -> None:
    """End a rank process once its last answer is sent: the interpreter's own exit (the
    engine's objects, CUDA's IPC mappings of the peer) once held a finished run for
    minutes, until the run's time limit."""
    res_q.close()
    res_q.join_thread()  # the answer is in the pipe
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def prefill_main(args, cmd_q, res_q) -> None:
    try:
        _prefill(args, cmd_q, res_q)
    except Exception:  # noqa: BLE001
        res_q.put(("error", traceback.format_exc()))
    _leave(res_q)


def _prefill(args, cmd_q, res_q) -> None:
    import torch

    import ferry
    from ferry.kv import KvSender

    dev = torch.device(f"cuda:{args.prefill_gpu}")
    torch.cuda.set_device(dev)
    model, cfg, arch = build_model(args, dev)
    L = cfg.num_hidden_layers
    max_tok = max(args.lengths)
    num_pages = -(-max_tok // TPP) + 8
    lay = kv_layout(cfg, num_pages)
    pages = torch.zeros(L, 2, num_pages, cfg.num_key_value_heads, TPP, cfg.head_dim,
                        dtype=torch.bfloat16, device=dev)
    clen = ctx_len(cfg)
    ctx_stage = torch.zeros(clen, dtype=torch.uint8, device=dev)
    e = ferry.TransferEngine("nvlink", groups=[ferry.Group(str(dev))], default_timeout=60,
                             poll_mode=args.poll, trace=args.prefill_trace)
    sender = KvSender(e, lay, [pages], context_bytes=clen, max_jobs=1, use_watcher=True,
                      context_buffer=ctx_stage)
    word = torch.as_tensor(_WordView(sender.clock.word), device=dev)
    PagingCache = paged_cache_class()
    wsum = sum(float(p.float().sum()) for p in list(model.parameters())[:4])
    res_q.put(("hello", e.main_address, arch, sum(p.numel() for p in model.parameters()), wsum,
               clen))

    graphs = {}
    bumps = [0]  # word value the host knows the graph reached (L + 1 per forward)
    gc.collect()
    gc.freeze()

    def forward(ids, ntok, page_ids, bump):
        cache = PagingCache().attach(pages, page_ids, ntok, word if bump else None)
        out = model.model(input_ids=ids, past_key_values=cache, use_cache=True)
        h = out.last_hidden_state[0, -1]
        logits = model.lm_head(h)
        tok = logits.argmax(-1)
        if bump:
            ctx_stage[:8].copy_(tok.to(torch.int64).view(1).view(torch.uint8))
            ctx_stage[8:8 + 2 * h.numel()].copy_(h.contiguous().view(torch.uint8))
            ctx_stage[8 + 2 * h.numel():].copy_(logits.to(torch.bfloat16).contiguous().view(torch.uint8))
            word.add_(1)  # the context step
        return tok, cache

    def graph_for(ntok):
        if ntok in graphs:
            return graphs[ntok]
        n = -(-ntok // TPP)
        ids = torch.zeros(1, ntok, dtype=torch.long, device=dev)
        page_ids = torch.arange(n, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(2):
                forward(ids, ntok, page_ids, True)
                bumps[0] += L + 1
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        try:
            if args.eager:
                raise RuntimeError("--eager")
            with torch.no_grad(), torch.cuda.graph(g):
                tok, cache = forward(ids, ntok, page_ids, True)
        except Exception as exc:  # noqa: BLE001: capture refused: run eagerly, say so
            print(f"CUDA graph capture failed ({type(exc).__name__}: {exc}); eager prefill",
                  flush=True)
            torch.cuda.synchronize()
            holder = {}

            class _Eager:
                def replay(self):
                    with torch.no_grad():
                        holder["tok"], holder["cache"] = forward(ids, ntok, page_ids, True)

            g = _Eager()
            g.replay()
            bumps[0] += L + 1
            torch.cuda.synchronize()
            graphs[ntok] = (g, ids, page_ids, None, holder)
            return graphs[ntok]
        graphs[ntok] = (g, ids, page_ids, tok, cache)
        return graphs[ntok]

    now = time.monotonic_ns  # CLOCK_MONOTONIC: the router's and the decoder's clock too
    while True:
        cmd = cmd_q.get()
        if cmd[0] == "stop":
            sender.close()
            e.stop()  # writes the trace
            res_q.put(("ok", None))
            return
        if cmd[0] == "warm":  # capture the graph for a length before anything is timed
            graph_for(cmd[1])
            res_q.put(("ok", None))
        elif cmd[0] == "colocated":  # the router's prompt -> the first token, here
            _, rid, ntok, t0 = cmd
            t_recv = now()
            g, ids, page_ids, tok, cache = graph_for(ntok)
            ids.copy_(prompt(rid, ntok, dev))
            t_launch = now()
            g.replay()
            first = int(tok) if tok is not None else int(cache["tok"])  # waits for the graph
            t_end = now()
            bumps[0] += L + 1
            res_q.put(("ok", {"ttft_ns": t_end - t0, "recv_ns": t_recv - t0,
                              "graph_ns": t_end - t_launch, "first": first}))
        elif cmd[0] == "serve":  # the router's prompt -> this layer-by-layer push
            _, rid, ntok, t0 = cmd
            t_recv = now()
            g, ids, page_ids, tok, cache = graph_for(ntok)
            ids.copy_(prompt(rid, ntok, dev))
            t_launch = now()
            # Launch first, accept while the GPU runs: steps the word passed before the
            # job was bound are posted at once when it is (StepSubmits.add).
            g.replay()
            base = bumps[0]
            bumps[0] += L + 1
            sender.wait_request(rid, timeout=60)  # the decoder's REQUEST, sent meanwhile
            t_req = now()
            job = sender.accept(rid, list(range(-(-ntok // TPP))), base=base)
            t_acc = now()
            torch.cuda.synchronize()
            t_graph = now()
            job.wait(60)
            t_done = now()
            res_q.put(("ok", {"recv_ns": t_recv - t0, "launch_ns": t_launch - t0,
                              "request_seen_ns": t_req - t0, "accepted_ns": t_acc - t0,
                              "graph_done_ns": t_graph - t0, "job_done_ns": t_done - t0,
                              "window": (t_launch, t_done), "stats": job.stats()}))
        elif cmd[0] == "decode":  # greedy from this side's pages, as the decoder does
            _, rid, ntok = cmd
            g, ids, page_ids, tok, cache = graph_for(ntok)
            first = int(tok) if tok is not None else int(cache["tok"])
            toks, gaps = greedy(model, first, cache_from_pages(pages, page_ids, ntok), ntok,
                                DECODE_TOKENS, dev)
            res_q.put(("ok", {"tokens": toks, "gaps": gaps, "sums": page_sums(pages, page_ids)}))


# ---------------------------------------------------------------------- decode process

def decode_main(args, prefill_addr, cmd_q, res_q) -> None:
    try:
        _decode(args, prefill_addr, cmd_q, res_q)
    except Exception:  # noqa: BLE001
        res_q.put(("error", traceback.format_exc()))
    _leave(res_q)


def _decode(args, prefill_addr, cmd_q, res_q) -> None:
    import torch

    import ferry
    from ferry.kv import KvReceiver

    dev = torch.device(f"cuda:{args.decode_gpu}")
    torch.cuda.set_device(dev)
    model, cfg, _ = build_model(args, dev)
    L = cfg.num_hidden_layers
    num_pages = -(-max(args.lengths) // TPP) + 64
    lay = kv_layout(cfg, num_pages)
    pages = torch.zeros(L, 2, num_pages, cfg.num_key_value_heads, TPP, cfg.head_dim,
                        dtype=torch.bfloat16, device=dev)
    clen = ctx_len(cfg)
    ctx = torch.zeros(clen, dtype=torch.uint8, device=dev)
    e = ferry.TransferEngine("nvlink", groups=[ferry.Group(str(dev))], default_timeout=60,
                             poll_mode=args.poll, trace=args.decode_trace)
    rx = KvReceiver(e, lay, [pages], context=ctx, context_slot_bytes=clen)
    link = rx.connect(prefill_addr, timeout=60)
    wsum = sum(float(p.float().sum()) for p in list(model.parameters())[:4])
    res_q.put(("hello", wsum))
    first_page = 37  # contiguous pages at an offset of the decoder's own choosing
    page_lists = {}
    now = time.monotonic_ns
    # The model's objects out of the cyclic collector's way, as serving engines do after
    # start-up: a collection on the release path would scan all of them.
    gc.collect()
    gc.freeze()
    while True:
        cmd = cmd_q.get()
        if cmd[0] == "stop":
            e.stop()
            res_q.put(("ok", None))
            return
        if cmd[0] == "request":  # the router's request -> the first token, here
            _, rid, ntok, t0 = cmd
            t_recv = now()
            n = -(-ntok // TPP)
            ids = page_lists.setdefault(n, np.arange(first_page, first_page + n, dtype=np.uint32))
            req = rx.request(rid, ids, ntok, [link], ctx_slot=0, ctx_len=clen, deadline=60)
            # Busy: the decoder's thread polls like its worker, rather than sleep
            # through the prefill and pay a wake-up at its end.
            req.wait(60, spin=args.poll == "busy")
            t_rel = now()
            first = int(ctx[:8].view(torch.int64)[0])  # the first token, from the context
            t_end = now()
            ctx.zero_()  # for the next request, after the clock stopped
            torch.cuda.synchronize()
            res_q.put(("ok", {"ttft_ns": t_end - t0, "recv_ns": t_recv - t0,
                              "released_ns": t_rel, "seen_ns": req.seen_ns,
                              "pages_released_ns": req.released_ns, "first": first}))
        elif cmd[0] == "decode":
            _, rid, ntok, first = cmd
            n = -(-ntok // TPP)
            page_ids = torch.arange(first_page, first_page + n, device=dev)
            moved = cache_from_pages(pages, page_ids, ntok)
            # This process's own colocated generation of the same prompt: an eager prefill
            # into a plain DynamicCache, then the same greedy decode.
            from transformers import DynamicCache

            own = DynamicCache()
            with torch.no_grad():
                out = model.model(input_ids=prompt(rid, ntok, dev), past_key_values=own,
                                  use_cache=True)
                own_first = int(model.lm_head(out.last_hidden_state[0, -1]).argmax(-1))
            same_kv = sum(int(torch.equal(cache_kv(own, layer)[kind], cache_kv(moved, layer)[kind]))
                          for layer in range(L) for kind in (0, 1))
            sums = page_sums(pages, page_ids)
            toks, gaps = greedy(model, first, moved, ntok, DECODE_TOKENS, dev)
            own_toks, own_gaps = greedy(model, own_first, own, ntok, DECODE_TOKENS, dev)
            again, _ = greedy(model, first, cache_from_pages(pages, page_ids, ntok), ntok,
                              DECODE_TOKENS, dev)
            res_q.put(("ok", {"tokens": toks, "gaps": gaps, "sums": sums,
                              "own_tokens": own_toks, "own_gaps": own_gaps,
                              "kv_equal_to_own": same_kv, "kv_tensors": 2 * L,
                              "repeat_tokens": again}))


# ---------------------------------------------------------------------- driver

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1000,4000,16000")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="")
    ap.add_argument("--trace-dir", default="", help="keep both engines' traces here")
    ap.add_argument("--eager", action="store_true", help="no CUDA graph (comparison)")
    ap.add_argument("--poll", choices=("busy", "adaptive"), default="busy",
                    help="both engines' poll mode (busy: a core per worker, as a server runs)")
    ap.add_argument("--deterministic", action="store_true",
                    help="deterministic algorithms for the prefill too (the decode always)")
    ap.add_argument("--prefill-gpu", type=int, default=0, help="CUDA device of the prefill process")
    ap.add_argument("--decode-gpu", type=int, default=0, help="CUDA device of the decode process")
    args = ap.parse_args(argv)
    args.lengths = [int(x) for x in args.lengths.split(",")]
    tdir = args.trace_dir or tempfile.mkdtemp(prefix="ferry-kv-e2e-")
    os.makedirs(tdir, exist_ok=True)
    args.prefill_trace = os.path.join(tdir, "prefill.json")
    args.decode_trace = os.path.join(tdir, "decode.json")
    # cuBLAS is deterministic only with a fixed workspace (the decode's deterministic
    # kernels, greedy()); set before either process starts CUDA.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    ctx = mp.get_context("spawn")
    pq, pr, dq, dr = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    pp = ctx.Process(target=prefill_main, args=(args, pq, pr), daemon=True)
    pp.start()

    def get(q, what, timeout=600):
        m = q.get(timeout=timeout)
        if m[0] == "error":
            raise RuntimeError(f"{what} failed:\n{m[1]}")
        return m

    _, addr, arch, params, wsum_p, clen = get(pr, "prefill start", timeout=240)
    dp = ctx.Process(target=decode_main, args=(args, addr, dq, dr), daemon=True)
    dp.start()
    _, wsum_d = get(dr, "decode start", timeout=240)
    results = {"arch": arch, "params": params, "layers": args.layers, "hidden": args.hidden,
               "prefill_gpu": args.prefill_gpu, "decode_gpu": args.decode_gpu,
               "deterministic": args.deterministic, "poll": args.poll,
               "same_weights": wsum_p == wsum_d,
               "ctx_bytes": clen, "runs": []}
    print(f"model {arch}, {params / 1e9:.2f} B parameters, weights equal: {wsum_p == wsum_d}",
          flush=True)
    ok = True
    serves = []
    for i, ntok in enumerate(args.lengths):
        try:
            ok &= _one_length(args, i, ntok, pq, pr, dq, dr, get, results, serves)
        except Exception:  # noqa: BLE001: report what ran, then stop
            results["error"] = traceback.format_exc()
            print(results["error"], flush=True)
            ok = False
            break
    pq.put(("stop",))
    dq.put(("stop",))
    try:
        get(pr, "prefill stop", timeout=60)
        get(dr, "decode stop", timeout=60)
        _add_breakdown(args, results, serves)
    except Exception:  # noqa: BLE001: the runs above still count
        results["breakdown_error"] = traceback.format_exc()
        print(results["breakdown_error"], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if ok else 1


def _one_length(args, i, ntok, pq, pr, dq, dr, get, results, serves) -> bool:
    rid0 = 1000 * (i + 1)
    pq.put(("warm", ntok))
    get(pr, f"graph capture {ntok}")
    med = lambda xs: xs[len(xs) // 2]  # noqa: E731
    now = time.monotonic_ns
    d_runs, s_runs, c_runs = [], [], []
    for r in range(args.reps):
        # Disaggregated: the router sends the prompt to the prefiller and the request to
        # the decoder at once (as SGLang's and vLLM's routers do); TTFT is from there to
        # the first token in the decoder. Colocated: the same prompt to the prefill
        # process, to the first token there. Alternating, so both see the same machine.
        rid = rid0 + r
        t0 = now()
        pq.put(("serve", rid, ntok, t0))
        dq.put(("request", rid, ntok, t0))
        d_runs.append(get(dr, f"request {rid}")[1])
        s_runs.append(get(pr, f"serve {rid}")[1])
        t0 = now()
        pq.put(("colocated", rid, ntok, t0))
        c_runs.append(get(pr, f"colocated {rid}")[1])
    last = rid0 + args.reps - 1
    pq.put(("decode", last, ntok))
    _, c = get(pr, f"colocated decode {ntok}")
    dq.put(("decode", last, ntok, d_runs[-1]["first"]))
    _, d = get(dr, f"decode {ntok}")
    for x, s in zip(d_runs, s_runs):
        serves.append({"tokens": ntok, "window": s.pop("window"), "released_ns": x["released_ns"],
                       "seen_ns": x["seen_ns"], "pages_released_ns": x["pages_released_ns"]})
    same_tokens = d["tokens"] == c["tokens"]
    same_pages = d["sums"] == c["sums"]
    ttft_d = med(sorted(x["ttft_ns"] for x in d_runs)) / 1e6
    ttft_c = med(sorted(x["ttft_ns"] for x in c_runs)) / 1e6
    ms = lambda runs, k: med(sorted(x[k] for x in runs)) / 1e6  # noqa: E731
    first_diff = lambda a, b: next((k for k, (u, v) in enumerate(zip(a, b)) if u != v), None)  # noqa: E731
    fd = first_diff(d["tokens"], c["tokens"])
    run = {"tokens": ntok, "same_tokens": same_tokens, "same_pages": same_pages,
           "same_tokens_as_decoder_colocated": d["tokens"] == d["own_tokens"],
           "kv_equal_to_decoder_colocated": f'{d["kv_equal_to_own"]}/{d["kv_tensors"]}',
           "decode_repeatable": d["tokens"] == d["repeat_tokens"],
           "ttft_disagg_ms": ttft_d, "ttft_coloc_ms": ttft_c, "overhead": ttft_d / ttft_c - 1,
           "ttft_disagg_all_ms": [x["ttft_ns"] / 1e6 for x in d_runs],
           "ttft_coloc_all_ms": [x["ttft_ns"] / 1e6 for x in c_runs],
           "coloc_graph_ms": ms(c_runs, "graph_ns"), "coloc_recv_ms": ms(c_runs, "recv_ns"),
           "prefill_recv_ms": ms(s_runs, "recv_ns"), "prefill_launch_ms": ms(s_runs, "launch_ns"),
           "request_seen_ms": ms(s_runs, "request_seen_ns"),
           "accepted_ms": ms(s_runs, "accepted_ns"), "graph_done_ms": ms(s_runs, "graph_done_ns"),
           "job_done_ms": ms(s_runs, "job_done_ns"), "decoder_recv_ms": ms(d_runs, "recv_ns"),
           "writes": s_runs[-1]["stats"], "decoded": d["tokens"], "colocated": c["tokens"],
           "decoder_colocated": d["own_tokens"], "first_difference": fd,
           "gap_at_first_difference": None if fd is None or fd == 0 else
           [d["gaps"][fd - 1], c["gaps"][fd - 1]],
           "gaps_decoded": d["gaps"], "gaps_colocated": c["gaps"]}
    results["runs"].append(run)
    print(json.dumps({k: v for k, v in run.items() if not k.startswith("gaps_")}), flush=True)
    return same_tokens and same_pages


def _add_breakdown(args, results, serves) -> None:
    """Exposed transfer per request from the prefill engine's trace (e2e_report)."""
    from ferry.kv import e2e_report

    spans = e2e_report.prepared_spans(args.prefill_trace)
    imms = e2e_report.imm_instants(args.decode_trace)
    by_len = {}
    for sv in serves:
        b = e2e_report.request_breakdown(spans, tuple(sv["window"]), results["ctx_bytes"],
                                         args.layers, sv["released_ns"], imms,
                                         seen_ns=sv["seen_ns"] or None,
                                         pages_released_ns=sv["pages_released_ns"] or None)
        by_len.setdefault(sv["tokens"], []).append(b)
    for run in results["runs"]:
        bs = by_len.get(run["tokens"], [])
        if bs:
            run["breakdown_us"] = {k: e2e_report.median([b[k] for b in bs]) for k in bs[0]}
            bd = run["breakdown_us"]
            run["exposed_within_one_layer"] = bd["exposed_us"] <= bd["layer_us"]
            run["exposed_engine_within_one_layer"] = \
                bd.get("exposed_engine_us", float("inf")) <= bd["layer_us"]
            print(json.dumps({"tokens": run["tokens"], "breakdown_us": run["breakdown_us"]}),
                  flush=True)


if __name__ == "__main__":
    sys.exit(main())
