#!/usr/bin/env bash
# One call on the lent H200 that re-checks, after the last changes of ferry.rl, ferry.moe,
# the statistics and the wake-up path: the fp8 quantisation on CUDA against NumPy and the
# RL pipeline (bit-exact weights), the MoE GPU tests, the cost of statistics and tracing on
# the host's pinned CPUs (ferry-bench builds with FERRY_STATS=OFF / ON / ON + trace, in
# turn), and the GPU signalling chain with both processes under MPS (kernels of two
# processes share the GPU instead of taking turns by time slice).
# Carries: .moe-carry (scripts/gpu_moe.sh carry, plus ml_dtypes in .moe-carry/site) and
# .gpu-carry (bench-obs, bench-obs-nostats, lat-chain; libspdlog/libfmt/libnuma).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
[ -x /opt/torch/.venv/bin/python3 ] && export PATH=/opt/torch/.venv/bin:$PATH
C=$PWD/.moe-carry
B=$PWD/.gpu-carry/bin
{ date -u; nproc; nvidia-smi -L; } > "$O/machine.txt" 2>&1
# 1. RL: quantisation tests with torch present (CPU and CUDA), then the pipeline run
( export PYTHONPATH=$C:$C/site LD_LIBRARY_PATH=$C/lib:${LD_LIBRARY_PATH:-} FERRY_LOG=warn PYTHONUNBUFFERED=1
  timeout 40 python3 -m pytest tests/python/rl/test_rl_quant.py -q -rs -p no:cacheprovider > "$O/rl-quant.txt" 2>&1
  echo "rl quant rc=$?" >> "$O/summary.txt"
  mkdir -p "$O/rl"
  timeout 90 python3 -m ferry.rl.gpu_bench --out "$O/rl" --steps 2 --deadline 80 --watermark-mb 512 \
    > "$O/rl-bench.txt" 2>&1
  echo "rl bench rc=$?" >> "$O/summary.txt" )
# 2. MoE GPU tests (20 graph replays at EP=4)
( export PYTHONPATH=$C LD_LIBRARY_PATH=$C/lib:${LD_LIBRARY_PATH:-} FERRY_LOG=warn PYTHONUNBUFFERED=1
  timeout 30 $C/bin/moe_gpu_tests > "$O/moe-cpp.txt" 2>&1; echo "moe gpu C++ rc=$?" >> "$O/summary.txt"
  FERRY_MOE_REPLAYS=20 FERRY_MOE_REPLAYS_EP2=10 timeout 130 python3 -m pytest -v -p no:cacheprovider \
    tests/python/moe > "$O/moe-pytest.txt" 2>&1
  echo "moe pytest rc=$?" >> "$O/summary.txt" )
# 3. statistics cost: off / on / trace in turn, busy polling on pinned CPUs
export LD_LIBRARY_PATH=$PWD/.gpu-carry/lib:${LD_LIBRARY_PATH:-}
for r in 1 2 3; do for v in off on trace; do
  bin=$B/bench-obs; [ $v = off ] && bin=$B/bench-obs-nostats
  env=(); [ $v = trace ] && env=(FERRY_TRACE=/tmp/obs-trace.json)
  echo "== round $r $v" >> "$O/obs.txt"
  env "${env[@]}" timeout 25 "$bin" --provider "tcp;ofi_rxm" --poll busy --cpu 2,4,6 --server-cpu 8,10,12 \
    --only paged,imm --page-counts 100 --seconds 0.5 --no-raw >> "$O/obs.txt" 2>&1
done; done
echo "obs done" >> "$O/summary.txt"
# 4. the chain under MPS
. scripts/mps.sh
if mps_start "$O/mps.txt"; then
  for p in nvlink shm; do
    echo "== chain $p imm busy (MPS)" >> "$O/chain.txt"
    timeout 25 $B/lat-chain --provider $p --op imm --poll busy --iters 2000 >> "$O/chain.txt" 2>&1
    echo "rc=$?" >> "$O/chain.txt"
  done
  mps_stop
else
  echo "MPS did not start" >> "$O/summary.txt"
fi
echo "all done" >> "$O/summary.txt"
