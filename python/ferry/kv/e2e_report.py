"""Where the time of a disaggregated request goes, from the prefill engine's trace
(docs/KV.md, "GPU end to end"). Pure Python, so it is tested without a GPU.

The prefill engine's trace holds one ``prepared`` span per posted write (submit to local
completion; the watcher thread submits a layer's writes when the graph bumps the word
after that layer). Each request's writes are those that start inside its window (the
graph's launch to the job's end). In posting order: two per layer (its K and its V run,
coalesced) and the context last, told apart by size.
"""

from __future__ import annotations

import json
from typing import Iterable, Optional


def prepared_spans(trace_path: str) -> list:
    """(start_ns, end_ns, bytes) of every ``prepared`` transfer span, in start order."""
    with open(trace_path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    out = []
    for e in events:
        if e.get("ph") == "X" and e.get("name") == "prepared":
            start = int(round(float(e["ts"]) * 1000))
            out.append((start, start + int(round(float(e["dur"]) * 1000)),
                        int(e.get("args", {}).get("bytes", 0))))
    out.sort()
    return out


def imm_instants(trace_path: str) -> list:
    """Times (ns) at which the engine's worker counted immediates, in order."""
    with open(trace_path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return sorted(int(round(float(e["ts"]) * 1000)) for e in events
                  if e.get("ph") == "i" and e.get("cat") == "imm")


def request_breakdown(spans: Iterable[tuple], window: tuple, ctx_bytes: int,
                      layers: int, released_ns: Optional[int] = None,
                      decoder_imms: Optional[list] = None,
                      seen_ns: Optional[int] = None,
                      pages_released_ns: Optional[int] = None) -> dict:
    """Per-hop times of one request, in microseconds.

    window: (first_ns, last_ns) that holds this request's writes and no other's.
    released_ns: when the decoder's wait returned (CLOCK_MONOTONIC, the clock of the
    trace). decoder_imms: the decoder engine's immediate times (imm_instants); the last
    one before released_ns is when its worker counted the request complete, the moment a
    kernel waiting on an imm_counter_gpu flag is released. seen_ns: when the decoder's
    wait saw the count complete (KvRequest.seen_ns), before its bookkeeping;
    pages_released_ns: when that bookkeeping ended (KvRequest.released_ns).

    The prefill forward posts a layer's K and V when its cache hook ran (before that
    layer's attention), and the context after the last layer, the final norm and the
    first token's logits: the context's post is where colocated prefill would have
    finished, and what comes after it is the exposed time.

    last_layer_post_us: the last layer's writes submitted, from the window start;
    last_layer_us: that layer's submit to its last local completion; layer_us /
    layer_min_us / layer_max_us: the median / fastest / slowest layer's (one layer's
    transfer time, measured while the forward runs); context_post_after_last_layer_us:
    the last layer's compute; context_us: the context write's submit to completion;
    exposed_us: context posted to the decoder's wait returning; exposed_engine_us: to
    the decoder's worker counting the last immediate.
    """
    lo, hi = window
    mine = [s for s in spans if lo <= s[0] <= hi]
    ctx = [s for s in mine if s[2] == ctx_bytes]
    data = [s for s in mine if s[2] != ctx_bytes]
    if len(data) < 2 * layers or not ctx:
        raise ValueError(f"expected {2 * layers} layer writes and a context write in the "
                         f"window, found {len(data)} and {len(ctx)}")
    data = data[-2 * layers:]
    per_layer = [data[2 * i:2 * i + 2] for i in range(layers)]
    dur = sorted(max(s[1] for s in p) - min(s[0] for s in p) for p in per_layer)
    last = per_layer[-1]
    last_post = min(s[0] for s in last)
    c = ctx[-1]
    out = {"writes": len(mine), "last_layer_post_us": (last_post - lo) / 1e3,
           "last_layer_us": (max(s[1] for s in last) - last_post) / 1e3,
           "layer_us": dur[len(dur) // 2] / 1e3, "layer_min_us": dur[0] / 1e3,
           "layer_max_us": dur[-1] / 1e3,
           "context_post_after_last_layer_us": (c[0] - last_post) / 1e3,
           "context_us": (c[1] - c[0]) / 1e3}
    if released_ns is not None:
        out["exposed_us"] = (released_ns - c[0]) / 1e3
        out["release_after_context_done_us"] = (released_ns - c[1]) / 1e3
        counted = [t for t in decoder_imms or [] if t <= released_ns]
        if counted:
            out["exposed_engine_us"] = (counted[-1] - c[0]) / 1e3
            if seen_ns is not None:
                # The waiting thread's wake-up, then the bookkeeping before wait returns.
                out["wait_saw_count_after_us"] = (seen_ns - counted[-1]) / 1e3
                out["release_after_seen_us"] = (released_ns - seen_ns) / 1e3
                if pages_released_ns is not None:
                    out["bookkeeping_us"] = (pages_released_ns - seen_ns) / 1e3
    return out


def median(xs: list) -> float:
    s = sorted(xs)
    return s[len(s) // 2]
