"""The prefiller's side of the KV protocol: KvSender (docs/KV.md).

Decoder ranks say hello once (layout, descriptors); then for each request every decode
rank that draws heads from this rank sends a REQUEST naming its pages. The prefill
application takes it with ``wait_request``, accepts it with its own page ids (``accept``
prepares every write of the request and answers ACCEPT with the immediate count) and
then marks progress: ``job.advance(step)`` from the host, or a GPU kernel bumping
``job.word`` (the engine's watcher posts the steps, no Python on the per-layer path).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from .. import _ferry
from .._errors import FerryError, Unavailable
from .._engine import TransferEngine
from . import wire
from .errors import LayoutMismatch, PeerDead, RequestAborted, RequestRefused, TransferTimeout
from .layout import KvLayout, check_regions, head_sources
from .plan import LinkPlan, plan_link
from .steps import StepClock, StepPoster
from .wire import Msg, Refusal

__all__ = ["KvSender", "SendJob", "PendingRequest"]

log = logging.getLogger("ferry.kv")

RECV_BUFFERS = 64


@dataclass
class _DecodeLink:
    session: int
    addr: Any
    layout: KvLayout
    regions: list
    ctx: Any
    ctx_slot_bytes: int
    ctx_slots: int
    nics: int
    instance: str
    heads: tuple  # (head_lo, head_hi) this rank supplies to it, or None


@dataclass
class PendingRequest:
    """A request id with the REQUESTs of the decode ranks that draw from this rank."""

    req_id: int
    num_tokens: int = 0
    chunk_pages: int = 0
    ctx_len: int = 0
    arrived: float = 0.0
    deadline: float = 0.0
    parts: dict = field(default_factory=dict)  # session -> wire.Request
    expected: int = 0  # decode ranks that draw from this rank
    claimed: bool = False  # returned by wait_request (once)
    accepting: bool = False  # inside accept(): aborts wait for the job
    aborts: set = field(default_factory=set)  # sessions that aborted while accepting

    @property
    def complete(self) -> bool:
        return len(self.parts) >= self.expected


class SendJob:
    """One accepted request: the prepared writes to every decode rank, posted by step.

    Steps: ``c * num_layers + l + 1`` for layer l of chunk c, then ``num_steps`` (the last)
    for the context. ``advance(step)`` posts every step up to `step` (idempotent; steps
    already posted are skipped); a GPU kernel may bump ``word`` instead (CUDA builds).
    """

    def __init__(self, sender: "KvSender", req_id: int, links: list, plans: list,
                 ctx_staging: Optional[tuple], deadline: float, base: Optional[int]) -> None:
        self.sender, self.req_id = sender, req_id
        self.links, self.plans = links, plans
        self._t0_ns = time.monotonic_ns()  # the job's span in the engine's trace
        self.num_steps = len(plans[0].steps) if plans else 0
        self.deadline = deadline
        self._ctx = ctx_staging  # (view, offset) of this job's staging slot
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._abort_reason: Optional[str] = None
        self._ack_to: set = set()  # sessions whose ABORT we owe an ABORT_ACK
        self._aborted_sent = False
        self.error: Optional[BaseException] = None
        self._ready = False  # set once the sender registered the job
        self.base = base  # None: host-driven (advance); else the clock value before step 1
        self._ctx_slot: Optional[int] = None
        self.posters: list = []
        for link, plan, imm in zip(links, plans, self._imms()):
            steps = sender._resolve_steps(link, plan)
            self.posters.append(StepPoster(sender.clock, base, steps, imm,
                                           self._on_poster_finished))

    def _imms(self) -> list:
        return [self.sender._pending_imm[(lk.session, self.req_id)] for lk in self.links]

    # ------------------------------------------------------------ progress

    def advance(self, step: int) -> None:
        """Post every step up to `step` (host-driven jobs; a watcher-bound job advances
        with the sender's clock, i.e. the kernel's bumps)."""
        if self.base is not None:
            self.sender.clock.advance(self.base + step)
            return
        for p in self.posters:
            p.advance(step)

    def layer_done(self, chunk: int, layer: int) -> None:
        self.advance(chunk * self.sender.layout.num_layers + layer + 1)

    def write_context(self, data: Any) -> None:
        """Copy the context bytes (first token, hidden state, logits...) into this job's
        staging slot and post the final step (after every layer of every chunk)."""
        b = memoryview(data).cast("B")
        want = next((w.length for pl in self.plans for w in pl.steps[-1]), 0)
        if not want:  # another prefill rank writes these decode ranks' context
            self.advance(self.num_steps)
            return
        if self._ctx is None or len(b) != want:
            raise ValueError(f"context of {len(b)} bytes; the request asked for {want}")
        buf, off = self._ctx
        if isinstance(buf, np.ndarray):
            buf[off:off + len(b)] = np.frombuffer(b, dtype=np.uint8)
        else:  # a tensor: torch copies from a host array
            import torch

            buf[off:off + len(b)].copy_(torch.frombuffer(bytearray(b), dtype=torch.uint8))
        self.advance(self.num_steps)

    @property
    def context_offset(self) -> int:
        """Where this job's context goes in the staging buffer (the caller writes it there
        itself when it does not use write_context, e.g. from a CUDA graph)."""
        return self._ctx[1] if self._ctx else 0

    # ------------------------------------------------------------ ending

    def abort(self, reason: str = "aborted by the prefiller") -> None:
        """Stop posting; once every posted write ended, tell each decode rank how many
        immediates it was sent (ABORTED). Returns at once."""
        self._begin_abort(reason, None)

    def _begin_abort(self, reason: str, ack_session: Optional[int]) -> None:
        with self._lock:
            if ack_session is not None:
                self._ack_to.add(ack_session)
            if self._abort_reason is None:
                self._abort_reason = reason
        for p in self.posters:
            p.cancel()  # no step posted after this; finished fires once the posted ones end

    def _on_poster_finished(self) -> None:
        if self._ready and all(p.finished for p in self.posters):
            self.sender._job_finished(self)

    def wait(self, timeout: Optional[float] = None) -> None:
        """Wait until every step was posted and every write ended; raise the first error
        (PeerDead when a decode rank went away, RequestAborted after an abort)."""
        if not self._finished.wait(timeout):
            raise TransferTimeout(f"request {self.req_id}: writes still in flight after {timeout} s")
        if self.error is not None:
            raise self.error

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def stats(self) -> dict:
        return {"writes": sum(p.writes_posted for p in self.posters),
                "imms": sum(p.imms_posted for p in self.posters),
                "failed": sum(p.failed for p in self.posters)}


class KvSender:
    """The prefill rank's endpoint: serves hellos and requests of decode ranks.

    buffers: the registered-able objects of this rank's KV cache regions (the layout's
    regions, in order). context_bytes: largest context a request may ask for (staging
    slots of that size, ``max_jobs`` of them).
    """

    def __init__(self, engine: TransferEngine, layout: KvLayout, buffers: Sequence[Any], *,
                 context_bytes: int = 0, max_jobs: int = 256, use_watcher: bool = False,
                 coalesce: bool = True, context_buffer: Any = None) -> None:
        self.engine, self.layout = engine, layout
        self.use_watcher, self.coalesce = use_watcher, coalesce
        # The step counter: a UVM watcher word the prefill graph bumps once per layer
        # (use_watcher), else host-driven jobs (SendJob.advance).
        self.clock = StepClock(engine, watcher=use_watcher)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._regions = [h for h, _ in register_regions(engine, layout, buffers)]
        self.context_bytes = int(context_bytes)
        self.max_jobs = max_jobs
        # Context staging: slot i at i * context_bytes. A caller's buffer (a CUDA tensor
        # that the prefill graph writes the context into) or host memory of our own.
        if context_buffer is not None:
            self._ctx_buf = context_buffer
            max_jobs = max(1, _nbytes(context_buffer) // max(1, self.context_bytes))
            self.max_jobs = max_jobs
        else:
            self._ctx_buf = np.zeros(max(1, self.context_bytes) * max_jobs, dtype=np.uint8)
        self._ctx_h, _ = engine.register(self._ctx_buf)
        self._ctx_free = list(range(max_jobs - 1, -1, -1))
        self._links: dict = {}  # session -> _DecodeLink
        self._pending: dict = {}  # req_id -> PendingRequest
        self._pending_imm: dict = {}  # (session, req_id) -> imm
        self._jobs: dict = {}  # req_id -> SendJob
        self._tomb: dict = {}  # (session, req_id) -> expiry (monotonic)
        self._closed = False
        self.refusals: dict = {}  # Refusal name -> count (observability, tests)
        engine.submit_recvs(wire.MAX_MESSAGE, RECV_BUFFERS, self._on_message)

    # ------------------------------------------------------------ application side

    def wait_request(self, req_id: Optional[int] = None, timeout: Optional[float] = None
                     ) -> PendingRequest:
        """Wait for a request (`req_id`, or any) whose REQUESTs from every decode rank that
        draws from this rank have arrived."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._expire_locked()
                for rid, p in self._pending.items():
                    if (req_id is None or rid == req_id) and p.complete and not p.claimed:
                        p.claimed = True
                        return p
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise TransferTimeout(f"no complete request {req_id if req_id is not None else ''}"
                                          f" within {timeout} s")
                self._cond.wait(left if left is not None else 1.0)

    def accept(self, req_id: int, src_pages: Any, base: Optional[int] = None) -> SendJob:
        """Accept a request with this rank's page ids holding its tokens (one list for
        every layer). Prepares every write, answers ACCEPT to each decode rank.

        With ``use_watcher``, the job's step s is posted when the clock word reaches
        ``base + s`` (default: its current value, i.e. the next forward pass)."""
        src_pages = np.ascontiguousarray(src_pages, dtype=np.uint32)
        with self._lock:
            p = self._pending.get(req_id)
            if p is None or not p.complete or p.accepting:
                raise RequestRefused(f"request {req_id} is not waiting for an accept (aborted, "
                                     "expired or accepted already)", "STALE")
            if not self._ctx_free and p.ctx_len:
                raise RequestRefused("no context staging slot free", "BUSY")
            p.claimed = p.accepting = True
            slot = self._ctx_free.pop() if p.ctx_len else None
            parts = dict(p.parts)
        try:
            return self._accept(p, parts, slot, src_pages, base)
        except BaseException:
            with self._lock:  # nothing was posted: give back, refuse, acknowledge aborts
                if slot is not None:
                    self._ctx_free.append(slot)
                self._pending.pop(req_id, None)
                for sess in p.parts:
                    self._pending_imm.pop((sess, req_id), None)
                    self._tomb[(sess, req_id)] = (time.monotonic() + 120.0, 0, 0)
                aborts = set(p.aborts)
            for sess in aborts:
                if sess in self._links:
                    self._send(self._links[sess], Msg.ABORT_ACK, (req_id, 0, 0, 0))
            for sess in set(p.parts) - aborts:
                self._refuse(sess, req_id, Refusal.BAD_REQUEST, "the prefiller could not accept")
            raise

    def _accept(self, p: PendingRequest, parts: dict, slot: Optional[int], src_pages,
                base: Optional[int]) -> SendJob:
        req_id = p.req_id
        n = self.layout.pages_for(p.num_tokens)
        if len(src_pages) < n or (n and int(src_pages[:n].max()) >= self.layout.num_pages):
            raise RequestRefused(f"request {req_id}: {len(src_pages)} source pages for {n} "
                                 f"needed, or one past {self.layout.num_pages}", "BAD_REQUEST")
        links, plans = [], []
        for session, r in parts.items():
            lk = self._links[session]
            cx_off = (slot or 0) * max(1, self.context_bytes)
            plan = plan_link(self.layout, lk.layout, lk.heads[0], lk.heads[1], src_pages, r.pages,
                             r.num_tokens, r.chunk_pages,
                             r.ctx_len if lk.heads[2] else 0, ("ctx", cx_off),
                             ("ctx", r.ctx_slot * lk.ctx_slot_bytes), self.engine.nics_per_group,
                             coalesce=self.coalesce)
            links.append(lk)
            plans.append(plan)
        staging = (self._ctx_buf, (slot or 0) * max(1, self.context_bytes)) \
            if slot is not None else None
        if self.use_watcher and base is None:
            base = self.clock.value
        job = SendJob(self, req_id, links, plans, staging, p.deadline,
                      base if self.use_watcher else None)
        job._ctx_slot = slot
        with self._lock:
            self._jobs[req_id] = job
            self._pending.pop(req_id, None)
            aborts = set(p.aborts)
        for lk, plan in zip(links, plans):
            if lk.session not in aborts:
                self._send(lk, Msg.ACCEPT, (req_id, plan.imms))
        job._ready = True
        for sess in aborts:  # aborted while being accepted: nothing posted yet
            job._begin_abort("aborted by the decoder", sess)
        job._on_poster_finished()  # a job whose steps the clock already passed
        return job

    def refuse(self, req_id: int, text: str = "refused by the prefill application") -> None:
        with self._lock:
            p = self._pending.pop(req_id, None)
        if p is not None:
            for s in p.parts:
                self._refuse(s, req_id, Refusal.REJECTED, text)

    @property
    def links(self) -> list:
        with self._lock:
            return list(self._links.values())

    def stats(self) -> dict:
        with self._lock:
            return {"links": len(self._links), "pending": len(self._pending),
                    "jobs": len(self._jobs), "tombstones": len(self._tomb),
                    "ctx_slots_free": len(self._ctx_free)}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            jobs = list(self._jobs.values())
        for j in jobs:
            j.abort("the prefiller is closing")
        self.clock.close()

    # ------------------------------------------------------------ messages

    def _on_message(self, m: memoryview) -> None:
        try:
            kind, session, body = wire.decode(bytes(m))
        except wire.Malformed as e:
            log.warning("dropped a malformed KV message: %s", e)
            return
        if kind == Msg.HELLO:
            self._on_hello(session, body)
        elif kind == Msg.REQUEST:
            self._on_request(session, body)
        elif kind == Msg.ABORT:
            self._on_abort(session, body)
        elif kind == Msg.PING:
            pass
        else:
            log.warning("unexpected %s on a prefiller", kind.name)

    def _on_hello(self, session: int, h: dict) -> None:
        try:
            addr = _ferry.NetAddr.from_hex(h["addr"])
        except Exception as e:  # noqa: BLE001: a peer's bytes
            log.warning("hello with a bad address: %s", e)
            return
        reply = {"layout": self.layout.to_blob().decode(), "nics": self.engine.nics_per_group}
        try:
            peer = KvLayout.from_blob(h["layout"].encode())
            self.layout.check_compatible(peer)
            srcs = [s for s in head_sources(self.layout, peer) if s[0] == self.layout.tp_rank]
            first_src = head_sources(self.layout, peer)[0][0]
            heads = (srcs[0][1], srcs[-1][2], first_src == self.layout.tp_rank) if srcs else None
            if len(srcs) > 1:
                raise LayoutMismatch("non-contiguous head ranges per rank pair are not supported")
            regions = [_ferry.MrDesc.from_hex(x) for x in h["regions"]]
            ctx = _ferry.MrDesc.from_hex(h["ctx"]) if h.get("ctx") else None
            if len(regions) != peer.num_regions:
                raise LayoutMismatch(f"{len(regions)} region descriptors for {peer.num_regions}")
            link = _DecodeLink(session, addr, peer, regions, ctx, int(h["ctx_slot_bytes"]),
                               int(h["ctx_slots"]), int(h["nics"]), str(h.get("instance", "")),
                               heads)
        except (FerryError, KeyError, TypeError, ValueError) as e:
            reply = {"reason": type(e).__name__, "message": str(e)}
            self._send_addr(addr, Msg.HELLO_REFUSED, session, reply)
            return
        with self._lock:
            self._links[session] = link
        self._send_addr(addr, Msg.HELLO_OK, session, reply)

    def _expected_ranks(self, link: _DecodeLink) -> int:
        """Decode ranks of link's instance that draw heads from this rank."""
        n = 0
        for r in range(link.layout.tp_size):
            if any(s[0] == self.layout.tp_rank
                   for s in head_sources(self.layout, link.layout.replace(tp_rank=r))):
                n += 1
        return n

    def _on_request(self, session: int, r: wire.Request) -> None:
        now = time.monotonic()
        with self._lock:
            self._expire_locked(now)
            lk = self._links.get(session)
            key = (session, r.req_id)
            why = None
            if self._closed:
                why = (Refusal.SHUTDOWN, "the prefiller is closing")
            elif lk is None:
                why = (Refusal.STALE, f"unknown session {session:#x} (say hello first)")
            elif key in self._tomb:
                why = (Refusal.STALE, f"request {r.req_id} was aborted or finished")
            elif key in self._pending_imm:
                why = (Refusal.DUPLICATE, f"request {r.req_id} is already live on this link")
            elif lk.heads is None:
                why = (Refusal.BAD_REQUEST, "this rank supplies no heads to that decode rank")
            else:
                why = self._check_request(lk, r)
            if why is None:
                p = self._pending.get(r.req_id)
                if p is None and len(self._pending) + len(self._jobs) >= 4 * self.max_jobs:
                    why = (Refusal.BUSY, f"{len(self._pending)} requests pending")
            if why is None:
                if p is None:
                    p = self._pending[r.req_id] = PendingRequest(
                        r.req_id, r.num_tokens, r.chunk_pages, r.ctx_len, now,
                        now + r.deadline_ms / 1e3, expected=self._expected_ranks(lk))
                elif (p.num_tokens, p.chunk_pages) != (r.num_tokens, r.chunk_pages) or \
                        r.req_id in self._jobs:
                    why = (Refusal.BAD_REQUEST, "decode ranks disagree on the request, or it "
                           "was accepted already")
            if why is None:
                p.parts[session] = r
                self._pending_imm[key] = r.imm
                self._cond.notify_all()
        if why is not None:
            self._refuse(session, r.req_id, *why)

    def _check_request(self, lk: _DecodeLink, r: wire.Request) -> Optional[tuple]:
        d = lk.layout
        n = d.pages_for(r.num_tokens)
        if r.num_tokens == 0 or r.chunk_pages == 0:
            return Refusal.BAD_REQUEST, "no tokens, or chunks of zero pages"
        if n > self.layout.num_pages:
            return Refusal.BUSY, f"{n} pages needed, this rank has {self.layout.num_pages}"
        if len(r.pages) != len(d.layer_groups):
            return Refusal.BAD_REQUEST, f"{len(r.pages)} page lists for {len(d.layer_groups)} groups"
        for g, pl in enumerate(r.pages):
            if len(pl) < n or (n and int(pl[:n].max()) >= d.num_pages):
                return Refusal.BAD_REQUEST, f"group {g}: {len(pl)} pages for {n}, or one past " \
                    f"{d.num_pages}"
        if r.ctx_len:
            if r.ctx_len > self.context_bytes or r.ctx_len > lk.ctx_slot_bytes or \
                    r.ctx_slot >= lk.ctx_slots or lk.ctx is None:
                return Refusal.BAD_REQUEST, f"context of {r.ctx_len} bytes in slot {r.ctx_slot} " \
                    f"does not fit (staging {self.context_bytes} B)"
        return None

    def _on_abort(self, session: int, req_id: int) -> None:
        key = (session, req_id)
        with self._lock:
            lk = self._links.get(session)
            job = self._jobs.get(req_id)
            if job is not None and any(lk.session == session for lk in job.links):
                pass
            else:
                job = None
                p = self._pending.get(req_id)
                if p is not None and p.accepting and session in p.parts:
                    p.aborts.add(session)  # accept() hands it to the job
                    return
                if p is not None:
                    p.parts.pop(session, None)
                    if not p.parts:
                        del self._pending[req_id]
                self._pending_imm.pop(key, None)
                # Whatever arrives later under this id is refused as stale. A job that
                # finished already answers with what it posted: its last writes may still
                # be on their way (a local completion is not remote visibility).
                _, posted, failed = self._tomb.get(key, (0, 0, 0))
                self._tomb[key] = (time.monotonic() + 120.0, posted, failed)
        if job is not None:
            job._begin_abort("aborted by the decoder", session)
        elif lk is not None:
            self._send(lk, Msg.ABORT_ACK, (req_id, posted, failed, 0))

    # ------------------------------------------------------------ internals

    def _resolve_steps(self, link: _DecodeLink, plan: LinkPlan) -> list:
        """Prepared transfers of each step: [(PreparedTransfer, imms)]."""
        e = self.engine
        out = []
        for step in plan.steps:
            prepared = []
            for w in step:
                src = self._ctx_h if w.src_region == "ctx" else self._regions[w.src_region]
                dst = link.ctx if w.dst_region == "ctx" else link.regions[w.dst_region]
                if w.single:
                    p = e.prepare_single_write(src, w.src_offset, w.length, dst, w.dst_offset)
                else:
                    p = e.prepare_paged_writes(w.length, src, w.src_pages, w.src_stride,
                                               w.src_offset, dst, w.dst_pages, w.dst_stride,
                                               w.dst_offset)
                prepared.append((p, w.imms))
            out.append(prepared)
        return out

    def _job_finished(self, job: SendJob) -> None:
        with self._lock:
            if self._jobs.get(job.req_id) is not job:
                return
            del self._jobs[job.req_id]
            expiry = time.monotonic() + 120.0
            for lk, p in zip(job.links, job.posters):
                self._pending_imm.pop((lk.session, job.req_id), None)
                self._tomb[(lk.session, job.req_id)] = (expiry, p.imms_posted, p.failed)
            if job._ctx_slot is not None:
                self._ctx_free.append(job._ctx_slot)
            reason, ack_to = job._abort_reason, set(job._ack_to)
        failed = None
        for p, lk in zip(job.posters, job.links):
            if p.error is not None and failed is None:
                failed = p.error
            body = (job.req_id, p.imms_posted, p.failed, 0)
            if lk.session in ack_to:
                self._send(lk, Msg.ABORT_ACK, body)
            elif reason is not None:
                self._send(lk, Msg.ABORTED, body)
        if failed is not None:
            job.error = PeerDead(f"request {job.req_id}: {failed}") if isinstance(
                failed, Unavailable) else failed
        elif reason is not None:
            job.error = RequestAborted(f"request {job.req_id}: {reason}")
        if getattr(self.engine, "tracing", False):
            outcome = "ok" if job.error is None else type(job.error).__name__
            self.engine.trace_span(f"request {job.req_id} {outcome}", job._t0_ns,
                                   time.monotonic_ns(), "kv prefill")
        job._finished.set()

    def _expire_locked(self, now: Optional[float] = None) -> None:
        now = time.monotonic() if now is None else now
        if self._tomb and len(self._tomb) > 4096:
            for k in [k for k, t in self._tomb.items() if t[0] < now]:
                del self._tomb[k]
        for rid in [rid for rid, p in self._pending.items() if p.deadline < now]:
            p = self._pending.pop(rid)
            for s in p.parts:
                self._pending_imm.pop((s, rid), None)
                self._tomb[(s, rid)] = (now + 120.0, 0, 0)

    def _refuse(self, session: int, req_id: int, reason: Refusal, text: str) -> None:
        self.refusals[reason.name] = self.refusals.get(reason.name, 0) + 1
        lk = self._links.get(session)
        if lk is not None:
            self._send(lk, Msg.REFUSE, (req_id, reason, text))

    def _send(self, lk: _DecodeLink, kind: Msg, body: Any) -> None:
        self._send_addr(lk.addr, kind, lk.session, body)

    def _send_addr(self, addr: Any, kind: Msg, session: int, body: Any) -> None:
        try:
            self.engine.submit_send(addr, wire.encode(kind, session, body))
        except FerryError as e:  # the decoder is gone: its side times out or probes
            log.info("KV %s to a decode rank failed: %s", kind.name, e)


def register_regions(engine: Any, layout: KvLayout, buffers: Sequence[Any]) -> list:
    """Registers a cache's regions, then checks them against the layout: [(handle, desc)]."""
    regs = [engine.register(b) for b in buffers]
    check_regions(layout, [_nbytes(b) for b in buffers])
    return regs


def _nbytes(b: Any) -> int:
    if hasattr(b, "nbytes"):
        return int(b.nbytes)
    return memoryview(b).nbytes


def new_session() -> int:
    return secrets.randbits(63) | 1
