#!/usr/bin/env python3
"""Renders a PNG overview of a ferry trace (Chrome trace-event JSON, as written by
FERRY_TRACE=file.json or EngineConfig::trace_file): one row per track, spans as bars
(transfers by kind, the "posted" part darker, user spans in their own rows), instants
as ticks (immediates grey, errors red). For docs and bug reports; for real digging,
load the JSON in https://ui.perfetto.dev or chrome://tracing.

    python scripts/trace_png.py run.json run.png [--last-ms 50] [--width 14]

Needs matplotlib (pip install matplotlib).
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--last-ms", type=float, default=0, help="show only the last N ms (0: all)")
    ap.add_argument("--width", type=float, default=14, help="figure width in inches")
    args = ap.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        print("trace_png: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 2
    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    timed = [e for e in events if e.get("ph") in ("X", "i") and "ts" in e]
    if not timed:
        print("trace_png: no events", file=sys.stderr)
        return 1
    t_end = max(e["ts"] + e.get("dur", 0) for e in timed)
    t_start = min(e["ts"] for e in timed)
    if args.last_ms > 0:
        t_start = max(t_start, t_end - args.last_ms * 1000)
        timed = [e for e in timed if e["ts"] + e.get("dur", 0) >= t_start]
    rows = sorted({(e["pid"], e.get("tid", 0)) for e in timed})
    row_of = {r: i for i, r in enumerate(rows)}
    palette = {"single_write": "#4c78a8", "paged_writes": "#59a14f", "scatter": "#f28e2b",
               "barrier": "#b07aa1", "send": "#76b7b2", "prepared": "#edc948", "imm": "#9c755f"}
    fig_h = max(2.0, 0.45 * len(rows) + 1.2)
    fig, ax = plt.subplots(figsize=(args.width, fig_h))
    user_colors = ["#e15759", "#ff9da7", "#af7aa1", "#bab0ac", "#86bcb6"]
    seen = {}
    for e in timed:
        y = row_of[(e["pid"], e.get("tid", 0))]
        x = (e["ts"] - t_start) / 1000.0
        if e["ph"] == "X":
            w = max(e.get("dur", 0) / 1000.0, 1e-4)
            if e.get("cat") == "user":
                color = user_colors[sum(map(ord, e["name"])) % len(user_colors)]
                ax.broken_barh([(x, w)], (y - 0.4, 0.8), facecolors=color, edgecolor="none", alpha=0.8)
            elif e["name"] == "posted":
                ax.broken_barh([(x, w)], (y - 0.2, 0.4), facecolors="#333333", edgecolor="none", alpha=0.5)
            else:
                color = palette.get(e["name"], "#888888")
                if e.get("args", {}).get("status", "OK") != "OK":
                    color = "#d62728"
                ax.broken_barh([(x, w)], (y - 0.4, 0.8), facecolors=color, edgecolor="none", alpha=0.85)
                seen[e["name"]] = palette.get(e["name"], "#888888")
        else:
            color = "#d62728" if e.get("cat") == "error" else "#555555"
            ax.plot([x, x], [y - 0.45, y + 0.45], color=color, linewidth=0.6, alpha=0.7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([names.get(r, f"{r[0]}/{r[1]}") for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_xlim(0, (t_end - t_start) / 1000.0)
    handles = [Patch(color=c, label=n) for n, c in sorted(seen.items())]
    handles.append(Patch(color="#333333", alpha=0.5, label="posted (first post to end)"))
    handles.append(Patch(color="#d62728", label="error"))
    ax.legend(handles=handles, loc="upper right", fontsize=7, ncol=min(len(handles), 4))
    ax.set_title(f"{args.trace}: {len(timed)} events over {(t_end - t_start) / 1000.0:.1f} ms", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"trace_png: wrote {args.png} ({len(rows)} tracks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
