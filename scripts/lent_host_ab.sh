#!/usr/bin/env bash
# On the lent H200 host (16 CPUs, nothing else running): the figures that a 2-core VM
# cannot resolve (docs/OBSERVABILITY.md "Cost", docs/PERFORMANCE.md issue 17).
#   obs      the statistics' cost: builds with FERRY_STATS=OFF / ON / ON + FERRY_TRACE,
#            ROUNDS rounds whose order rotates, busy polling on pinned CPUs, tcp and shm
#   latency  busy (pinned) and adaptive ping-pong against the raw provider, same run
#   hops     where a busy ping-pong's round trip goes, hop by hop, from both engines'
#            traces (scripts/trace_hops.py), imm / imm-cb / imm-inl on tcp and shm
#   chain    the GPU -> proxy -> engine -> peer GPU chain, both processes under MPS
# Binaries in $BIN (default .gpu-carry/bin): bench-obs (build-obs), bench-obs-nostats
# (build-obs-nostats), ferry-bench and lat-chain (build/), stripped; libspdlog, libfmt and
# libnuma in .gpu-carry/lib. Summaries: python3 scripts/ab_summary.py $OUT/obs-tcp.txt
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
B=${BIN:-$PWD/.gpu-carry/bin}
export LD_LIBRARY_PATH=$PWD/.gpu-carry/lib:${LD_LIBRARY_PATH:-}
ROUNDS=${ROUNDS:-20}
PIN=(--poll busy --cpu 2,4,6 --server-cpu 8,10,12)
# Few files: the device tool returns at most eight from one call.
S=$O/summary.txt
{ date -u; nproc; uptime; command -v perf; lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node"; nvidia-smi -L; } > "$S" 2>&1
for s in ${SECTIONS:-obs latency chain}; do
  case $s in
  obs)
    for p in "tcp;ofi_rxm" shm; do
      f=$O/obs-${p%%;*}.txt; : > "$f"
      for r in $(seq 1 "$ROUNDS"); do
        case $((r % 3)) in 1) order="off on trace" ;; 2) order="on trace off" ;; 0) order="trace off on" ;; esac
        for v in $order; do
          bin=$B/bench-obs; [ $v = off ] && bin=$B/bench-obs-nostats
          env=(); [ $v = trace ] && env=(FERRY_TRACE=/tmp/obs-trace-%p.json)
          echo "== round $r $v" >> "$f"
          env "${env[@]}" timeout 30 "$bin" --provider "$p" "${PIN[@]}" --quick --only paged,imm \
            --seconds 0.3 --no-raw >> "$f" 2>&1 || echo "rc=$?" >> "$f"
          rm -f /tmp/obs-trace-*.json
        done
      done
      echo "obs $p done $(date -u +%T)" >> "$S"
    done
    ;;
  latency)
    f=$O/latency.txt; : > "$f"
    for p in "tcp;ofi_rxm" shm; do
      echo "== $p busy, pinned" >> "$f"
      timeout 120 "$B/ferry-bench" --provider "$p" "${PIN[@]}" --only imm,sendrecv --seconds 0.4 \
        --repeat 5 >> "$f" 2>&1 || echo "rc=$?" >> "$f"
      echo "== $p adaptive, unpinned" >> "$f"
      timeout 120 "$B/ferry-bench" --provider "$p" --only imm,sendrecv --seconds 0.4 --repeat 5 \
        >> "$f" 2>&1 || echo "rc=$?" >> "$f"
    done
    echo "latency done $(date -u +%T)" >> "$S"
    ;;
  hops)
    f=$O/hops.txt; : > "$f"
    for p in "tcp;ofi_rxm" shm; do
      d=/tmp/hops-${p%%;*}; rm -rf "$d"; mkdir -p "$d"
      echo "== $p busy, pinned, traced" >> "$f"
      timeout 60 "$B/ferry-bench" --provider "$p" "${PIN[@]}" --only imm --seconds 0.3 --no-raw \
        --trace-dir "$d" >> "$f" 2>&1 || echo "rc=$?" >> "$f"
      for k in imm imm-cb imm-inl; do
        echo "-- $p $k" >> "$f"
        python3 scripts/trace_hops.py "$d/$k-0-client.json" "$d/$k-0-server.json" >> "$f" 2>&1
      done
      rm -rf "$d"
    done
    echo "hops done $(date -u +%T)" >> "$S"
    ;;
  chain)
    . scripts/mps.sh
    if mps_start "$S"; then
      # watch-on: the callbacks on the watcher thread, or on the worker (WatchOn::kWorker)
      for run in 1 2; do for w in thread worker; do for p in nvlink shm; do
        echo "== chain $p imm busy (MPS) watch-on $w run $run" >> "$O/chain.txt"
        timeout 40 "$B/lat-chain" --provider $p --op imm --poll busy --watch-on $w --iters 3000 \
          >> "$O/chain.txt" 2>&1
        echo "rc=$?" >> "$O/chain.txt"
      done; done; done
      mps_stop
    else
      echo "MPS did not start" >> "$S"
    fi
    echo "chain done $(date -u +%T)" >> "$S"
    ;;
  esac
done
uptime >> "$S"
echo "all done $(date -u +%T)" >> "$S"
