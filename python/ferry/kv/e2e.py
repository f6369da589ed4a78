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
colocated; tokens and every page are compared. TTFT: the decoder's request to its
context arriving, against the colocated graph prefill (same process, same graph).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import traceback

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
    import torch

    toks = [int(first_token)]
    cur = torch.tensor([[toks[0]]], device=device)
    with torch.no_grad():
        for i in range(steps - 1):
            pos = torch.tensor([ntok + i], device=device)
            out = model(input_ids=cur, past_key_values=cache, use_cache=True, cache_position=pos)
            nxt = int(out.logits[0, -1].argmax())
            toks.append(nxt)
            cur = torch.tensor([[nxt]], device=device)
    return toks


def page_sums(pages, page_ids):
    import torch

    # Per page: the sum of its bf16 bit patterns and a position-weighted sum (a byte
    # swapped, moved or zeroed within the page changes the second).
    p = pages.index_select(2, page_ids).view(torch.int16).to(torch.int64)
    p = p.flatten(3)
    w = (torch.arange(p.shape[3], device=p.device, dtype=torch.int64) * 2654435761) % 65521 + 1
    return [p.sum(dim=3).cpu().tolist(), (p * w).sum(dim=3).cpu().tolist()]  # 2 x [L][2][n]


# ---------------------------------------------------------------------- prefill process

def prefill_main(args, cmd_q, res_q) -> None:
    try:
        _prefill(args, cmd_q, res_q)
    except Exception:  # noqa: BLE001
        res_q.put(("error", traceback.format_exc()))


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
    e = ferry.TransferEngine("nvlink", groups=[ferry.Group(str(dev))], default_timeout=60)
    sender = KvSender(e, lay, [pages], context_bytes=clen, max_jobs=1, use_watcher=True,
                      context_buffer=ctx_stage)
    word = torch.as_tensor(_WordView(sender.clock.word), device=dev)
    PagingCache = paged_cache_class()
    wsum = sum(float(p.float().sum()) for p in list(model.parameters())[:4])
    res_q.put(("hello", e.main_address, arch, sum(p.numel() for p in model.parameters()), wsum))

    graphs = {}
    bumps = [0]  # word value the host knows the graph reached (L + 1 per forward)

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

    while True:
        cmd = cmd_q.get()
        if cmd[0] == "stop":
            sender.close()
            e.stop()
            res_q.put(("ok", None))
            return
        if cmd[0] == "colocated":  # graph prefill + greedy decode in this process
            _, seed, ntok, reps = cmd
            g, ids, page_ids, tok, cache = graph_for(ntok)
            ids.copy_(prompt(seed, ntok, dev))
            times = []
            for _ in range(reps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                g.replay()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
                bumps[0] += L + 1
            first = int(tok if tok is not None else cache["tok"])
            # Decode from a cache rebuilt from this side's pages, as the decoder does.
            toks = greedy(model, first, cache_from_pages(pages, page_ids, ntok), ntok,
                          DECODE_TOKENS, dev)
            res_q.put(("ok", {"ttft_s": sorted(times), "tokens": toks,
                              "sums": page_sums(pages, page_ids)}))
        elif cmd[0] == "serve":  # serve one disaggregated request per rep
            _, ntok, reps = cmd
            g, ids, page_ids, tok, cache = graph_for(ntok)
            out = []
            for _ in range(reps):
                p = sender.wait_request(timeout=60)
                ids.copy_(prompt(p.req_id, ntok, dev))
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                # Launch first, accept while the GPU runs: steps the word passed before
                # the job was bound are posted at once when it is (StepSubmits.add).
                g.replay()
                base = bumps[0]
                bumps[0] += L + 1
                job = sender.accept(p.req_id, list(range(-(-ntok // TPP))), base=base)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                job.wait(60)
                t3 = time.perf_counter()
                out.append({"accept_s": t1 - t0, "graph_s": t2 - t0, "drain_s": t3 - t2,
                            "stats": job.stats()})
            res_q.put(("ok", {"serve": out, "sums": page_sums(pages, page_ids)}))


# ---------------------------------------------------------------------- decode process

def decode_main(args, prefill_addr, cmd_q, res_q) -> None:
    try:
        _decode(args, prefill_addr, cmd_q, res_q)
    except Exception:  # noqa: BLE001
        res_q.put(("error", traceback.format_exc()))


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
    e = ferry.TransferEngine("nvlink", groups=[ferry.Group(str(dev))], default_timeout=60)
    rx = KvReceiver(e, lay, [pages], context=ctx, context_slot_bytes=clen)
    link = rx.connect(prefill_addr, timeout=60)
    wsum = sum(float(p.float().sum()) for p in list(model.parameters())[:4])
    res_q.put(("hello", wsum))
    while True:
        cmd = cmd_q.get()
        if cmd[0] == "stop":
            e.stop()
            res_q.put(("ok", None))
            return
        _, rid0, ntok, reps = cmd
        n = -(-ntok // TPP)
        first_page = 37  # contiguous pages at an offset of the decoder's own choosing
        page_ids = torch.arange(first_page, first_page + n, device=dev)
        ttft = []
        for r in range(reps):
            ctx.zero_()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            req = rx.request(rid0 + r, list(range(first_page, first_page + n)), ntok, [link],
                             ctx_slot=0, ctx_len=clen, deadline=60)
            req.wait(60)
            first = int(ctx[:8].view(torch.int64)[0])  # the first token, from the context
            ttft.append(time.perf_counter() - t0)
        toks = greedy(model, first, cache_from_pages(pages, page_ids, ntok), ntok,
                      DECODE_TOKENS, dev)
        res_q.put(("ok", {"ttft_s": sorted(ttft), "tokens": toks,
                          "sums": page_sums(pages, page_ids)}))


# ---------------------------------------------------------------------- driver

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1000,4000,16000")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="")
    ap.add_argument("--eager", action="store_true", help="no CUDA graph (comparison)")
    ap.add_argument("--prefill-gpu", type=int, default=0, help="CUDA device of the prefill process")
    ap.add_argument("--decode-gpu", type=int, default=0, help="CUDA device of the decode process")
    args = ap.parse_args(argv)
    args.lengths = [int(x) for x in args.lengths.split(",")]
    ctx = mp.get_context("spawn")
    pq, pr, dq, dr = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    pp = ctx.Process(target=prefill_main, args=(args, pq, pr), daemon=True)
    pp.start()

    def get(q, what, timeout=600):
        m = q.get(timeout=timeout)
        if m[0] == "error":
            raise RuntimeError(f"{what} failed:\n{m[1]}")
        return m

    _, addr, arch, params, wsum_p = get(pr, "prefill start")
    dp = ctx.Process(target=decode_main, args=(args, addr, dq, dr), daemon=True)
    dp.start()
    _, wsum_d = get(dr, "decode start")
    results = {"arch": arch, "params": params, "layers": args.layers, "hidden": args.hidden,
               "prefill_gpu": args.prefill_gpu, "decode_gpu": args.decode_gpu,
               "same_weights": wsum_p == wsum_d, "runs": []}
    print(f"model {arch}, {params / 1e9:.2f} B parameters, weights equal: {wsum_p == wsum_d}",
          flush=True)
    ok = True
    for i, ntok in enumerate(args.lengths):
        try:
            ok &= _one_length(args, i, ntok, pq, pr, dq, dr, get, results)
        except Exception:  # noqa: BLE001: report what ran, then stop
            results["error"] = traceback.format_exc()
            print(results["error"], flush=True)
            ok = False
            break
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    pq.put(("stop",))
    dq.put(("stop",))
    return 0 if ok else 1


def _one_length(args, i, ntok, pq, pr, dq, dr, get, results) -> bool:
    rid0 = 1000 * (i + 1)
    pq.put(("serve", ntok, args.reps))
    dq.put(("run", rid0, ntok, args.reps))
    _, d = get(dr, f"decode {ntok}")
    _, s = get(pr, f"serve {ntok}")
    # Colocated reference: the same prompt (the last rep's seed), same graph.
    pq.put(("colocated", rid0 + args.reps - 1, ntok, args.reps))
    _, c = get(pr, f"colocated {ntok}")
    same_tokens = d["tokens"] == c["tokens"]
    same_pages = d["sums"] == c["sums"]
    med = lambda xs: xs[len(xs) // 2]  # noqa: E731
    run = {"tokens": ntok, "same_tokens": same_tokens, "same_pages": same_pages,
           "ttft_disagg_ms": med(d["ttft_s"]) * 1e3, "ttft_coloc_ms": med(c["ttft_s"]) * 1e3,
           "overhead": med(d["ttft_s"]) / med(c["ttft_s"]) - 1,
           "prefill_graph_ms": med([x["graph_s"] for x in s["serve"]]) * 1e3,
           "accept_ms": med([x["accept_s"] for x in s["serve"]]) * 1e3,
           "drain_after_graph_ms": med([x["drain_s"] for x in s["serve"]]) * 1e3,
           "writes": s["serve"][-1]["stats"], "decoded": d["tokens"], "colocated": c["tokens"],
           "first_difference": next((k for k, (a, b) in enumerate(zip(d["tokens"], c["tokens"]))
                                     if a != b), None)}
    results["runs"].append(run)
    print(json.dumps(run), flush=True)
    return same_tokens and same_pages


if __name__ == "__main__":
    sys.exit(main())
