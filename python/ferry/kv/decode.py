"""The decoder's side of the KV protocol: KvReceiver and KvRequest (docs/KV.md).

The decoder owns the pages: it allocates them, names them in a request and may reuse
them only once ``KvRequest.released`` holds: the request completed (every immediate the
prefillers announced arrived), or it was aborted and every prefill rank confirmed how
many immediates it had posted and those all arrived (so no write of it is still in
flight), or its deadline passed and the prefill rank is known dead.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Optional, Sequence

import numpy as np

from .. import _ferry
from .._errors import Cancelled, FerryError, NotFound, ResourceExhausted, Timeout
from .._engine import TransferEngine
from . import wire
from .errors import LayoutMismatch, PeerDead, RequestAborted, RequestRefused, TransferTimeout
from .layout import KvLayout, head_sources
from .prefill import RECV_BUFFERS, _nbytes, new_session, register_regions
from .wire import Msg, Refusal

__all__ = ["KvReceiver", "KvRequest", "PrefillLink", "KV_IMM_BASE"]

log = logging.getLogger("ferry.kv")

KV_IMM_BASE = 0x4B560000  # "KV" << 16: immediates [base, base + imm_slots) are ferry.kv's
_SLICE = 0.02  # bounded wait slice: refusals and aborts are noticed within it
_PING_EVERY = 0.25


class PrefillLink:
    """A decode rank's handshake with one prefill rank."""

    def __init__(self, receiver: "KvReceiver", addr: Any) -> None:
        self.receiver, self.addr = receiver, addr
        self.session = new_session()
        self.layout: Optional[KvLayout] = None
        self.nics = 1
        self.error: Optional[BaseException] = None
        self.ready = threading.Event()
        self.dead = False

    def __repr__(self) -> str:
        r = self.layout.tp_rank if self.layout else "?"
        return f"<PrefillLink rank {r} session {self.session:#x}>"


class _Part:
    """One prefill rank's share of a request."""

    __slots__ = ("link", "accepted", "imms", "refused", "ended", "posted", "failed")

    def __init__(self, link: PrefillLink) -> None:
        self.link = link
        self.accepted = False
        self.imms = 0
        self.refused: Optional[tuple] = None  # (reason name, text)
        self.ended = False  # ABORT_ACK or ABORTED arrived
        self.posted = 0  # immediates the prefill rank says it posted (after an abort)
        self.failed = 0


class KvRequest:
    """A request in flight; the decoder's handle on its pages."""

    def __init__(self, rx: "KvReceiver", req_id: int, imm: int, parts: list,
                 deadline: float) -> None:
        self.rx, self.req_id, self.imm = rx, req_id, imm
        self.parts = parts
        self.deadline = deadline
        self.counter = rx.engine.imm_counter(imm)
        self.state = "pending"  # pending, done, refused, aborting, aborted, failed
        self.error: Optional[BaseException] = None
        self.released = False
        self._aborting = False
        self._next_ping = time.monotonic() + _PING_EVERY
        self._pings: list = []
        self._t0_ns = time.monotonic_ns()  # the request's span in the engine's trace
        # time.monotonic_ns() when wait() saw the last arrival (0: not seen), and when the
        # pages became the caller's (0: not yet): the waiter's wake-up, then its release.
        self.seen_ns = 0
        self.released_ns = 0

    # ------------------------------------------------------------ waiting

    def wait(self, timeout: Optional[float] = None, *, spin: bool = False) -> None:
        """Wait until every page and the context arrived (pages released to the caller
        as complete). Raises RequestRefused, RequestAborted (the prefiller aborted),
        PeerDead or TransferTimeout (the request's deadline), never hangs past it.

        spin: once the prefiller accepted, poll the request's counter without sleeping
        (ImmCounter.wait(spin=True)): a core busy until the last arrival, and no
        wake-up after it (tens to hundreds of microseconds on an idle host).

        A completed request returns as soon as its pages are the caller's; the receiver's
        own bookkeeping (the request's immediate back to its pool, its trace span) runs
        at the receiver's next request() or stats()."""
        end = self.deadline if timeout is None else min(self.deadline, time.monotonic() + timeout)
        while True:
            with self.rx._lock:
                if self.state == "done":
                    return
                if self.error is not None:
                    raise self.error
                refused = next((p for p in self.parts if p.refused), None)
                ended = next((p for p in self.parts if p.ended), None)
                expected = sum(p.imms for p in self.parts) if all(p.accepted for p in self.parts) \
                    else None
            if refused is not None:
                self._fail_and_release(RequestRefused(
                    f"request {self.req_id}: refused by prefill rank "
                    f"{refused.link.layout.tp_rank}: {refused.refused[1]}", refused.refused[0]),
                    "refused")
                continue
            if ended is not None and not self._aborting:
                self._fail_and_release(RequestAborted(
                    f"request {self.req_id}: aborted by prefill rank {ended.link.layout.tp_rank}"),
                    "aborted")
                continue
            now = time.monotonic()
            if expected is not None and self.counter.value >= expected:
                self._finish()
                continue
            if now >= end:
                if now >= self.deadline:
                    self._expire()
                    continue
                raise Timeout(f"request {self.req_id} still in flight after {timeout} s")
            self._probe(now)
            if self.error is not None or self.released:
                continue
            self._wait_slice(expected, min(end - now, _SLICE), spin)

    def _wait_slice(self, expected: Optional[int], t: float, spin: bool = False) -> None:
        if expected is None:
            with self.rx._cond:
                self.rx._cond.wait(t)
            return
        try:
            self.counter.wait(expected, timeout=t, spin=spin)
        except (Timeout, Cancelled):  # Cancelled: released meanwhile (a dead peer)
            return
        self._finish()

    def _finish(self) -> None:
        self.seen_ns = time.monotonic_ns()
        # The pages are the caller's at once; the receiver's bookkeeping (the request's
        # immediate back to the pool, its trace span) runs at the receiver's next call:
        # tens of microseconds of Python that the caller would otherwise wait for.
        with self.rx._lock:
            self.state = "done"
            if self.released:
                return
            self.released = True
            self.released_ns = time.monotonic_ns()
            self.rx._retiring.append(self)

    # ------------------------------------------------------------ abort

    def abort(self, timeout: Optional[float] = None) -> None:
        """Abort the request; returns once its pages may be reused (every prefill rank
        acknowledged and what it posted arrived, or the deadline passed with it dead).
        Raises TransferTimeout when that cannot be established in time: the pages then
        stay quarantined (``released`` false) until an acknowledgement arrives."""
        with self.rx._lock:
            if self.released:
                return
            self._aborting = True
            if self.state in ("pending",):
                self.state = "aborting"
            targets = [p for p in self.parts if not p.ended and not p.refused]
        for p in targets:
            self.rx._send(p.link, Msg.ABORT, self.req_id)
        self.wait_released(timeout)

    def wait_released(self, timeout: Optional[float] = None) -> None:
        """Wait until the pages may be reused (see the module docstring); raises
        TransferTimeout when that is not established in time (pages stay quarantined)."""
        end = time.monotonic() + (timeout if timeout is not None else
                                  max(0.0, self.deadline - time.monotonic()) + 5.0)
        while True:
            with self.rx._lock:
                if self.released:
                    return
                parts = list(self.parts)
                dead = [p for p in parts if p.link.dead and not p.ended and not p.refused]
                live = [p for p in parts if not p.ended and not p.refused and not p.link.dead]
                posted = sum(p.posted for p in parts if p.ended)
                failed = sum(p.failed for p in parts if p.ended)
                done = self.state == "done"
            now = time.monotonic()
            release = False
            if done:
                release = True
            elif not live and not dead:
                # Every rank acknowledged: what it posted arrived, so nothing is in
                # flight. Failed writes may or may not land: wait out the deadline.
                release = self.counter.value >= posted and (failed == 0 or now >= self.deadline)
            elif not live:
                # A dead rank's arrivals are unknown, so the count cannot prove that the
                # others' writes landed: only when every rank is dead, or at the deadline.
                release = all(p.link.dead or p.refused for p in parts) or now >= self.deadline
            if release:
                with self.rx._lock:
                    if self.error is None and self.state != "done":
                        self.error = RequestAborted(f"request {self.req_id} was aborted")
                        self.state = "aborted"
                self._release()
                return
            if now >= end:
                raise TransferTimeout(f"request {self.req_id}: pages still quarantined after "
                                      f"{timeout} s ({len(live)} prefill rank(s) unacknowledged)")
            self._probe(now)
            with self.rx._cond:
                self.rx._cond.wait(min(_SLICE, max(0.0, end - now)))

    # ------------------------------------------------------------ internals

    def _probe(self, now: float) -> None:
        """Liveness: a PING send that fails marks its prefill rank dead."""
        for t, p in self._pings:
            if t.done() and t.exception() is not None and not p.link.dead:
                p.link.dead = True
                log.info("prefill rank %s is gone: %s", p.link, t.exception())
        self._pings = [(t, p) for t, p in self._pings if not t.done()]
        if now < self._next_ping:
            return
        self._next_ping = now + _PING_EVERY
        for p in self.parts:
            if p.link.dead:
                continue
            try:
                t = self.rx.engine.submit_send(p.link.addr, wire.encode(Msg.PING, p.link.session,
                                                                        self.req_id))
                self._pings.append((t, p))
            except FerryError:
                p.link.dead = True
        dead = [p for p in self.parts if p.link.dead and not p.ended and not p.refused]
        if dead and self.error is None and self.state != "done":
            with self.rx._lock:
                self.error = PeerDead(f"request {self.req_id}: prefill rank "
                                      f"{dead[0].link.layout.tp_rank} went away")
                self.state = "failed"
                self._aborting = True
                alive = [p for p in self.parts
                         if not p.link.dead and not p.ended and not p.refused]
            for p in alive:  # the others stop too; their acks gate the release
                self.rx._send(p.link, Msg.ABORT, self.req_id)
            if not alive and all(p.link.dead or p.refused or p.ended for p in self.parts):
                self._release()  # a dead process writes nothing more

    def _fail_and_release(self, err: BaseException, state: str) -> None:
        with self.rx._lock:
            if self.error is None:
                self.error, self.state = err, state
        if state == "refused":
            # Refused parts posted nothing; accepted ones must still be drained.
            if all(p.refused for p in self.parts):
                self._release()
                return
        self.abort(timeout=max(0.0, self.deadline - time.monotonic()) + 1.0)

    def _expire(self) -> None:
        """The deadline passed: a typed error now; the prefill ranks are told to stop and
        the pages follow the ack rule (wait_released)."""
        with self.rx._lock:
            if self.error is None:
                self.error = TransferTimeout(f"request {self.req_id}: deadline passed with "
                                             f"{self.counter.value} immediate(s) arrived")
                self.state = "failed"
            self._aborting = True
            live = [p for p in self.parts if not p.ended and not p.refused and not p.link.dead]
        for p in live:
            self.rx._send(p.link, Msg.ABORT, self.req_id)

    def _release(self) -> None:
        with self.rx._lock:
            if self.released:
                return
            self.released = True
            self.released_ns = time.monotonic_ns()
        self._bookkeep()

    def _bookkeep(self) -> None:
        if getattr(self.rx.engine, "tracing", False):
            self.rx.engine.trace_span(f"request {self.req_id} {self.state}", self._t0_ns,
                                      self.released_ns, "kv decode")
        self.rx._retire(self)


class KvReceiver:
    """A decode rank's endpoint.

    buffers: this rank's KV cache regions (in the layout's order); context: a buffer of
    ``context_slots * context_slot_bytes`` bytes that the prefiller writes the context of
    a request into (slot named in the request). Immediates [imm_base, imm_base +
    imm_slots) are this receiver's: one per live request, reused only after release.
    """

    def __init__(self, engine: TransferEngine, layout: KvLayout, buffers: Sequence[Any], *,
                 context: Any = None, context_slot_bytes: int = 0, instance: str = "decode",
                 imm_base: int = KV_IMM_BASE, imm_slots: int = 4096) -> None:
        self.engine, self.layout, self.instance = engine, layout, instance
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._descs = [d for _, d in register_regions(engine, layout, buffers)]
        self.context_slot_bytes = int(context_slot_bytes)
        self._ctx_desc = None
        self.context_slots = 0
        if context is not None:
            _, self._ctx_desc = engine.register(context)
            n = _nbytes(context)
            self.context_slots = n // max(1, self.context_slot_bytes)
        if imm_base < 0 or imm_base + imm_slots > 2**32:
            raise ValueError("immediates past 32 bits")
        self._imm_free = list(range(imm_base + imm_slots - 1, imm_base - 1, -1))
        self._links: dict = {}  # session -> PrefillLink
        self._live: dict = {}  # req_id -> KvRequest
        self._retiring: list = []  # completed, released, bookkeeping not yet done
        self.completed = 0
        engine.submit_recvs(wire.MAX_MESSAGE, RECV_BUFFERS, self._on_message)

    # ------------------------------------------------------------ handshake

    def connect(self, prefill_addr: Any, timeout: float = 10.0) -> PrefillLink:
        """Say hello to one prefill rank; raise LayoutMismatch (or another refusal) when
        it refuses us."""
        link = PrefillLink(self, prefill_addr)
        with self._lock:
            self._links[link.session] = link
        hello = {
            "addr": self.engine.main_address.hex(),
            "layout": self.layout.to_blob().decode(),
            "regions": [d.hex() for d in self._descs],
            "ctx": self._ctx_desc.hex() if self._ctx_desc is not None else "",
            "ctx_slot_bytes": self.context_slot_bytes,
            "ctx_slots": self.context_slots,
            "nics": self.engine.nics_per_group,
            "instance": self.instance,
        }
        self.engine.submit_send(prefill_addr, wire.encode(Msg.HELLO, link.session, hello)) \
            .result(timeout)
        if not link.ready.wait(timeout):
            raise Timeout(f"no answer to the KV hello within {timeout} s")
        if link.error is not None:
            with self._lock:
                self._links.pop(link.session, None)
            raise link.error
        return link

    # ------------------------------------------------------------ requests

    def request(self, req_id: int, pages: Any, num_tokens: int, links: Sequence[PrefillLink],
                *, ctx_slot: int = 0, ctx_len: int = 0, chunk_tokens: Optional[int] = None,
                deadline: float = 30.0) -> KvRequest:
        """Ask the prefill ranks among `links` that hold this rank's heads for a request.

        pages: this rank's page ids for the tokens (one array, or one per layer group).
        chunk_tokens: the prefill chunk size (a multiple of the page size; default one
        chunk). deadline: seconds from now.
        """
        groups = pages if isinstance(pages, (list, tuple)) and len(pages) and \
            not np.isscalar(pages[0]) else [pages]
        groups = [np.ascontiguousarray(g, dtype=np.uint32) for g in groups]
        tpp = self.layout.tokens_per_page
        chunk_tokens = chunk_tokens or num_tokens
        if chunk_tokens % tpp and chunk_tokens < num_tokens:
            raise ValueError(f"chunk_tokens {chunk_tokens} is not a multiple of the page size {tpp}")
        chunk_pages = max(1, -(-chunk_tokens // tpp))
        sources = head_sources(links[0].layout, self.layout) if links else []
        by_rank = {lk.layout.tp_rank: lk for lk in links}
        missing = [r for r, _, _ in sources if r not in by_rank]
        if missing or not sources:
            raise ValueError(f"no link to prefill rank(s) {missing}")
        with self._lock:
            # What completed requests still hold goes first when this one needs it.
            if self._retiring and (not self._imm_free or req_id in self._live):
                self._drain_retiring()
            if req_id in self._live:
                raise ValueError(f"request {req_id} is live on this rank")
            if not self._imm_free:
                raise ResourceExhausted("every KV immediate is held by a live request")
            imm = self._imm_free.pop()
            try:
                self.engine.remove_imm_count(imm)  # a stale count of an earlier user
            except NotFound:
                pass
            parts = [_Part(by_rank[r]) for r, _, _ in sources]
            req = KvRequest(self, req_id, imm, parts, time.monotonic() + deadline)
            self._live[req_id] = req
        for i, p in enumerate(parts):
            msg = wire.Request(req_id, imm, int(deadline * 1000), num_tokens, chunk_pages,
                               ctx_slot, ctx_len if i == 0 else ctx_len, groups)
            self._send(p.link, Msg.REQUEST, msg)
        # Earlier requests' bookkeeping after this one's messages went out.
        self._drain_retiring()
        return req

    def stats(self) -> dict:
        self._drain_retiring()
        with self._lock:
            return {"live": len(self._live), "imms_free": len(self._imm_free),
                    "links": len(self._links), "completed": self.completed}

    # ------------------------------------------------------------ messages

    def _on_message(self, m: memoryview) -> None:
        try:
            kind, session, body = wire.decode(bytes(m))
        except wire.Malformed as e:
            log.warning("dropped a malformed KV message: %s", e)
            return
        with self._cond:
            link = self._links.get(session)
            if link is None:
                return
            if kind == Msg.HELLO_OK:
                try:
                    peer = KvLayout.from_blob(body["layout"].encode())
                    self.layout.check_compatible(peer)
                    link.layout, link.nics = peer, int(body.get("nics", 1))
                except (FerryError, KeyError, TypeError, ValueError) as e:
                    link.error = e if isinstance(e, FerryError) else LayoutMismatch(str(e))
                link.ready.set()
            elif kind == Msg.HELLO_REFUSED:
                cls = LayoutMismatch if body.get("reason") == "LayoutMismatch" else RequestRefused
                link.error = cls(f"prefill rank refused the hello: {body.get('message')}")
                link.ready.set()
            elif kind in (Msg.ACCEPT, Msg.REFUSE, Msg.ABORT_ACK, Msg.ABORTED):
                req = self._live.get(body[0])
                part = next((p for p in req.parts if p.link is link), None) if req else None
                if part is None:
                    return
                if kind == Msg.ACCEPT:
                    part.accepted, part.imms = True, int(body[1])
                elif kind == Msg.REFUSE:
                    try:
                        name = Refusal(body[1]).name
                    except ValueError:
                        name = str(body[1])
                    if name == "DUPLICATE":
                        # A second REQUEST of a live id (a resend): the first one stands.
                        log.info("request %d: the prefiller refused a duplicate", body[0])
                    else:
                        part.refused = (name, body[2])
                else:
                    part.ended, part.posted, part.failed = True, int(body[1]), int(body[2])
            self._cond.notify_all()

    def _send(self, link: PrefillLink, kind: Msg, body: Any) -> None:
        try:
            self.engine.submit_send(link.addr, wire.encode(kind, link.session, body))
        except FerryError as e:
            link.dead = True
            log.info("KV %s to %s failed: %s", kind.name, link, e)

    def _drain_retiring(self) -> None:
        with self._lock:
            todo, self._retiring = self._retiring, []
        for req in todo:
            req._bookkeep()

    def _retire(self, req: KvRequest) -> None:
        with self._lock:
            if self._live.get(req.req_id) is req:
                del self._live[req.req_id]
            if req.state == "done":
                self.completed += 1
            try:
                self.engine.remove_imm_count(req.imm)
            except NotFound:
                pass
            self._imm_free.append(req.imm)
            self._cond.notify_all()
