#!/usr/bin/env bash
# ferry.rl on the GPU machine (docs/RL.md, "On the H200"): the real pipeline on one GPU
# (python -m ferry.rl.gpu_bench), the ferry.rl tests with torch present, and the planner
# with its posting cost measured on that host's CPUs. Results go to $OUT (default
# ./rl-gpu-out). The package comes from a carry folder (default .rl-carry, built here
# by the recipe in docs/RL.md): the installed ferry of a python 3.12 build, with
# ferry/rl from the working tree, ml_dtypes, and the libraries the machine lacks.
# RL_BENCH_ARGS: more gpu_bench options (scripts/gpu_multi.sh: --gpus, --baselines).
# RL_RUNS, RL_PACK, RL_SKIP_PYTEST, RL_SKIP_PLAN: below.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/mps.sh
OUT=${OUT:-$PWD/rl-gpu-out}
CARRY=${RL_CARRY:-$PWD/.rl-carry}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$CARRY:$CARRY/site LD_LIBRARY_PATH=$CARRY/lib:${LD_LIBRARY_PATH:-} \
       FERRY_LOG=warn PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$OUT/gpu.txt"
"$PY" -c "import sys, torch, numpy, ferry; print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, ferry.__file__)" | tee -a "$OUT/gpu.txt"
rc=0
# RL_RUNS: configurations of the bench, each into $OUT/<name>: offload (the shards in
# pinned host memory, FSDP2's CPU offload), resident (in GPU memory), and either with
# -gather (every job gathered on one owner, the seed's full_tensor way) for the A/B;
# fsdp2 (fsdp2-resident): the shards of transformers' Qwen3 under fully_shard; a
# "-graphs" suffix (before "-mps") replays the first step's device work as CUDA graphs.
# A "-mps" suffix runs that configuration under MPS (the four processes' kernels share
# the GPU instead of taking turns as separate contexts). A "-mapped" suffix (before "-mps")
# makes the trainers store into the inference weights mapped into their processes
# (--writes mapped); without it the writes go through the engine (--writes engine).
for run in ${RL_RUNS:-offload}; do
  mps="" graphs="" writes="--writes engine"
  case $run in *-mps) mps=1 ;; esac
  base=${run%-mps}
  case $base in *-mapped) writes="--writes mapped"; base=${base%-mapped} ;; esac
  case $base in *-graphs) graphs="--graphs"; base=${base%-graphs} ;; esac
  case $base in
    offload) args="" ;; offload-gather) args="--gather" ;;
    resident) args="--resident" ;; resident-gather) args="--resident --gather" ;;
    fsdp2) args="--fsdp2" ;; fsdp2-resident) args="--fsdp2 --resident" ;;
    *) echo "unknown RL_RUNS entry $run" >&2; rc=1; continue ;;
  esac
  args="$args $graphs $writes"
  mkdir -p "$OUT/$run"
  echo "== $run: gpu_bench $args" | tee -a "$OUT/gpu-bench.txt"
  if [ -n "$mps" ]; then
    mps_start || { echo "$run: MPS did not start" | tee -a "$OUT/gpu-bench.txt"; rc=1; continue; }
  fi
  # the bench kills its rank processes at --deadline, before timeout(1) kills it (its
  # children would hold the pipe open)
  timeout ${RL_BENCH_S:-230} "$PY" -m ferry.rl.gpu_bench --out "$OUT/$run" --steps 3 --deadline $(( ${RL_BENCH_S:-230} - 20 )) \
    --watermark-mb ${RL_WATERMARK_MB:-512} $args ${RL_BENCH_ARGS:-} > "$OUT/$run/bench.log" 2>&1 || rc=1
  tail -c 20000 "$OUT/$run/bench.log" | tee -a "$OUT/gpu-bench.txt"
  if [ -n "$mps" ]; then
    mps_stop
  fi
done
first=$OUT/$(set -- ${RL_RUNS:-offload}; echo "$1")
if [ -z "${RL_SKIP_PYTEST:-}" ]; then
  timeout ${RL_PYTEST_S:-80} "$PY" -m pytest tests/python/rl -q -rs -m "not gpu" -p no:cacheprovider 2>&1 \
    | tail -c 8000 | tee "$OUT/pytest-rl.txt" || rc=1
fi
CAL=$OUT/calibration.json
"$PY" - "$first" > "$CAL" <<'PY' || echo '{}' > "$CAL"
import json, sys
s = json.load(open(sys.argv[1] + "/rl-gpu-summary.json"))["summary"]
q = s.get("quant_triton_GBps") or s.get("quant_GBps")  # the kernel the pipeline runs
print(json.dumps({"quant_GBps": q} if q else {}))
PY
if [ -z "${RL_SKIP_PLAN:-}" ]; then
  timeout ${RL_PLAN_S:-60} "$PY" -m ferry.rl.plan --model Kimi-K2 --measure-posting --calibration "$CAL" \
    --json "$OUT/plan-kimi.json" 2>&1 | tee "$OUT/plan.txt" || rc=1
fi
# RL_PACK=1: everything in one archive (the device tool returns few files), the
# summaries beside it
if [ -n "${RL_PACK:-}" ]; then
  for run in ${RL_RUNS:-offload}; do cp "$OUT/$run/rl-gpu-summary.json" "$OUT/summary-$run.json" 2>/dev/null; done
  tar -C "$OUT" -czf /tmp/rl-all.tar.gz --exclude='summary-*' . && mv /tmp/rl-all.tar.gz "$OUT/rl-all.tar.gz"
  find "$OUT" -mindepth 1 -maxdepth 1 ! -name 'summary-*' ! -name rl-all.tar.gz ! -name gpu-bench.txt -exec rm -rf {} +
fi
exit $rc
