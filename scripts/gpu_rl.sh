#!/usr/bin/env bash
# ferry.rl on the GPU machine (docs/RL.md, "On the H200"): the real pipeline on one GPU
# (python -m ferry.rl.gpu_bench), the ferry.rl tests with torch present, and the planner
# with its posting cost measured on that host's CPUs. Results go to $OUT (default
# ./rl-gpu-out). The package comes from a carry folder (default .rl-carry, built here
# by the recipe in docs/RL.md): the installed ferry of a python 3.12 build, with
# ferry/rl from the working tree, ml_dtypes, and the libraries the machine lacks.
# RL_BENCH_ARGS: more gpu_bench options (scripts/gpu_multi.sh: --gpus, --baselines).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/rl-gpu-out}
CARRY=${RL_CARRY:-$PWD/.rl-carry}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$CARRY:$CARRY/site LD_LIBRARY_PATH=$CARRY/lib:${LD_LIBRARY_PATH:-} \
       FERRY_LOG=warn PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$OUT/gpu.txt"
"$PY" -c "import sys, torch, numpy, ferry; print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, ferry.__file__)" | tee -a "$OUT/gpu.txt"
rc=0
timeout ${RL_BENCH_S:-230} "$PY" -m ferry.rl.gpu_bench --out "$OUT" --steps 3 --deadline 210 \
  --watermark-mb ${RL_WATERMARK_MB:-512} ${RL_BENCH_ARGS:-} 2>&1 | tail -c 20000 | tee "$OUT/gpu-bench.txt" || rc=1
timeout ${RL_PYTEST_S:-80} "$PY" -m pytest tests/python/rl -q -rs -m "not gpu" -p no:cacheprovider 2>&1 \
  | tail -c 8000 | tee "$OUT/pytest-rl.txt" || rc=1
CAL=$OUT/calibration.json
"$PY" - "$OUT" > "$CAL" <<'PY' || echo '{}' > "$CAL"
import json, sys
s = json.load(open(sys.argv[1] + "/rl-gpu-summary.json"))["summary"]
print(json.dumps({"quant_GBps": s["quant_GBps"]} if s.get("quant_GBps") else {}))
PY
timeout ${RL_PLAN_S:-60} "$PY" -m ferry.rl.plan --model Kimi-K2 --measure-posting --calibration "$CAL" \
  --json "$OUT/plan-kimi.json" 2>&1 | tee "$OUT/plan.txt" || rc=1
exit $rc
