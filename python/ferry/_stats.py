"""TransferEngine's observability methods (docs/OBSERVABILITY.md): statistics,
the metrics endpoint and the trace timeline."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Optional

from . import _ferry


def trace_clock_ns() -> int:
    """The trace clock: CLOCK_MONOTONIC nanoseconds, the same as time.monotonic_ns()."""
    return time.monotonic_ns()


class _Observability:
    _e: Any

    def stats(self) -> dict:
        """Counters and gauges now, as a dict (keys: docs/OBSERVABILITY.md).

        Totals: ``transfers`` ({"ok": n, "failed": {code: n}}), ``bytes_posted``,
        ``bytes_completed``, ``writes_posted``, ``writes_completed``,
        ``imms_received``, ``backpressure``; per group ``workers``, per NIC ``nics``,
        per (NIC, peer) ``peers``; ``top_imms`` [(imm, count)], histograms
        (``counter_wait``, ``callback_delay``, ``watcher_poll_lag``, and per worker
        ``transfer_latency``, ``queue_delay``, ``registration_time``) as
        {"count", "sum_s", "buckets": [(upper_s, count)], "p50_s", "p99_s"}.
        After stop(), the figures as stop() left them.
        """
        return _ferry._stats(self._e)

    @property
    def metrics_address(self) -> Optional[str]:
        """"host:port" of the Prometheus endpoint (GET /metrics), or None when off."""
        a = _ferry._metrics_address(self._e)
        return a or None

    @property
    def tracing(self) -> bool:
        """True when a trace file will be written at stop()."""
        return bool(_ferry._tracing(self._e))

    def trace_span(self, name: str, start_ns: int, end_ns: int, track: str = "user") -> None:
        """Adds a span to this engine's trace (times from trace_clock_ns() or
        time.monotonic_ns()) on the track `track`; a no-op when tracing is off."""
        _ferry._trace_span(self._e, str(name), int(start_ns), int(end_ns), str(track))

    def trace_instant(self, name: str, at_ns: Optional[int] = None, track: str = "user") -> None:
        """A point in time on `track` (now when at_ns is None)."""
        t = time.monotonic_ns() if at_ns is None else int(at_ns)
        _ferry._trace_span(self._e, str(name), t, t, str(track))

    @contextlib.contextmanager
    def trace(self, name: str, track: str = "user") -> Iterator[None]:
        """``with engine.trace("layer 3 pushed", track="kv"): ...`` records the block as a span."""
        start = time.monotonic_ns()
        try:
            yield
        finally:
            _ferry._trace_span(self._e, str(name), start, time.monotonic_ns(), str(track))
