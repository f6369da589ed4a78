#!/usr/bin/env bash
# On the lent host: builds of the engine alternating on the latency points of
# issue 17 (docs/PERFORMANCE.md, "The crossing, cheaper"). For each round and each
# build (the order rotates from round to round): ferry-bench's ping-pongs against
# the raw provider (busy polling, pinned; each side's wake-up counts in round 1),
# self_imm_bench (one engine's immediate to itself, beside the raw loop), then the
# throughput points and the idle CPU of an adaptive engine, and the hops of the last
# build's round trip (scripts/lent_host_ab.sh).
#   BUILDS        names of the builds (default "A B"; A = before)
#   BIN_<name>    folder of each, holding ferry-bench, self_imm_bench, ferry-idle
#   ROUNDS        rounds of the alternation (default 2)
#   THROUGHPUT    the throughput points (default "single,paged"), run THROUGHPUT_ROUNDS
#                 times per build (default 1), the order rotating as above; "none" skips them
#   HOPS          0: no hops section
#   PROVIDERS     the latency points' providers (default "tcp;ofi_rxm shm")
# Output: $OUT/crossing.txt, $OUT/hops.txt, $OUT/summary.txt; libspdlog, libfmt, libnuma from .gpu-carry/lib.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}
mkdir -p "$O"
export LD_LIBRARY_PATH=$PWD/.gpu-carry/lib:${LD_LIBRARY_PATH:-}
PIN=(--poll busy --cpu 2,4,6 --server-cpu 8,10,12)
f=$O/crossing.txt
{ date -u; nproc; uptime; lscpu | grep -E "Model name|^CPU\(s\)|NUMA node"; } > "$f" 2>&1
read -r -a builds <<< "${BUILDS:-A B}"
n=${#builds[@]}
# The builds in round $1's order: the list rotated by one more each round.
rotation() { for i in $(seq 0 $((n - 1))); do echo "${builds[$(((i + $1 - 1) % n))]}"; done; }
# The folder of build $1 (BIN_<name>).
bin_of() { local b=BIN_$1; echo "${!b}"; }
for r in $(seq 1 "${ROUNDS:-2}"); do
  wake=(); [ "$r" = 1 ] && wake=(--wake)
  for v in $(rotation "$r"); do
    b=$(bin_of "$v")
    for p in ${PROVIDERS:-"tcp;ofi_rxm" shm}; do
      echo "== round $r build $v $p busy, pinned" >> "$f"
      timeout 120 "$b/ferry-bench" --provider "$p" "${PIN[@]}" --only imm,sendrecv --seconds 0.4 \
        --repeat 3 "${wake[@]}" >> "$f" 2>&1 || echo "rc=$?" >> "$f"
    done
    for p in shm tcp; do
      echo "== round $r build $v self_imm_bench $p" >> "$f"
      timeout 60 "$b/self_imm_bench" --provider "$p" --cpus 2,4 --iters 100000 --rounds 3 \
        --baselines >> "$f" 2>&1 || echo "rc=$?" >> "$f"
    done
  done
done
[ "${THROUGHPUT:-}" = none ] && THROUGHPUT_ROUNDS=0
for r in $(seq 1 "${THROUGHPUT_ROUNDS:-1}"); do
  for v in $(rotation "$r"); do
    b=$(bin_of "$v")
    for p in "tcp;ofi_rxm" shm; do
      echo "== round $r build $v $p throughput, busy, pinned" >> "$f"
      timeout 120 "$b/ferry-bench" --provider "$p" "${PIN[@]}" --only "${THROUGHPUT:-single,paged}" \
        --quick >> "$f" 2>&1 || echo "rc=$?" >> "$f"
    done
  done
done
for v in "${builds[@]}"; do
  b=$(bin_of "$v")
  for p in "tcp;ofi_rxm" shm; do
    echo "== build $v $p idle" >> "$f"
    timeout 30 "$b/ferry-idle" --provider "$p" --seconds 4 >> "$f" 2>&1 || echo "rc=$?" >> "$f"
  done
done
# Where the last build's round trip goes, hop by hop: lent_host_ab.sh's hops
# section, into $OUT/hops.txt (HOPS=0 leaves it out).
if [ "${HOPS:-1}" != 0 ]; then
  SECTIONS=hops BIN=$(bin_of "${builds[$((n - 1))]}") bash scripts/lent_host_ab.sh
fi
date -u >> "$f"
