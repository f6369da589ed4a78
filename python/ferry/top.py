"""A live view of a running engine through its metrics endpoint.

    python -m ferry.top 127.0.0.1:9464            # refresh every second (Ctrl-C quits)
    python -m ferry.top --once 127.0.0.1:9464     # print one snapshot and exit

The engine serves the endpoint when started with metrics="host:port"
(EngineConfig::metrics_address, or FERRY_METRICS=host:port in its environment).
Rates are the difference between two scrapes; latencies are bucket upper bounds
of the engine's histograms (docs/OBSERVABILITY.md).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
import urllib.request
from collections import defaultdict

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> list[tuple[str, dict, float]]:
    """Samples of the Prometheus text format: (name, labels, value)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(m.group(2) or "")}
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def scrape(address: str, timeout: float = 5.0) -> list[tuple[str, dict, float]]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as r:
        return parse(r.read().decode())


def _sum(samples, name, **want) -> float:
    return sum(v for n, ls, v in samples if n == name and all(ls.get(k) == x for k, x in want.items()))


def _quantile(samples, name, q: float, **want) -> float:
    """Upper bound (seconds) of the bucket holding quantile q of histogram `name`."""
    buckets = defaultdict(float)
    for n, ls, v in samples:
        if n == name + "_bucket" and all(ls.get(k) == x for k, x in want.items()):
            buckets[float(ls["le"])] += v
    if not buckets:
        return 0.0
    bounds = sorted(buckets)
    count = buckets[bounds[-1]]
    if count == 0:
        return 0.0
    for b in bounds:
        if buckets[b] >= q * count:
            return b
    return bounds[-1]


def _si(x: float, unit: str = "") -> str:
    for p in ("", "K", "M", "G", "T"):
        if abs(x) < 1000 or p == "T":
            return f"{x:.0f} {p}{unit}" if p == "" else f"{x:.1f} {p}{unit}"
        x /= 1000
    return f"{x}"


def _dur(s: float) -> str:
    if s == 0 or math.isinf(s):
        return "-" if s == 0 else ">8s"
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def render(now, before=None, dt: float = 0.0) -> str:
    """One screen: totals, per NIC and peer, latencies, immediates."""

    def rate(name, **want):
        if before is None or dt <= 0:
            return None
        return (_sum(now, name, **want) - _sum(before, name, **want)) / dt

    lines = []
    ok = _sum(now, "ferry_transfers_total", outcome="ok")
    failed = {ls["outcome"]: v for n, ls, v in now if n == "ferry_transfers_total" and ls["outcome"] != "ok" and v}
    r = rate("ferry_transfers_total", outcome="ok")
    lines.append(
        f"transfers ok {ok:.0f}" + (f" ({r:.0f}/s)" if r is not None else "")
        + "  failed " + (", ".join(f"{k} {v:.0f}" for k, v in sorted(failed.items())) or "0")
        + f"  in flight {_sum(now, 'ferry_requests_in_flight'):.0f}"
        + f"  queued {_sum(now, 'ferry_command_queue_depth'):.0f}"
    )
    lines.append(
        "latency p50 {}  p99 {}   queue delay p50 {}   counter wait p50 {}   callback delay p99 {}".format(
            _dur(_quantile(now, "ferry_transfer_latency_seconds", 0.5)),
            _dur(_quantile(now, "ferry_transfer_latency_seconds", 0.99)),
            _dur(_quantile(now, "ferry_queue_delay_seconds", 0.5)),
            _dur(_quantile(now, "ferry_counter_wait_seconds", 0.5)),
            _dur(_quantile(now, "ferry_callback_delay_seconds", 0.99)),
        )
    )
    lines.append("")
    lines.append(f"{'group/nic':<12}{'peer':<34}{'written':>12}{'rate':>12}{'writes':>10}{'backpr.':>9}{'errors':>8}")
    peers = sorted({(ls["group"], ls["nic"], ls["nic_name"], ls["peer"]) for n, ls, v in now
                    if n == "ferry_bytes_written_total"})
    for g, k, nic_name, peer in peers:
        key = dict(group=g, nic=k, peer=peer)
        br = rate("ferry_bytes_posted_total", **key)
        lines.append(
            f"{g + '/' + k + ' ' + nic_name:<12.12}{peer:<34.34}"
            f"{_si(_sum(now, 'ferry_bytes_written_total', **key), 'B'):>12}"
            f"{(_si(br, 'B/s') if br is not None else '-'):>12}"
            f"{_sum(now, 'ferry_writes_posted_total', **key):>10.0f}"
            f"{_sum(now, 'ferry_backpressure_total', **key):>9.0f}"
            f"{_sum(now, 'ferry_post_errors_total', **key):>8.0f}"
        )
    nics = sorted({(ls["group"], ls["nic"], ls["nic_name"]) for n, ls, v in now if n == "ferry_imms_received_total"})
    for g, k, name in nics:
        key = dict(group=g, nic=k)
        lines.append(
            f"NIC {g}/{k} {name}: outstanding {_sum(now, 'ferry_nic_outstanding_writes', **key):.0f}, "
            f"pending {_sum(now, 'ferry_nic_pending_shards', **key):.0f}, "
            f"completion errors {_sum(now, 'ferry_nic_completion_errors_total', **key):.0f}, "
            f"immediates in {_sum(now, 'ferry_imms_received_total', **key):.0f}"
        )
    imms = sorted(((v, ls["imm"]) for n, ls, v in now if n == "ferry_imm_value_received_total" and v), reverse=True)
    if imms:
        lines.append("immediates by value: " + ", ".join(f"{imm}: {v:.0f}" for v, imm in imms[:8]))
    if _sum(now, "ferry_stats_enabled") == 0:
        lines.append("(this engine was built with FERRY_STATS=OFF: no statistics)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ferry.top", description=__doc__.split("\n\n")[0])
    ap.add_argument("address", help="host:port of the engine's metrics endpoint")
    ap.add_argument("--once", action="store_true", help="print one snapshot and exit")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    args = ap.parse_args(argv)
    try:
        before, t0 = scrape(args.address), time.monotonic()
    except OSError as e:
        print(f"ferry.top: cannot scrape http://{args.address}/metrics: {e}", file=sys.stderr)
        return 1
    if args.once:
        print(render(before))
        return 0
    try:
        while True:
            time.sleep(args.interval)
            try:
                now, t1 = scrape(args.address), time.monotonic()
            except OSError as e:
                print(f"\nferry.top: {e}", file=sys.stderr)
                return 1
            sys.stdout.write("\x1b[H\x1b[2J" + f"ferry.top  http://{args.address}/metrics\n\n"
                             + render(now, before, t1 - t0) + "\n")
            sys.stdout.flush()
            before, t0 = now, t1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
