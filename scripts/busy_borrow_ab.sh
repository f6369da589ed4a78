#!/usr/bin/env bash
# On the lent H200 host: busy polling with and without borrowing of the worker's loop
# (docs/PERFORMANCE.md "Borrowing a busy worker's loop"), three builds alternating in
# one run: old (the worker posts and polls for everyone), a (submitters borrow the
# loop to post), b (submitters and spinning waiters borrow it). Binaries in
# .gpu-carry/bin as lat-bench-{old,a,b} and lat-chain-{old,b}, stripped; libspdlog,
# libfmt, libnuma in .gpu-carry/lib.
#   PART=1  busy pinned ping-pong, 2 rounds x tcp/shm x old/a/b; hops of b
#   PART=2  throughput (single, paged) busy pinned old/b; adaptive ping-pong old/b;
#           the GPU chain over shm old/b under MPS (the nvlink domain lends nothing:
#           only NICs any thread may call are borrowed)
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
B=$PWD/.gpu-carry/bin
export LD_LIBRARY_PATH=$PWD/.gpu-carry/lib:${LD_LIBRARY_PATH:-}
PIN=(--poll busy --cpu 2,4,6 --server-cpu 8,10,12)
S=$O/summary.txt
{ date -u; nproc; uptime; lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node"; } >> "$S" 2>&1
case ${PART:-1} in
1)
  f=$O/busy.txt
  for r in 1 2; do for p in "tcp;ofi_rxm" shm; do for v in old a b; do
    echo "== round $r $v $p busy, pinned" >> "$f"
    timeout 90 "$B/lat-bench-$v" --provider "$p" "${PIN[@]}" --only imm,sendrecv --seconds 0.4 \
      --repeat 3 >> "$f" 2>&1 || echo "rc=$?" >> "$f"
  done; done; done
  echo "busy done $(date -u +%T)" >> "$S"
  f=$O/hops.txt
  for p in "tcp;ofi_rxm" shm; do
    d=/tmp/hops-${p%%;*}; rm -rf "$d"; mkdir -p "$d"
    echo "== b $p busy, pinned, traced" >> "$f"
    timeout 60 "$B/lat-bench-b" --provider "$p" "${PIN[@]}" --only imm --seconds 0.3 --no-raw \
      --trace-dir "$d" >> "$f" 2>&1 || echo "rc=$?" >> "$f"
    for k in imm imm-cb imm-inl; do
      echo "-- $p $k" >> "$f"
      python3 scripts/trace_hops.py "$d/$k-0-client.json" "$d/$k-0-server.json" >> "$f" 2>&1
    done
    rm -rf "$d"
  done
  echo "hops done $(date -u +%T)" >> "$S"
  ;;
2)
  f=$O/throughput.txt
  for p in "tcp;ofi_rxm" shm; do for v in old b; do
    echo "== $v $p busy, pinned" >> "$f"
    timeout 120 "$B/lat-bench-$v" --provider "$p" "${PIN[@]}" --only single,paged --quick \
      >> "$f" 2>&1 || echo "rc=$?" >> "$f"
  done; done
  echo "throughput done $(date -u +%T)" >> "$S"
  f=$O/adaptive.txt
  for p in "tcp;ofi_rxm" shm; do for v in old b; do
    echo "== $v $p adaptive, unpinned" >> "$f"
    timeout 90 "$B/lat-bench-$v" --provider "$p" --only imm,sendrecv --seconds 0.4 --repeat 3 \
      >> "$f" 2>&1 || echo "rc=$?" >> "$f"
  done; done
  echo "adaptive done $(date -u +%T)" >> "$S"
  . scripts/mps.sh
  if mps_start "$S"; then
    for w in thread worker; do for v in old b; do
      echo "== chain $v shm imm busy (MPS) watch-on $w" >> "$O/chain.txt"
      timeout 40 "$B/lat-chain-$v" --provider shm --op imm --poll busy --watch-on $w \
        --iters 3000 >> "$O/chain.txt" 2>&1
      echo "rc=$?" >> "$O/chain.txt"
    done; done
    mps_stop
  else
    echo "MPS did not start" >> "$S"
  fi
  echo "chain done $(date -u +%T)" >> "$S"
  ;;
esac
uptime >> "$S"
