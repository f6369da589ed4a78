"""``python -m ferry.bench``: Python-side costs of the bindings (numbers for docs/PYTHON.md).

1. submit cost: wall time of one ``submit_paged_writes`` call with N pages (default
   10 000) given as NumPy int32 arrays; the median over many calls, the transfer
   waited for between calls (so only the Python + submit cost is timed).
2. immediate latency: ping-pong of immediates between two processes; each side
   answers from a Python callback (``expect_imm_count``) or from a thread blocked in
   ``ImmCounter.wait``; one-way latency = round trip / 2.
3. message latency: ping-pong of 64-byte messages (``submit_send``) between two
   processes; each side takes them in a Python receive callback (``submit_recvs``)
   or from a thread blocked in ``RecvQueue.get`` (``recv_queue``).
4. watcher latency (``--watcher``, needs PyTorch and a GPU): a one-element
   ``fill_`` kernel writes a UVM watcher word; measured from just before the launch
   to the Python callback, next to the same launch timed to the return of
   ``torch.cuda.synchronize()`` (launch + kernel + sync, no watcher): the
   difference is what the watcher and the Python callback add.

Needs NumPy. Providers: "tcp" (tcp;ofi_rxm on lo) or "shm".
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time

PROVIDERS = {"tcp": ("tcp;ofi_rxm", ["lo"]), "shm": ("shm", ["shm"])}


def _engine(kind: str):
    import ferry

    provider, nics = PROVIDERS[kind]
    return ferry.TransferEngine(provider, nics=nics, default_timeout=30)


def submit_cost(kind: str, pages: int, page_len: int, reps: int) -> dict:
    """Median/min wall time of submit_paged_writes with `pages` pages (plus the parts)."""
    import numpy as np

    import ferry

    a, b = _engine(kind), _engine(kind)
    try:
        src = np.zeros(pages * page_len, np.uint8)
        dst = np.zeros(pages * page_len, np.uint8)
        h, _ = a.register(src)
        _, d = b.register(dst)
        rng = np.random.default_rng(0)
        sp = rng.permutation(pages).astype(np.int32)
        dp = rng.permutation(pages).astype(np.int32)
        c = b.imm_counter(1)
        cnt = ferry.TransferCounter()
        fut, bulk = [], []
        for i in range(reps):
            t0 = time.perf_counter()
            t = a.submit_paged_writes(page_len, h, sp, page_len, 0, d, dp, page_len, 0, imm=1)
            fut.append(time.perf_counter() - t0)
            t.result(30)
            c.wait(pages, 30)
            t0 = time.perf_counter()
            a.submit_paged_writes(page_len, h, sp, page_len, 0, d, dp, page_len, 0, imm=1, counter=cnt)
            bulk.append(time.perf_counter() - t0)
            cnt.wait(i + 1, 30)
            c.wait(pages, 30)
        # the same call with tiny page lists: the fixed per-call cost
        one = np.zeros(1, np.int32)
        small = []
        for _ in range(reps * 10):
            t0 = time.perf_counter()
            t = a.submit_paged_writes(page_len, h, one, page_len, 0, d, one, page_len, 0)
            small.append(time.perf_counter() - t0)
            t.result(30)
        return {
            "pages": pages,
            "page_len": page_len,
            "median_us": statistics.median(fut) * 1e6,
            "min_us": min(fut) * 1e6,
            "median_counter_us": statistics.median(bulk) * 1e6,
            "one_page_median_us": statistics.median(small) * 1e6,
        }
    finally:
        a.stop()
        b.stop()


def _pong(kind: str, mode: str, q_in, q_out, n: int) -> None:
    import threading

    import numpy as np

    e = _engine(kind)
    _, desc = e.register(np.zeros(64, np.uint8))
    q_out.put(desc)
    peer = q_in.get()
    if mode == "callback":
        done = threading.Event()
        left = [n]

        def on_ping():
            e.submit_imm(2, peer, counter=sink)
            left[0] -= 1
            if left[0] == 0:
                done.set()

        import ferry

        sink = ferry.TransferCounter()
        e.expect_imm_count(1, 1, on_ping)
        q_out.put("ready")
        done.wait(120)
    else:
        import ferry

        sink = ferry.TransferCounter()
        c = e.imm_counter(1)
        q_out.put("ready")
        for _ in range(n):
            c.wait(1, 30)
            e.submit_imm(2, peer, counter=sink)
    q_in.get()
    e.stop()


def _pingpong(pong, kind: str, mode: str, n: int, setup) -> dict:
    """Round trips against a `pong` process; setup(engine, q_in, q_out) trades addresses
    with it and returns one round trip as a function. One-way latency = round trip / 2."""
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=pong, args=(kind, mode, q_in, q_out, n + 100), daemon=True)
    p.start()
    e = _engine(kind)
    try:
        one = setup(e, q_in, q_out)
        assert q_out.get(timeout=60) == "ready"
        rtts = []
        for i in range(n + 100):
            t0 = time.perf_counter()
            one()
            if i >= 100:
                rtts.append(time.perf_counter() - t0)
        rtts.sort()
        return {
            "mode": mode,
            "round_trips": n,
            "one_way_median_us": rtts[len(rtts) // 2] / 2 * 1e6,
            "one_way_p99_us": rtts[int(len(rtts) * 0.99)] / 2 * 1e6,
        }
    finally:
        q_in.put("bye")
        p.join(30)
        e.stop()


def imm_latency(kind: str, mode: str, n: int) -> dict:
    """One-way immediate latency with Python on both ends (`mode`: callback or wait)."""
    import threading

    import numpy as np

    import ferry

    def setup(e, q_in, q_out):
        _, desc = e.register(np.zeros(64, np.uint8))
        peer = q_out.get(timeout=60)
        q_in.put(desc)
        sink = ferry.TransferCounter()
        if mode == "callback":
            ev = threading.Event()
            e.expect_imm_count(2, 1, ev.set)

            def one():
                ev.clear()
                e.submit_imm(1, peer, counter=sink)
                if not ev.wait(30):
                    raise TimeoutError("no pong")

            return one
        c = e.imm_counter(2)

        def one():
            e.submit_imm(1, peer, counter=sink)
            c.wait(1, 30)

        return one

    return _pingpong(_pong, kind, mode, n, setup)


def _msg_pong(kind: str, mode: str, q_in, q_out, n: int) -> None:
    import threading

    import ferry

    e = _engine(kind)
    sink = ferry.TransferCounter()
    if mode == "callback":
        done = threading.Event()
        left = [n]
        peer = [None]

        def on_msg(m: memoryview) -> None:
            e.submit_send(peer[0], m, counter=sink)
            left[0] -= 1
            if left[0] == 0:
                done.set()

        e.submit_recvs(64, 8, on_msg)
    else:
        q = e.recv_queue(64, 8)
    q_out.put(e.main_address)
    addr = q_in.get()
    if mode == "callback":
        peer[0] = addr
        q_out.put("ready")
        done.wait(120)
    else:
        q_out.put("ready")
        for _ in range(n):
            e.submit_send(addr, q.get(30), counter=sink)
    q_in.get()
    e.stop()


def msg_latency(kind: str, mode: str, n: int) -> dict:
    """One-way 64-byte message latency with Python on both ends (`mode`: callback or queue)."""
    import threading

    import ferry

    def setup(e, q_in, q_out):
        sink = ferry.TransferCounter()
        msg = bytes(64)
        if mode == "callback":
            ev = threading.Event()
            e.submit_recvs(64, 8, lambda m: ev.set())
        else:
            q = e.recv_queue(64, 8)
        peer = q_out.get(timeout=60)
        q_in.put(e.main_address)
        if mode == "callback":

            def one():
                ev.clear()
                e.submit_send(peer, msg, counter=sink)
                if not ev.wait(30):
                    raise TimeoutError("no reply")

            return one

        def one():
            e.submit_send(peer, msg, counter=sink)
            q.get(30)

        return one

    return _pingpong(_msg_pong, kind, mode, n, setup)


class _WordView:
    """A one-element int64 CUDA array at a raw device address (for torch.as_tensor)."""

    def __init__(self, addr: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (1,), "typestr": "<i8", "data": (addr, False), "version": 3, "strides": None,
        }


def watcher_latency(n: int) -> dict:
    """Kernel store to a watcher word -> Python callback, against launch + synchronize."""
    import threading

    import torch

    import ferry

    e = ferry.TransferEngine("tcp;ofi_rxm", nics=["lo"], poll_mode="busy")
    try:
        torch.cuda.init()
        seen = threading.Event()
        stamp = [0.0, 0]

        def on_change(old: int, new: int) -> bool:
            stamp[0] = time.perf_counter()
            stamp[1] = new
            seen.set()
            return True

        addr = e.alloc_uvm_watcher(on_change)
        word = torch.as_tensor(_WordView(addr), device="cuda:0")
        scratch = torch.zeros(1, dtype=torch.int64, device="cuda:0")
        via_watcher, via_sync = [], []
        for i in range(1, n + 101):
            seen.clear()
            t0 = time.perf_counter()
            word.fill_(i)
            if not seen.wait(10):
                raise TimeoutError("watcher callback did not run")
            if stamp[1] != i:
                raise AssertionError(f"watcher saw {stamp[1]}, expected {i}")
            t1 = time.perf_counter()
            scratch.fill_(i)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if i > 100:
                via_watcher.append(stamp[0] - t0)
                via_sync.append(t2 - t1)
        via_watcher.sort()
        via_sync.sort()
        q = lambda v, f: v[min(len(v) - 1, int(len(v) * f))] * 1e6  # noqa: E731
        return {
            "samples": n,
            "watcher_p50_us": q(via_watcher, 0.5), "watcher_p99_us": q(via_watcher, 0.99),
            "sync_p50_us": q(via_sync, 0.5), "sync_p99_us": q(via_sync, 0.99),
        }
    finally:
        e.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ferry.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--provider", choices=sorted(PROVIDERS), action="append")
    ap.add_argument("--pages", type=int, default=10_000)
    ap.add_argument("--page-len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--round-trips", type=int, default=2000)
    ap.add_argument("--watcher", action="store_true",
                    help="only the watcher latency (needs PyTorch and a GPU)")
    args = ap.parse_args(argv)
    if args.watcher:
        r = watcher_latency(args.round_trips)
        print(f"[cuda] watcher: kernel launch -> Python callback p50 {r['watcher_p50_us']:.1f} us, "
              f"p99 {r['watcher_p99_us']:.1f} us; launch -> synchronize() returns p50 "
              f"{r['sync_p50_us']:.1f} us, p99 {r['sync_p99_us']:.1f} us ({r['samples']} samples)")
        return 0
    for kind in args.provider or ["tcp", "shm"]:
        r = submit_cost(kind, args.pages, args.page_len, args.reps)
        print(f"[{kind}] submit_paged_writes, {r['pages']} pages of {r['page_len']} B: "
              f"median {r['median_us']:.1f} us (min {r['min_us']:.1f}) with a Transfer, "
              f"{r['median_counter_us']:.1f} us with counter=; 1 page: {r['one_page_median_us']:.1f} us")
        for mode in ("callback", "wait"):
            r = imm_latency(kind, mode, args.round_trips)
            print(f"[{kind}] immediate one-way latency, Python {mode} on both ends: "
                  f"median {r['one_way_median_us']:.1f} us, p99 {r['one_way_p99_us']:.1f} us")
        for mode in ("callback", "queue"):
            r = msg_latency(kind, mode, args.round_trips)
            print(f"[{kind}] 64-byte message one-way latency, Python {mode} on both ends: "
                  f"median {r['one_way_median_us']:.1f} us, p99 {r['one_way_p99_us']:.1f} us")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
