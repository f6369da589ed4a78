#!/usr/bin/env python3
"""Summarise alternating A/B rounds of ferry-bench (scripts/lent_host_ab.sh, section obs).

Input: sections "== round R VARIANT" each followed by ferry-bench's table. Per point
(paged rows: GB/s; imm rows: p50 of the half round trip), the median and IQR of each
variant, and per variant the median over rounds of variant / base of the same round
with a 95 % bootstrap interval of that median (pairing by round removes the drift of the
machine between rounds).

    python3 scripts/ab_summary.py obs-tcp.txt [--base off]
"""

import argparse
import random
import re
import statistics
import sys

HEAD = re.compile(r"^== round (\d+) (\S+)")


def parse(path):
    """{(point): {variant: {round: value}}}"""
    out, cur = {}, None
    for line in open(path):
        m = HEAD.match(line)
        if m:
            cur = (int(m.group(1)), m.group(2))
            continue
        if cur is None or "|" not in line:
            continue
        left, mid = line.split("|")[:2]
        lt, mt = left.split(), mid.split()
        if len(lt) < 5 or lt[0] not in ("paged", "single", "imm", "imm-cb", "imm-inl", "sendrecv", "sendrecv-inl", "sendrecv-q"):
            continue
        try:
            value = float(mt[0]) if lt[0] in ("paged", "single") else float(mt[4])
        except (IndexError, ValueError):
            continue
        point = f"{lt[0]} {lt[1]}"
        out.setdefault(point, {}).setdefault(cur[1], {})[cur[0]] = value
    return out


def quartiles(xs):
    s = sorted(xs)
    q = statistics.quantiles(s, n=4) if len(s) > 1 else [s[0]] * 3
    return statistics.median(s), q[0], q[2]


def boot_median(xs, n=4000, seed=1):
    rnd = random.Random(seed)
    meds = sorted(statistics.median(rnd.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--base", default="off")
    a = ap.parse_args(argv)
    data = parse(a.file)
    if not data:
        print(f"{a.file}: no rounds found", file=sys.stderr)
        return 1
    print("point        variant  median (IQR)             rounds  variant/base: median [95% CI]"
          "   (paged: throughput, higher is faster; imm: p50 latency, higher is slower)")
    for point, by_var in data.items():
        base = by_var.get(a.base, {})
        for var in sorted(by_var, key=lambda v: (v != a.base, v)):
            vals = by_var[var]
            m, q1, q3 = quartiles(list(vals.values()))
            line = f"{point:12s} {var:8s} {m:8.3f} ({q1:.3f}-{q3:.3f})  {len(vals):6d}"
            if var != a.base and base:
                ratios = [vals[r] / base[r] for r in vals if r in base and base[r] > 0]
                if ratios:
                    lo, hi = boot_median(ratios)
                    line += f"  {statistics.median(ratios):.4f} [{lo:.4f}, {hi:.4f}]"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
