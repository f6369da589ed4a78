#!/usr/bin/env python3
"""Where an immediate ping-pong's round trip goes, hop by hop, from the two engines' traces.

    python3 scripts/trace_hops.py DIR/imm-0-client.json DIR/imm-0-server.json

(`ferry-bench --only imm --trace-dir DIR`.) Both processes stamp CLOCK_MONOTONIC, so the
two files share one time line. Each round trip is walked in the order it must happen:

    client submit -> client posted -> server arrival -> server submit -> server posted
    -> client arrival -> next client submit

"submit" is the application's (or callback's) call, "posted" the worker's return from the
provider's post, "arrival" the worker reading the immediate's completion. A round trip
whose events are not in that order (the trace ring dropped some) is skipped. Where the
traces say when the worker took each command up ("picked up"), each side's submit ->
posted hop is split there: the hand-off to the worker, then the engine's path to the
provider with the provider's post.
"""
import bisect
import json
import statistics
import sys

HOPS = [
    "client submit -> worker posted",
    "client posted -> server worker read it",
    "server arrival -> server submit",
    "server submit -> worker posted",
    "server posted -> client worker read it",
    "client arrival -> next client submit",
]


def load(path):
    """(submit, posted, picked up or None) per transfer and the arrival times, in ns, sorted."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    starts, posts, picked, arrivals = {}, {}, {}, []
    for e in events:
        if e.get("cat") == "transfer" and e.get("ph") == "X":
            tid = e["args"]["transfer"]
            t = round(e["ts"] * 1000)
            (posts if e["name"] == "posted" else starts)[tid] = t
        elif e.get("cat") == "transfer" and e.get("ph") == "i" and e.get("name") == "picked up":
            picked[e["args"]["transfer"]] = round(e["ts"] * 1000)
        elif e.get("cat") == "imm" and e.get("ph") == "i":
            arrivals.append(round(e["ts"] * 1000))
    sends = sorted((starts[i], posts[i], picked.get(i)) for i in starts if i in posts)
    return sends, sorted(arrivals)


def walk(client, server):
    c_sends, c_arr = client
    s_sends, s_arr = server
    s_sub = [s for s, _, _ in s_sends]
    rows, splits = [], []
    for i in range(len(c_sends) - 1):
        sub, post, c_pick = c_sends[i]
        nxt = c_sends[i + 1][0]
        j = bisect.bisect_left(s_arr, post)
        if j == len(s_arr):
            break
        a_s = s_arr[j]
        k = bisect.bisect_left(s_sub, a_s)
        if k == len(s_sub):
            break
        ss, sp, s_pick = s_sends[k]
        m = bisect.bisect_left(c_arr, sp)
        if m == len(c_arr):
            break
        a_c = c_arr[m]
        t = [sub, post, a_s, ss, sp, a_c, nxt]
        if all(t[x] <= t[x + 1] for x in range(6)):
            rows.append([t[x + 1] - t[x] for x in range(6)])
            if c_pick is not None and s_pick is not None and sub <= c_pick <= post and ss <= s_pick <= sp:
                splits.append([c_pick - sub, post - c_pick, s_pick - ss, sp - s_pick])
    return rows, splits


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    rows, splits = walk(load(argv[1]), load(argv[2]))
    if not rows:
        print("no complete round trip in the two traces", file=sys.stderr)
        return 1
    total = [sum(r) for r in rows]
    print(f"{len(rows)} round trips; round trip p50 {statistics.median(total) / 1000:.2f} us, "
          f"p99 {pct(total, 0.99) / 1000:.2f} us")
    print(f"{'hop':42s} {'p50 us':>8s} {'p90 us':>8s} {'p99 us':>8s}")
    for h, name in enumerate(HOPS):
        col = [r[h] for r in rows]
        print(f"{name:42s} {statistics.median(col) / 1000:8.3f} {pct(col, 0.9) / 1000:8.3f} "
              f"{pct(col, 0.99) / 1000:8.3f}")
    if splits:
        print(f"split where the worker took the command up ({len(splits)} round trips):")
        for h, name in enumerate(["client submit -> worker picked it up", "client picked up -> posted",
                                  "server submit -> worker picked it up", "server picked up -> posted"]):
            col = [r[h] for r in splits]
            print(f"  {name:40s} {statistics.median(col) / 1000:8.3f} {pct(col, 0.9) / 1000:8.3f} "
                  f"{pct(col, 0.99) / 1000:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
