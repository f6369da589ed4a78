#!/bin/bash
# ferry.kv on the GPU machine (docs/KV.md, "GPU end to end").
#
#   bash scripts/gpu_kv.sh carry   # here: build the Python 3.12 package into .kv-carry
#   bash scripts/gpu_kv.sh run     # there (device tool, kind nvidia-h200, carry [".kv-carry"])
#
# carry: the package built against the pyenv 3.12 that matches the machine's 3.12 (with
# CUDA, so the nvlink provider is in), plus the three shared libraries the machine lacks
# (docs/PYTHON.md, "On the H200 machine"); .kv-carry is ignored through .git/info/exclude.
# run: the kv tests (CPU ones and the GPU e2e), then python -m ferry.kv.e2e; outputs in $OUT.
# E2E_ARGS: more e2e options (scripts/gpu_multi.sh: --prefill-gpu 0 --decode-gpu 1).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
carry)
  PY=${PY:-/root/.pyenv/versions/3.12.1/bin/python3.12}
  V=build/venv-kv312
  [ -x $V/bin/python ] || "$PY" -m venv $V
  $V/bin/pip install -q nanobind scikit-build-core numpy pytest
  CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-2} $V/bin/pip install -q --no-build-isolation \
    -Cbuild-dir=build/py-kv312 .
  D=$($V/bin/python -c "import ferry, os; print(os.path.dirname(ferry.__file__))")
  rm -rf .kv-carry && mkdir -p .kv-carry/lib
  cp -a "$D" .kv-carry/ferry
  find .kv-carry -name __pycache__ -prune -exec rm -rf {} +
  strip --strip-debug .kv-carry/ferry/_ferry*.so
  G=${GPU_CARRY:-.gpu-carry}
  cp -a $G/lib/libspdlog.so.1.10* $G/lib/libfmt.so.9* \
        $G/lib/libnuma.so.1* .kv-carry/lib/
  X=$(git rev-parse --git-common-dir)/info/exclude
  grep -qx '/.kv-carry/' "$X" 2>/dev/null || echo /.kv-carry/ >> "$X"
  du -sh .kv-carry
  ;;
run)
  export PYTHONPATH=$PWD/.kv-carry LD_LIBRARY_PATH=$PWD/.kv-carry/lib:${LD_LIBRARY_PATH:-} \
         FERRY_LOG=warn PYTHONUNBUFFERED=1
  OUT=${OUT:-/tmp/kv-out}
  mkdir -p "$OUT"
  nvidia-smi -L
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  # MPS=1: both processes' kernels share the GPU through MPS instead of taking turns as
  # separate contexts (closer to two GPUs: neither waits for the other's time slice).
  if [ -n "${MPS:-}" ]; then
    . scripts/mps.sh
    mps_start && trap mps_stop EXIT
  fi
  timeout -k 10 "${E2E_S:-330}" python3 -m ferry.kv.e2e --lengths "${LENGTHS:-1000,4000,16000}" --reps "${REPS:-5}" \
    --out "$OUT/kv_e2e.json" --trace-dir "$OUT/kv-traces" ${E2E_ARGS:-} 2>&1 | tee "$OUT/kv_e2e.txt" || true
  # E2E2_ARGS: a second run with these options (e.g. "--poll adaptive", "--deterministic");
  # E2E2_ENV: environment settings for it (FERRY_NVLINK_COPY_ENGINE_MIN=262144).
  if [ -n "${E2E2_ARGS:-}${E2E2_ENV:-}" ]; then
    env ${E2E2_ENV:-} timeout -k 10 "${E2E2_S:-200}" python3 -m ferry.kv.e2e --lengths "${LENGTHS:-1000,4000,16000}" \
      --reps "${REPS:-5}" --out "$OUT/kv_e2e_2.json" --trace-dir "$OUT/kv-traces-2" ${E2E_ARGS:-} \
      ${E2E2_ARGS:-} 2>&1 | tee "$OUT/kv_e2e_2.txt" || true
  fi
  # CPU posting cost and whole-request throughput on the host's cores (shm, same run).
  if [ -z "${SKIP_BENCH:-}" ]; then
    timeout "${BENCH_S:-100}" python3 -m ferry.kv.bench --provider shm --reps 3 \
      2>&1 | tee "$OUT/kv_bench_shm.txt" || true
  fi
  ;;
*)
  echo "usage: $0 carry|run" >&2
  exit 2
  ;;
esac
