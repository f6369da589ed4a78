"""A pipe-based Exchange for tests without torch: the test process runs a hub thread
per rank that routes all-gathers, point-to-point messages and barriers between the
spawned ranks; a rank whose pipe closes (its process died) is reported to all others,
whose waits then raise ferry.Unavailable."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import numpy as np

import ferry


class Hub:
    def __init__(self, ctx, world: int):
        self.world = world
        pipes = [ctx.Pipe() for _ in range(world)]
        self.conns = [p[0] for p in pipes]
        self.child_conns = [p[1] for p in pipes]
        self._locks = [threading.Lock() for _ in range(world)]
        self._mu = threading.Lock()
        self._gather: dict = defaultdict(dict)
        self._barrier: dict = defaultdict(set)
        self.dead: set[int] = set()
        self._threads = []

    def start(self, close_children: bool = True) -> None:
        # children (processes) hold their ends; EOF must mean a child died. Ranks run
        # as threads of this process share the ends: close_children=False.
        if close_children:
            for c in self.child_conns:
                c.close()
        for r in range(self.world):
            t = threading.Thread(target=self._serve, args=(r,), daemon=True)
            t.start()
            self._threads.append(t)

    def _put(self, r: int, msg) -> None:
        if r in self.dead:
            return
        try:
            with self._locks[r]:
                self.conns[r].send(msg)
        except (OSError, EOFError, BrokenPipeError):
            pass

    def _serve(self, r: int) -> None:
        while True:
            try:
                msg = self.conns[r].recv()
            except (EOFError, OSError):
                with self._mu:
                    self.dead.add(r)
                for k in range(self.world):
                    self._put(k, ("dead", r))
                return
            kind = msg[0]
            if kind == "gather":
                _, key, obj = msg
                with self._mu:
                    self._gather[key][r] = obj
                    full = len(self._gather[key]) == self.world
                    got = self._gather.pop(key) if full else None
                if full:
                    out = [got[k] for k in range(self.world)]
                    for k in range(self.world):
                        self._put(k, ("gathered", key, out))
            elif kind == "send":
                _, dst, tag, obj = msg
                self._put(dst, ("msg", r, tag, obj))
            elif kind == "barrier":
                _, key, ranks = msg
                with self._mu:
                    self._barrier[key].add(r)
                    full = self._barrier[key] >= set(ranks)
                    if full:
                        del self._barrier[key]
                if full:
                    for k in ranks:
                        self._put(k, ("barrier", key))
            elif kind == "bye":
                return


class PipeExchange:
    """The rank side of Hub: an ferry.rl Exchange."""

    def __init__(self, rank: int, world: int, conn):
        self.rank, self.world, self.conn = rank, world, conn
        self._cv = threading.Condition()
        self._box: dict = {}
        self._dead: set[int] = set()
        self._n_gather = 0
        self._n_barrier: dict = defaultdict(int)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                return
            with self._cv:
                if msg[0] == "dead":
                    self._dead.add(msg[1])
                elif msg[0] == "gathered":
                    self._box[("g", msg[1])] = msg[2]
                elif msg[0] == "msg":
                    self._box[("m", msg[1], msg[2])] = msg[3]
                elif msg[0] == "barrier":
                    self._box[("b", msg[1])] = True
                self._cv.notify_all()

    def _wait(self, key, ranks, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        with self._cv:
            while key not in self._box:
                gone = self._dead & set(ranks)
                if gone:
                    raise ferry.Unavailable(f"{what}: rank {min(gone)} left")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ferry.Timeout(f"{what}: no answer within {timeout:.1f} s")
                self._cv.wait(left)
            return self._box.pop(key)

    def all_gather(self, obj, timeout):
        key = self._n_gather
        self._n_gather += 1
        self.conn.send(("gather", key, obj))
        return self._wait(("g", key), range(self.world), timeout, "all_gather")

    def send(self, dst, tag, array):
        self.conn.send(("send", dst, tag, np.ascontiguousarray(array)))

    def recv(self, src, tag, out, timeout):
        out[...] = self._wait(("m", src, tag), [src], timeout, f"recv from rank {src}")

    def barrier(self, ranks, timeout):
        k = tuple(sorted(ranks))
        n = self._n_barrier[k]
        self._n_barrier[k] += 1
        self.conn.send(("barrier", (k, n), k))
        self._wait(("b", (k, n)), k, timeout, "barrier")

    def flush(self, timeout):
        pass
