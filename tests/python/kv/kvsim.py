"""A simulated prefill instance in its own process, and the deterministic KV it computes.

Every KV element is a function of (request seed, token, layer, K/V, head, dim), so the
decoder verifies each page it received byte for byte without a copy of the prefiller's
cache. The peer process runs `tp` prefill ranks (one engine and KvSender each); a thread
per rank serves requests as a prefill engine would: allocate its pages, compute each
layer, mark it done, write the context. Commands from the test steer single requests
(hold after a step, abort at a step, die at a step).
"""

from __future__ import annotations

import faulthandler
import os
import queue
import signal
import sys
import threading
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import ferry  # noqa: E402
from ferry.kv import KvLayout, KvSender  # noqa: E402

GEOM = dict(model="sim-1", num_layers=4, num_kv_heads=4, head_dim=16, dtype="float16",
            tokens_per_page=8)
CTX_BYTES = 96


def layout(tp: int, rank: int, num_pages: int, **kw) -> KvLayout:
    g = dict(GEOM)
    g.update(kw)
    return KvLayout(num_pages=num_pages, tp_rank=rank, tp_size=tp, **g)


def values(seed: int, tokens: np.ndarray, layer: int, kind: int, heads: range, head_dim: int):
    """uint16 KV values, shape [tokens, heads, head_dim]."""
    t = tokens.astype(np.uint64)[:, None, None]
    h = np.asarray(list(heads), dtype=np.uint64)[None, :, None]
    d = np.arange(head_dim, dtype=np.uint64)[None, None, :]
    x = (t * np.uint64(1000003) + h * np.uint64(31337) + d * np.uint64(613)
         + np.uint64(layer * 7919 + kind * 104729 + seed * 15485863))
    x = (x * np.uint64(2654435761)) ^ (x >> np.uint64(13))
    return ((x >> np.uint64(7)) & np.uint64(0xFFFF)).astype(np.uint16)


def page_image(lay: KvLayout, seed: int, pages: int, layer: int, kind: int) -> np.ndarray:
    """The bytes (as uint16) of `pages` pages of this rank, shape [pages, page_elems]."""
    tpp = lay.tokens_per_page
    tok = np.arange(pages * tpp)
    v = values(seed, tok, layer, kind, range(*lay.heads), lay.head_dim)  # [T, H, D]
    v = v.reshape(pages, tpp, lay.heads_per_rank, lay.head_dim)
    if lay.page_order == "HND":
        v = v.transpose(0, 2, 1, 3)
    return np.ascontiguousarray(v).reshape(pages, -1)


def context_bytes(seed: int, n: int) -> bytes:
    return (np.arange(n, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(seed)).astype(
        np.uint8).tobytes()


def cache_view(lay: KvLayout, buf: np.ndarray) -> np.ndarray:
    """[layers, 2, pages, page_elems] view of a default-placement cache of uint16."""
    return buf.view(np.uint16).reshape(lay.num_layers, 2, lay.num_pages, -1)


# ---------------------------------------------------------------------- the peer process

class Rank:
    def __init__(self, provider, nics, tp, rank, num_pages, lay_kw, use_watcher, coalesce):
        self.e = ferry.TransferEngine(provider, nics=nics, default_timeout=10)
        self.lay = layout(tp, rank, num_pages, **lay_kw)
        self.buf = np.zeros(sum(self.lay.region_bytes()), dtype=np.uint8)
        self.sender = KvSender(self.e, self.lay, [self.buf], context_bytes=CTX_BYTES,
                               max_jobs=64, use_watcher=use_watcher, coalesce=coalesce)
        self.free = list(range(num_pages))
        self.lock = threading.Lock()
        self.modes: dict = {}  # req_id -> {"hold": step, "abort": step, "die": step}
        self.released: dict = {}  # req_id -> threading.Event
        self.results: dict = {}  # req_id -> "ok" / error class name
        self.stop = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def alloc(self, n: int, rng, contiguous: bool = False) -> list:
        with self.lock:
            if len(self.free) < n:
                return []
            if contiguous:  # the lowest free pages (a run when the cache is empty)
                self.free.sort()
            else:  # random pages, sorted: runs of random lengths
                rng.shuffle(self.free)
            got = self.free[:n]
            self.free = self.free[n:]
        return sorted(got)

    def serve(self) -> None:
        rng = np.random.default_rng(self.lay.tp_rank + 1)
        while not self.stop:
            try:
                p = self.sender.wait_request(timeout=0.2)
            except ferry.Timeout:
                continue
            threading.Thread(target=self.run_one, args=(p, rng), daemon=True).start()

    def run_one(self, p, rng) -> None:
        rid, lay = p.req_id, self.lay
        mode = self.modes.get(rid, {})
        n = lay.pages_for(p.num_tokens)
        if mode.get("reject"):
            self.sender.refuse(rid, "rejected by the test")
            self.results[rid] = "rejected"
            return
        pages = self.alloc(n, rng, bool(mode.get("contiguous")))
        if not pages:
            self.sender.refuse(rid, "out of pages")
            self.results[rid] = "no pages"
            return
        seed = rid
        if mode.get("hold_accept"):
            self.results[f"held:{rid}"] = True  # the application has it, unaccepted
            self.released.setdefault(rid, threading.Event()).wait(20)
        try:
            job = self.sender.accept(rid, pages)
        except ferry.FerryError as e:
            self.results[rid] = type(e).__name__
            with self.lock:
                self.free += pages
            return
        view = cache_view(lay, self.buf)
        cp = p.chunk_pages
        chunks = -(-n // cp)
        step = 0
        try:
            for c in range(chunks):
                lo, hi = c * cp, min(n, (c + 1) * cp)
                for layer in range(lay.num_layers):
                    for kind in (0, 1):
                        img = page_image(lay, seed, hi, layer, kind)[lo:hi]
                        view[layer, kind, pages[lo:hi]] = img
                    step += 1
                    if mode.get("die") == step:
                        job.advance(step)
                        os._exit(3)
                    if mode.get("abort") == step:
                        job.abort("aborted by the test")
                        break
                    job.advance(step)
                    if mode.get("hold") == step:
                        ev = self.released.setdefault(rid, threading.Event())
                        ev.wait(20)
                else:
                    continue
                break
            if p.ctx_len and not job._abort_reason:
                job.write_context(context_bytes(seed, p.ctx_len))
            else:
                job.advance(job.num_steps) if not job._abort_reason else None
            job.wait(20)
            self.results[rid] = "ok"
        except ferry.FerryError as e:
            self.results[rid] = type(e).__name__
        finally:
            if job.done:
                with self.lock:
                    self.free += pages
            self.results.setdefault(rid, "?")
            self.results[f"stats:{rid}"] = job.stats()


def main(provider, nics, tp, num_pages, lay_kw, env, cmd_q, res_q, use_watcher=False,
         coalesce=True, stacks=None) -> None:
    if stacks:  # the test reads it when this process dies or stops answering
        out = open(stacks, "w")  # noqa: SIM115: open for the process's life
        faulthandler.enable(out, all_threads=True)
        faulthandler.register(signal.SIGUSR1, out, all_threads=True)
    os.environ.update(env)
    try:
        ranks = [Rank(provider, nics, tp, r, num_pages, lay_kw, use_watcher, coalesce)
                 for r in range(tp)]
        res_q.put(("hello", [r.e.main_address for r in ranks]))
    except Exception:  # noqa: BLE001
        res_q.put(("error", traceback.format_exc()))
        return
    while True:
        try:
            cmd = cmd_q.get(timeout=60)
        except queue.Empty:
            continue
        try:
            op = cmd[0]
            if op == "stop":
                for r in ranks:
                    r.stop = True
                    r.sender.close()
                    r.e.stop()
                res_q.put(("ok", None))
                return
            if op == "mode":
                for r in ranks:
                    r.modes[cmd[1]] = cmd[2]
                res_q.put(("ok", None))
            elif op == "release":
                for r in ranks:
                    r.released.setdefault(cmd[1], threading.Event()).set()
                res_q.put(("ok", None))
            elif op == "held":  # wait until every rank's application holds req_id
                end = time.monotonic() + cmd[2]
                while time.monotonic() < end and not all(f"held:{cmd[1]}" in r.results
                                                         for r in ranks):
                    time.sleep(0.005)
                res_q.put(("ok", all(f"held:{cmd[1]}" in r.results for r in ranks)))
            elif op == "result":  # wait until every rank has a result for req_id
                end = time.monotonic() + cmd[2]
                while time.monotonic() < end and not all(cmd[1] in r.results for r in ranks):
                    time.sleep(0.005)
                res_q.put(("ok", [(r.results.get(cmd[1]), r.results.get(f"stats:{cmd[1]}"))
                                  for r in ranks]))
            elif op == "stats":
                res_q.put(("ok", [dict(r.sender.stats(), free_pages=len(r.free),
                                       refusals=dict(r.sender.refusals)) for r in ranks]))
            else:
                res_q.put(("error", f"unknown command {op}"))
        except Exception:  # noqa: BLE001
            res_q.put(("error", traceback.format_exc()))
