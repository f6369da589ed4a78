#!/usr/bin/env bash
# Two builds of the latency tools, alternating on one host, for a difference too small for
# one run to show (docs/PERFORMANCE.md, issue 17). Each of A and B is a folder holding
# ferry-bench, self_imm_bench and ferry-idle of one build (stripped copies of build/tools and
# build/bench; on the lent host with Debian's libspdlog, libfmt and libnuma in $LIBS).
#   scripts/ab_pair.sh A B [ROUNDS]
# Per round, in the order A B (odd rounds) or B A (even rounds): the busy ping-pong with the
# application threads pinned (shm, then tcp), with each side's wake-up counts in round 1;
# then two rounds of the scatter and barrier throughput points (shm), a self round trip
# each, and the idle CPU of each. Output: $OUT/ab_pair.txt.
# CPUS and SERVER_CPUS override the pinning (defaults for a 16-CPU host).
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 A B [ROUNDS]" >&2; exit 2; }
A=$1 B=$2 ROUNDS=${3:-4}
O=${OUT:-/tmp/out}; mkdir -p "$O"
export LD_LIBRARY_PATH=${LIBS:-}:${LD_LIBRARY_PATH:-} FERRY_LOG=${FERRY_LOG:-warn}
rm -f /dev/shm/*:0:0 2>/dev/null
exec > >(tee "$O/ab_pair.txt") 2>&1
date -u; uptime; nproc; grep -m1 "model name" /proc/cpuinfo
lscpu | grep -E "Thread|Core|Socket|NUMA node\("
# Each side's worker, callback and application threads on CPUs of their own.
PIN=(--poll busy --cpu "${CPUS:-2,4,6}" --server-cpu "${SERVER_CPUS:-8,10,12}")
for r in $(seq 1 "$ROUNDS"); do
  order="$A $B"; [ $((r % 2)) = 0 ] && order="$B $A"
  wake=(); [ "$r" = 1 ] && wake=(--wake)
  for p in shm "tcp;ofi_rxm"; do
    for d in $order; do
      echo "######## busy pinned $p round $r $d"
      timeout 60 "$d/ferry-bench" --provider "$p" "${PIN[@]}" --only imm,sendrecv --seconds 0.3 \
        "${wake[@]}" 2>&1 | grep -E "^(imm|send|wake)"
    done
  done
done
for r in 1 2; do
  for d in $A $B; do
    echo "######## busy pinned shm scatter and barrier round $r $d"
    timeout 60 "$d/ferry-bench" --provider shm "${PIN[@]}" --quick --only scatter,barrier 2>&1 |
      grep -E "^(scatter|barrier)"
  done
done
for r in 1 2; do
  for d in $A $B; do
    echo "######## self shm round $r $d"
    timeout 60 "$d/self_imm_bench" --provider shm --cpus "${SELF_CPUS:-2,4}" --iters 300000 --rounds 1 \
      --baselines 2>&1 | grep -vE "^\[20"
  done
done
for d in $A $B; do
  for p in shm "tcp;ofi_rxm"; do
    echo "######## idle $p $d"
    timeout 30 "$d/ferry-idle" --provider "$p" --seconds 3 2>&1 | grep -vE "^\[20" | tail -1
  done
done
date -u
