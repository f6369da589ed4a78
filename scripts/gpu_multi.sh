#!/usr/bin/env bash
# The runs that need several GPUs of one host (the multi-GPU issue; docs/PERFORMANCE.md,
# docs/MOE.md), on the device tool's nvidia-h200-x2 (or -x4, -x8) kind:
#
#   scripts/gpu_multi.sh N [OUT]    N = GPUs of the machine
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
# Not here yet: the KV run with the prefiller on GPU 0 and the decoder on GPU 1, and RL
# with trainers and inference ranks on different GPUs against an NCCL rank-0 broadcast
# (python -m ferry.kv.e2e and python -m ferry.rl.gpu_bench take no device options).
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:?usage: $0 N [OUT]}
OUT=${2:-${OUT:-/tmp/multi-out}}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.gpu-carry/lib:${LD_LIBRARY_PATH:-}
{ date -u; nproc; nvidia-smi -L; nvidia-smi topo -m; } > "$OUT/machine.txt" 2>&1
B=$PWD/.gpu-carry/bin
for p in nvlink shm; do
  echo "== ferry-bench $p --gpu 0,1" >> "$OUT/nvlink.txt"
  timeout 240 "$B/ferry-bench" --provider $p --gpu 0,1 --verify --seconds 0.5 --poll busy \
    --cpu 2,4,6 --server-cpu 8,10,12 >> "$OUT/nvlink.txt" 2>&1
  echo "rc=$?" >> "$OUT/nvlink.txt"
done
CHAIN_ARGS="--gpu-b 1" OUT="$OUT/latency" bash scripts/latency_gpu.sh
echo "latency rc=$?" >> "$OUT/machine.txt"
bash scripts/gpu_moe.sh multi "$N" "$OUT/moe"
echo "moe rc=$?" >> "$OUT/machine.txt"
