"""Ranks in spawned processes that report each phase of a test over a pipe.

A rank's main sends ``(phase, value)`` when it reaches a phase, or
``("error", text)`` when it fails; the test reads them in order with a deadline
per phase, so a rank that hangs fails the test instead of hanging it.
"""

from __future__ import annotations

import multiprocessing as mp


class ProcWorld:
    def __init__(self, world: int, rank_main, store: str):
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for r in range(world):
            here, there = ctx.Pipe()
            p = ctx.Process(target=rank_main, args=(r, store, there), daemon=True)
            p.start()
            there.close()
            self.conns.append(here)
            self.procs.append(p)

    def expect(self, rank: int, phase: str, timeout: float):
        c = self.conns[rank]
        if not c.poll(timeout):
            raise AssertionError(f"rank {rank}: nothing within {timeout} s waiting for {phase}")
        what, value = c.recv()
        if what == "error":
            raise AssertionError(f"rank {rank} failed:\n{value}")
        assert what == phase, (rank, what, value)
        return value

    def close(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(10)
