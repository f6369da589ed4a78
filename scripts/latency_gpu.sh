#!/usr/bin/env bash
# Latency measurements of docs/PERFORMANCE.md ("Latency to the wire") on a lent GPU host:
# busy and adaptive ping-pong of two ferry-bench binaries (old, new) against raw, the
# GPU chain (ferry-chain), idle CPU (ferry-idle). Binaries built here, stripped, in
# .gpu-carry/bin as lat-bench-{old,new}, lat-chain, lat-idle-{old,new}; libspdlog, libfmt,
# libnuma in .gpu-carry/lib. CHAIN_ARGS adds chain options (e.g. "--gpu-b 1" on 2 GPUs).
export LD_LIBRARY_PATH=$PWD/.gpu-carry/lib:$LD_LIBRARY_PATH
B=$PWD/.gpu-carry/bin
O=${OUT:-/tmp/out}; mkdir -p $O
{ date -u; nproc; uptime; nvidia-smi -L; lscpu | grep -E "Model name|NUMA node0"; } > $O/machine.txt 2>&1
# 1. busy polling, pinned, interleaved old/new, tcp and shm
for p in "tcp;ofi_rxm" shm; do for v in old new; do
  echo "== $v $p busy" >> $O/bench.txt
  timeout 60 $B/lat-bench-$v --provider "$p" --poll busy --cpu 2,4,6 --server-cpu 8,10,12 \
    --only imm,sendrecv --seconds 0.4 --repeat 3 >> $O/bench.txt 2>&1
done; done
# 2. adaptive, nothing pinned
for p in "tcp;ofi_rxm" shm; do for v in old new; do
  echo "== $v $p adaptive" >> $O/bench.txt
  timeout 40 $B/lat-bench-$v --provider "$p" --only imm,sendrecv --seconds 0.4 --repeat 3 >> $O/bench.txt 2>&1
done; done
# 3. chain, busy and adaptive
for p in nvlink shm; do for op in imm write4k; do
  echo "== chain $p $op busy" >> $O/chain.txt
  timeout 35 $B/lat-chain --provider $p --op $op --poll busy --iters 2000 ${CHAIN_ARGS:-} >> $O/chain.txt 2>&1; echo "rc=$?" >> $O/chain.txt
done; done
echo "== chain nvlink imm adaptive" >> $O/chain.txt
timeout 35 $B/lat-chain --provider nvlink --op imm --poll adaptive --iters 2000 ${CHAIN_ARGS:-} >> $O/chain.txt 2>&1; echo "rc=$?" >> $O/chain.txt
# 4. idle CPU
for r in 1 2; do for p in "tcp;ofi_rxm" shm; do for v in old new; do
  echo -n "$v " >> $O/idle.txt; timeout 20 $B/lat-idle-$v --provider "$p" --seconds 4 2>/dev/null | tail -1 >> $O/idle.txt
done; done; done
date -u >> $O/machine.txt
