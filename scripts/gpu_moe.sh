#!/usr/bin/env bash
# MoE on the GPU machine (docs/MOE.md). Two halves:
#   scripts/gpu_moe.sh carry        here: build the Python 3.12 package and the
#                                   unit tests into .moe-carry/ (ignored by git)
#   scripts/gpu_moe.sh run [quick|full] [OUT]   there (device tool, carry: [".moe-carry"]):
#                                   unit tests, GPU tests, decode and prefill benchmarks
#   scripts/gpu_moe.sh multi N [OUT] there, on a machine of N GPUs (issue: multi-GPU runs):
#                                   EP N, one rank per GPU, one NVLink node; decode (128
#                                   tokens, hidden 7168, top-8, 256 experts) in fp8 and
#                                   bf16, prefill (4096 tokens) in fp8; each with NCCL
#                                   all_to_all_single of the same payloads in the same job
# quick: 20 graph replays and short benchmarks; full: 1000 replays, 2000 iterations.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
carry)
  set -e
  PY=${PY:-/root/.pyenv/versions/3.12.1/bin/python3.12}
  [ -x build/venv-moe/bin/python ] || "$PY" -m venv build/venv-moe
  build/venv-moe/bin/pip install -q nanobind scikit-build-core numpy pytest
  build/venv-moe/bin/pip install -q --no-build-isolation -Cbuild-dir=build/py-moe -e .
  [ -d build-moe ] || cmake -S . -B build-moe -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_WERROR=ON
  cmake --build build-moe --target moe_unit_tests -j2
  rm -rf .moe-carry && mkdir -p .moe-carry/lib .moe-carry/bin
  cp -a python/ferry .moe-carry/ferry && find .moe-carry/ferry -name __pycache__ -prune -exec rm -rf {} +
  cp build/venv-moe/lib/python3.12/site-packages/ferry/_ferry*.so .moe-carry/ferry/
  strip --strip-debug .moe-carry/ferry/_ferry*.so
  cmake --build build-moe --target moe_gpu_tests -j2
  for t in moe_unit_tests moe_gpu_tests; do cp build-moe/tests/$t .moe-carry/bin/ && strip .moe-carry/bin/$t; done
  cp -a .gpu-carry/lib/libspdlog.so.1.10* .gpu-carry/lib/libfmt.so.9* .gpu-carry/lib/libnuma.so.1* .moe-carry/lib/
  grep -qx '/.moe-carry/' .git/info/exclude || echo /.moe-carry/ >> .git/info/exclude
  PYTHONPATH=$PWD/.moe-carry build/venv-moe/bin/python -S -c 'import ferry.moe, ferry.moe.bench; print("carry imports", ferry.__file__)'
  du -sh .moe-carry
  ;;
run)
  MODE=${2:-quick}
  OUT=${3:-${OUT:-/tmp/moe-out}}
  mkdir -p "$OUT"
  [ -x /opt/torch/.venv/bin/python3 ] && export PATH=/opt/torch/.venv/bin:$PATH
  export PYTHONPATH=$PWD/.moe-carry LD_LIBRARY_PATH=$PWD/.moe-carry/lib:${LD_LIBRARY_PATH:-} \
         FERRY_LOG=warn PYTHONUNBUFFERED=1
  if [ "$MODE" = full ]; then REPLAYS=1000 ITERS=${ITERS:-1000}; else REPLAYS=20 ITERS=${ITERS:-300}; fi
  { nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$OUT/summary.txt" 2>&1
  timeout 120 .moe-carry/bin/moe_unit_tests > "$OUT/unit.log" 2>&1; echo "unit rc=$?" | tee -a "$OUT/summary.txt"
  timeout 60 .moe-carry/bin/moe_gpu_tests >> "$OUT/unit.log" 2>&1; echo "gpu C++ rc=$?" | tee -a "$OUT/summary.txt"
  FERRY_MOE_REPLAYS=$REPLAYS FERRY_MOE_REPLAYS_EP2=20 timeout ${PYTEST_TIMEOUT:-200} python3 -m pytest -v -s -p no:cacheprovider \
    tests/python/moe > "$OUT/pytest.log" 2>&1; echo "pytest rc=$?" | tee -a "$OUT/summary.txt"
  for m in nvlink proxy; do
    timeout ${BENCH_TIMEOUT:-60} python3 -m ferry.moe.bench --world 4 --mode $m --tokens 128 --iters $ITERS \
      --output "$OUT/bench-decode-$m.json" >> "$OUT/bench.log" 2>&1
    echo "bench decode $m rc=$?" | tee -a "$OUT/summary.txt"
  done
  timeout ${BENCH_TIMEOUT:-60} python3 -m ferry.moe.bench --world 4 --mode nvlink --tokens 4096 \
    --iters $((ITERS / 10)) --warmup 5 --output "$OUT/bench-prefill-nvlink.json" \
    >> "$OUT/bench.log" 2>&1
  echo "bench prefill nvlink rc=$?" | tee -a "$OUT/summary.txt"
  ;;
multi)
  N=${2:?usage: $0 multi N [OUT]}
  OUT=${3:-${OUT:-/tmp/moe-multi-out}}
  mkdir -p "$OUT"
  [ -x /opt/torch/.venv/bin/python3 ] && export PATH=/opt/torch/.venv/bin:$PATH
  export PYTHONPATH=$PWD/.moe-carry LD_LIBRARY_PATH=$PWD/.moe-carry/lib:${LD_LIBRARY_PATH:-} \
         FERRY_LOG=warn PYTHONUNBUFFERED=1
  ITERS=${ITERS:-1000}
  { nvidia-smi -L; nvidia-smi topo -m; python3 -c 'import torch; print("torch", torch.__version__)'; } \
    > "$OUT/summary.txt" 2>&1
  for dt in float8_e4m3fn bfloat16; do
    timeout ${BENCH_TIMEOUT:-180} python3 -m ferry.moe.bench --world "$N" --gpus "$N" --mode nvlink \
      --tokens 128 --in-dtype $dt --iters $ITERS --output "$OUT/bench-ep$N-decode-$dt.json" \
      >> "$OUT/bench.log" 2>&1
    echo "ep$N decode $dt rc=$?" | tee -a "$OUT/summary.txt"
  done
  timeout ${BENCH_TIMEOUT:-180} python3 -m ferry.moe.bench --world "$N" --gpus "$N" --mode nvlink \
    --tokens 4096 --iters $((ITERS / 10)) --warmup 5 --output "$OUT/bench-ep$N-prefill.json" \
    >> "$OUT/bench.log" 2>&1
  echo "ep$N prefill rc=$?" | tee -a "$OUT/summary.txt"
  ;;
*)
  echo "usage: $0 carry | run [quick|full] [OUT] | multi N [OUT]" >&2
  exit 2
  ;;
esac
