"""Control messages of the KV protocol (docs/KV.md, "Messages"), over submit_send/submit_recvs.

Every message starts with a 4-byte magic-and-version, a type byte and the 64-bit link
session. Hello messages carry JSON (the layout blob, descriptors as hex); the per-request
ones are fixed little-endian structs, with page lists as uint32 arrays. Decoding checks
every length: a malformed or truncated message raises Malformed and is dropped by the
caller (a peer can never crash the process with bytes).
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Msg", "Refusal", "Malformed", "encode", "decode", "MAX_MESSAGE"]

MAGIC = b"FKV1"
MAX_MESSAGE = 64 << 10  # the engine's default send buffer


class Malformed(ValueError):
    pass


class Msg(enum.IntEnum):
    HELLO = 1  # decoder -> prefiller: layout, region descriptors, reply address
    HELLO_OK = 2  # prefiller -> decoder: its layout, NIC count
    HELLO_REFUSED = 3
    REQUEST = 4  # decoder -> prefiller
    ACCEPT = 5  # prefiller -> decoder: immediates it will send
    REFUSE = 6  # prefiller -> decoder: typed refusal
    ABORT = 7  # decoder -> prefiller
    ABORT_ACK = 8  # prefiller -> decoder: immediates it posted; none will follow
    ABORTED = 9  # prefiller -> decoder: the prefiller gave up; immediates it posted
    PING = 10  # liveness probe: only the send's success matters


class Refusal(enum.IntEnum):
    BUSY = 1  # no capacity
    DUPLICATE = 2  # request id already live or recently finished on this link
    STALE = 3  # aborted before it arrived, past its deadline, or an unknown session
    BAD_REQUEST = 4  # pages out of range, wrong group count, context too large
    LAYOUT = 5  # layouts incompatible
    REJECTED = 6  # the prefill application said no
    SHUTDOWN = 7  # the prefiller is stopping


_HDR = struct.Struct("<4sBxxxQ")  # magic, type, session
_REQ = struct.Struct("<QIIIIIIII")  # req_id, imm, deadline_ms, tokens, chunk_pages, ctx_slot,
#                                     ctx_len, groups, flags
_ACCEPT = struct.Struct("<QQ")  # req_id, immediates
_REFUSE = struct.Struct("<QI")  # req_id, reason; utf-8 text follows
_ABORT = struct.Struct("<Q")  # req_id
_ACK = struct.Struct("<QQII")  # req_id, immediates posted, failed writes, reason


@dataclass
class Request:
    req_id: int
    imm: int
    deadline_ms: int
    num_tokens: int
    chunk_pages: int
    ctx_slot: int
    ctx_len: int
    pages: list  # one np.uint32 array per layer group


def encode(kind: Msg, session: int, body: Any = None) -> bytes:
    h = _HDR.pack(MAGIC, int(kind), session)
    if kind in (Msg.HELLO, Msg.HELLO_OK, Msg.HELLO_REFUSED):
        out = h + json.dumps(body, separators=(",", ":")).encode()
    elif kind == Msg.REQUEST:
        r: Request = body
        parts = [h, _REQ.pack(r.req_id, r.imm, r.deadline_ms, r.num_tokens, r.chunk_pages,
                              r.ctx_slot, r.ctx_len, len(r.pages), 0)]
        for p in r.pages:
            a = np.ascontiguousarray(p, dtype="<u4")
            parts += [struct.pack("<I", a.size), a.tobytes()]
        out = b"".join(parts)
    elif kind == Msg.ACCEPT:
        out = h + _ACCEPT.pack(*body)
    elif kind == Msg.REFUSE:
        req_id, reason, text = body
        out = h + _REFUSE.pack(req_id, int(reason)) + text.encode()[:1024]
    elif kind in (Msg.ABORT, Msg.PING):
        out = h + _ABORT.pack(body or 0)
    elif kind in (Msg.ABORT_ACK, Msg.ABORTED):
        out = h + _ACK.pack(*body)
    else:  # pragma: no cover
        raise ValueError(kind)
    if len(out) > MAX_MESSAGE:
        raise Malformed(f"{kind.name} of {len(out)} bytes exceeds {MAX_MESSAGE}")
    return out


def decode(buf: bytes) -> tuple[Msg, int, Any]:
    if len(buf) < _HDR.size:
        raise Malformed(f"{len(buf)} bytes is shorter than a header")
    magic, kind, session = _HDR.unpack_from(buf)
    if magic != MAGIC:
        raise Malformed(f"bad magic {magic!r}")
    try:
        kind = Msg(kind)
    except ValueError:
        raise Malformed(f"unknown message type {kind}") from None
    rest = memoryview(buf)[_HDR.size:]
    try:
        if kind in (Msg.HELLO, Msg.HELLO_OK, Msg.HELLO_REFUSED):
            body = json.loads(bytes(rest).decode())
            if not isinstance(body, dict):
                raise Malformed("hello body is not an object")
        elif kind == Msg.REQUEST:
            f = _REQ.unpack_from(rest)
            off, pages = _REQ.size, []
            if f[7] > 64:
                raise Malformed(f"{f[7]} layer groups")
            for _ in range(f[7]):
                (n,) = struct.unpack_from("<I", rest, off)
                off += 4
                if off + 4 * n > len(rest):
                    raise Malformed("page list runs past the message")
                pages.append(np.frombuffer(rest[off:off + 4 * n], dtype="<u4").astype(np.uint32))
                off += 4 * n
            if off != len(rest):
                raise Malformed("trailing bytes after the page lists")
            body = Request(*f[:7], pages=pages)
        elif kind == Msg.ACCEPT:
            body = _ACCEPT.unpack_from(rest)
        elif kind == Msg.REFUSE:
            req_id, reason = _REFUSE.unpack_from(rest)
            body = (req_id, reason, bytes(rest[_REFUSE.size:]).decode(errors="replace"))
        elif kind in (Msg.ABORT, Msg.PING):
            body = _ABORT.unpack_from(rest)[0]
        else:
            body = _ACK.unpack_from(rest)
    except (struct.error, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Malformed(f"{kind.name}: {e}") from None
    return kind, session, body
