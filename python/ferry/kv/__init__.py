"""ferry.kv: KV-cache transfer for disaggregated prefill and decode (docs/KV.md).

A prefill rank (KvSender) writes the KV pages of each request, layer by layer as its
forward pass finishes them, into pages that the decode rank (KvReceiver) allocated, then
the request's context; the decode rank learns completion from immediate counts alone.
Layouts are checked at the handshake (KvLayout, compat_hash), tensor-parallel degrees may
differ on the two sides, and aborts on either side are acknowledged so that a page is
reused only when no write to it can still land.
"""

from .decode import KV_IMM_BASE, KvReceiver, KvRequest, PrefillLink
from .errors import LayoutMismatch, PeerDead, RequestAborted, RequestRefused, TransferTimeout
from .layout import DTYPE_BYTES, KvLayout, head_sources, heads_of
from .plan import LinkPlan, Write, page_runs, plan_link
from .prefill import KvSender, PendingRequest, SendJob
from .wire import Refusal

__all__ = [
    "KV_IMM_BASE", "KvReceiver", "KvRequest", "PrefillLink", "LayoutMismatch", "PeerDead",
    "RequestAborted", "RequestRefused", "TransferTimeout", "DTYPE_BYTES", "KvLayout",
    "head_sources", "heads_of", "LinkPlan", "Write", "page_runs", "plan_link", "KvSender",
    "PendingRequest", "SendJob", "Refusal",
]
