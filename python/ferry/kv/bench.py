"""CPU cost and throughput of ferry.kv requests (docs/KV.md, "Measured").

    python -m ferry.kv.bench [--provider shm] [--layers 94] [--pages 128] [--page-kib 32]

Geometry by default: Qwen3-235B at TP 4, per rank (94 layers, 1 KV head of dim 128, 32 KiB
pages of 128 tokens, 128 pages per 16 384-token chunk: 24 064 pages per request). Two
engines in this process, a KvSender and a KvReceiver. Reported, each in the same run:

* posting: the wall time of posting every step of a request (StepSubmits.advance, i.e.
  the engine's submit of the prepared transfers) per page, contiguous pages (coalesced:
  one write per layer and K/V) and fragmented ones (one paged write per layer and K/V);
  plus the one-off accept (plan + prepare) per page;
* throughput: a whole request (hello done; request, accept, every layer, the context,
  the decoder released) against the same pages as one prepared paged write of the
  engine (no protocol): the paged ceiling of this provider and page size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

import ferry
from ferry.kv import KvLayout, KvReceiver, KvSender


def _engines(provider, nics):
    a = ferry.TransferEngine(provider, nics=nics, default_timeout=120)
    b = ferry.TransferEngine(provider, nics=nics, default_timeout=120)
    return a, b


def run(provider: str, nics, layers: int, pages: int, page_kib: int, reps: int) -> dict:
    head_dim, tpp = 128, page_kib * 1024 // (128 * 2)
    lay = KvLayout(model="qwen3-235b-tp4", num_layers=layers, num_kv_heads=4, head_dim=head_dim,
                   dtype="bfloat16", tokens_per_page=tpp, num_pages=pages, tp_rank=0, tp_size=4)
    assert lay.page_bytes == page_kib * 1024
    a, b = _engines(provider, nics)
    src = np.zeros(sum(lay.region_bytes()), dtype=np.uint8)
    dst = np.zeros(sum(lay.region_bytes()), dtype=np.uint8)
    src[::4096] = 7
    ctx = np.zeros(4096, dtype=np.uint8)
    tx = KvSender(a, lay, [src], context_bytes=4096, max_jobs=4)
    rx = KvReceiver(b, lay, [dst], context=ctx, context_slot_bytes=4096)
    link = rx.connect(a.main_address)
    total_pages = layers * 2 * pages
    out = {"provider": provider, "layers": layers, "pages_per_layer": pages,
           "page_bytes": lay.page_bytes, "pages_per_request": total_pages}
    rid = [1]

    def request(src_pages, dst_pages):
        r = rid[0]
        rid[0] += 1
        req = rx.request(r, dst_pages, pages * tpp, [link], ctx_slot=0, ctx_len=4096,
                         deadline=120)
        p = tx.wait_request(r, timeout=30)
        t0 = time.perf_counter()
        job = tx.accept(r, src_pages)
        t1 = time.perf_counter()
        job.advance(job.num_steps - 1)  # every layer
        t2 = time.perf_counter()
        job.write_context(bytes(4096))
        req.wait(120)
        t3 = time.perf_counter()
        job.wait(60)
        return {"accept_s": t1 - t0, "post_s": t2 - t1, "total_s": t3 - t0,
                "writes": job.stats()["writes"]}

    contiguous = np.arange(pages, dtype=np.uint32)
    fragmented = np.arange(0, pages, dtype=np.uint32)[::-1].copy()  # reversed: no run
    for name, sp, dp in (("contiguous", contiguous, contiguous),
                         ("fragmented", contiguous, fragmented)):
        rs = [request(sp, dp) for _ in range(reps)]
        med = {k: statistics.median(r[k] for r in rs) for k in ("accept_s", "post_s", "total_s")}
        out[name] = {
            "writes": rs[-1]["writes"],
            "post_ns_per_page": med["post_s"] / total_pages * 1e9,
            "accept_ns_per_page": med["accept_s"] / total_pages * 1e9,
            "request_ms": med["total_s"] * 1e3,
            "request_gbps": total_pages * lay.page_bytes / med["total_s"] / 1e9,
        }

    # Baseline: the same pages as one prepared paged write per layer and K/V of the
    # engine, no protocol (submit all, wait for every immediate).
    src_h = tx._regions[0]
    dst_d = rx._descs[0]
    per_kind = pages * lay.page_stride
    prepared = []
    for l in range(layers):
        for k in (0, 1):
            off = (2 * l + k) * per_kind
            prepared.append(a.prepare_paged_writes(lay.page_bytes, src_h, contiguous, lay.page_stride,
                                                   off, dst_d, fragmented, lay.page_stride, off))
    imm = 0x7E57
    c = b.imm_counter(imm)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for p in prepared:
            a.submit(p, imm, counter=ferry.TransferCounter())
        c.wait(total_pages, timeout=120)
        times.append(time.perf_counter() - t0)
    base = statistics.median(times)
    out["baseline_paged"] = {"ms": base * 1e3,
                             "gbps": total_pages * lay.page_bytes / base / 1e9}
    for name in ("contiguous", "fragmented"):
        out[name]["vs_paged_ceiling"] = out["baseline_paged"]["ms"] / out[name]["request_ms"]
    tx.close()
    a.stop()
    b.stop()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--provider", default="shm")
    ap.add_argument("--nics", default="")
    ap.add_argument("--layers", type=int, default=94)
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--page-kib", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    nics = args.nics.split(",") if args.nics else (["shm"] if args.provider == "shm" else ["lo"])
    r = run(args.provider, nics, args.layers, args.pages, args.page_kib, args.reps)
    print(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
