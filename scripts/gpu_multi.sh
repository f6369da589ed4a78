#!/usr/bin/env bash
# The runs that need several GPUs of one host (the multi-GPU issue; docs/PERFORMANCE.md,
# docs/MOE.md), on the device tool's nvidia-h200-x2 (or -x4, -x8) kind:
#
#   scripts/gpu_multi.sh N [OUT]    N = GPUs of the machine
#   SECTIONS="nvlink latency" scripts/gpu_multi.sh 2   only those (nvlink latency moe kv rl):
#   the device tool allows 10 minutes per command, less than all five together take.
#
# Carry: .gpu-carry (ferry-bench built with CUDA as .gpu-carry/bin/ferry-bench, and the
# lat-* binaries of scripts/latency_gpu.sh) and .moe-carry (scripts/gpu_moe.sh carry).
#   1. NVLink domain GPU 0 -> GPU 1: the sweep of docs/PERFORMANCE.md ("ferry-bench with
#      GPU memory": single, paged 4 KiB and 64 KiB, imm) against cudaMemcpyPeerAsync and
#      the gather-kernel probe, which ferry-bench --gpu measures in the same run; the same
#      through shm + FI_HMEM; then the GPU -> proxy -> engine -> peer GPU chain across the
#      two GPUs (scripts/latency_gpu.sh with CHAIN_ARGS="--gpu-b 1").
#   2. MoE EP N (scripts/gpu_moe.sh multi N): decode fp8/bf16 and prefill, one rank per
#      GPU, against NCCL all_to_all_single of the same payloads in the same job.
#   3. KV (scripts/gpu_kv.sh run): prefiller on GPU 0, decoder on GPU 1, the e2e model run
#      and its TTFT against colocated prefill on GPU 0. Carry .kv-carry.
#   4. RL (scripts/gpu_rl.sh): trainers on GPU 0, inference ranks on GPU 1 (N = 2), or one
#      rank per GPU (N >= 4) with the NCCL rank-0 gather + broadcast baseline beside the
#      gloo one; copy ceiling GPU 0 -> the first inference GPU. Carry .rl-carry.
# Carry: at most 8 paths; the four above fit. A section whose carry is missing is skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:?usage: $0 N [OUT]}
OUT=${2:-${OUT:-/tmp/multi-out}}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.gpu-carry/lib:${LD_LIBRARY_PATH:-}
{ date -u; nproc; nvidia-smi -L; nvidia-smi topo -m; } > "$OUT/machine.txt" 2>&1
B=$PWD/.gpu-carry/bin
SECTIONS=" ${SECTIONS:-nvlink latency moe kv rl} "
want() { [[ "$SECTIONS" == *" $1 "* ]]; }
want nvlink && for p in nvlink shm; do
  echo "== ferry-bench $p --gpu 0,1" >> "$OUT/nvlink.txt"
  timeout 240 "$B/ferry-bench" --provider $p --gpu 0,1 --verify --seconds 0.5 --poll busy \
    --cpu 2,4,6 --server-cpu 8,10,12 >> "$OUT/nvlink.txt" 2>&1
  echo "rc=$?" >> "$OUT/nvlink.txt"
done
if want latency; then
  CHAIN_ARGS="--gpu-b 1" OUT="$OUT/latency" bash scripts/latency_gpu.sh
  echo "latency rc=$?" >> "$OUT/machine.txt"
fi
if want moe; then
  bash scripts/gpu_moe.sh multi "$N" "$OUT/moe"
  echo "moe rc=$?" >> "$OUT/machine.txt"
fi
if ! want kv; then
  :
elif [ -d .kv-carry ]; then
  E2E_ARGS="--prefill-gpu 0 --decode-gpu 1" SKIP_BENCH=1 OUT="$OUT/kv" bash scripts/gpu_kv.sh run
  echo "kv rc=$?" >> "$OUT/machine.txt"
else
  echo "kv skipped: no .kv-carry" >> "$OUT/machine.txt"
fi
if ! want rl; then
  :
elif [ -d .rl-carry ]; then
  if [ "$N" -ge 4 ]; then RL_ARGS="--gpus 0,1,2,3 --baselines gloo,nccl"; else RL_ARGS="--gpus 0,0,1,1"; fi
  RL_RUNS="${RL_RUNS:-offload resident}" RL_BENCH_ARGS="$RL_ARGS" OUT="$OUT/rl" bash scripts/gpu_rl.sh
  echo "rl rc=$?" >> "$OUT/machine.txt"
else
  echo "rl skipped: no .rl-carry" >> "$OUT/machine.txt"
fi
