#!/usr/bin/env python3
"""Plots ferry-bench --json output: fraction of the raw libfabric baseline vs
message size (top: single writes, paged writes) and the absolute throughput of
both (bottom). Several JSON files (runs) are drawn over each other, so the
run-to-run spread of a shared machine stays visible.

    python3 bench/plot.py docs/bench-loopback.json -o docs/bench-loopback.png
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display on build machines
import matplotlib.pyplot as plt  # noqa: E402


def size_label(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10}K"
    return str(n)


def series(points, kind, key):
    """{label: [(size, fraction, ferry GB/s, raw GB/s)]} for one kind."""
    out = {}
    for p in points:
        if p["kind"] != kind:
            continue
        label = key(p)
        ferry, raw = p.get("ferry") or {}, p.get("raw") or {}
        out.setdefault(label, []).append(
            (p["size"], p.get("fraction_of_raw"), ferry.get("gb_s"), raw.get("gb_s")))
    for v in out.values():
        v.sort()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", help="ferry-bench --json files (one per run)")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    args = ap.parse_args()

    runs = []
    for path in args.json:
        with open(path) as f:
            runs.append((path, json.load(f)))

    fig, axes = plt.subplots(2, 2, figsize=(13, 9), sharex="col")
    panels = [
        ("single", lambda p: "with imm" if p["imm"] else "no imm", "single write size"),
        ("paged", lambda p: f'{p["count"]} pages/request', "page size"),
    ]
    markers = ["o", "s", "^", "D"]
    for col, (kind, key, xlabel) in enumerate(panels):
        frac_ax, abs_ax = axes[0][col], axes[1][col]
        for r, (path, doc) in enumerate(runs):
            run = f" (run {r + 1})" if len(runs) > 1 else ""
            for i, (label, pts) in enumerate(sorted(series(doc["points"], kind, key).items())):
                xs = [p[0] for p in pts]
                color = f"C{i}"
                m = markers[r % len(markers)]
                frac_ax.plot(xs, [p[1] for p in pts], marker=m, color=color,
                             alpha=1.0 if r == 0 else 0.6, label=label + run)
                abs_ax.plot(xs, [p[2] for p in pts], marker=m, color=color,
                            label=f"ferry, {label}{run}")
                abs_ax.plot(xs, [p[3] for p in pts], marker=m, color=color, linestyle="--",
                            alpha=0.6, label=f"raw, {label}{run}")
        frac_ax.axhline(1.0, color="grey", linewidth=0.8)
        targets = {"single": [(0.95, "target >= 1 MiB: 0.95")],
                   "paged": [(0.95, "target 64K pages: 0.95"), (0.80, "target 4K pages: 0.80")]}
        for y, text in targets[kind]:
            frac_ax.axhline(y, color="red", linestyle=":", linewidth=0.8)
            frac_ax.text(0.01, y, text, color="red",
                         fontsize=7, va="bottom", transform=frac_ax.get_yaxis_transform())
        frac_ax.set_title(f"{kind} writes: ferry / raw libfabric throughput")
        frac_ax.set_ylabel("fraction of raw")
        frac_ax.legend(fontsize=7)
        frac_ax.grid(True, alpha=0.3)
        abs_ax.set_ylabel("GB/s")
        abs_ax.set_xlabel(xlabel)
        abs_ax.set_title(f"{kind} writes: throughput (solid ferry, dashed raw)")
        abs_ax.grid(True, alpha=0.3)
        abs_ax.legend(fontsize=6, ncol=2)
        for ax in (frac_ax, abs_ax):
            ax.set_xscale("log", base=2)
        xs = sorted({p["size"] for _, d in runs for p in d["points"] if p["kind"] == kind})
        abs_ax.set_xticks(xs)
        abs_ax.set_xticklabels([size_label(x) for x in xs])

    meta = runs[0][1]["meta"]
    fig.suptitle(
        f'ferry-bench, provider {meta["provider"]}, {meta["nics"]} NIC(s), window '
        f'{meta["window"]}, poll {meta["poll"]} - {meta["cpu_model"]}, {meta["nproc"]} CPUs, '
        f'{meta["kernel"]}, commit {meta["git_commit"]}', fontsize=9)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
