#!/usr/bin/env bash
# Release build + the full loopback sweep of ferry-bench (tcp;ofi_rxm on lo,
# raw libfabric baseline in the same run), written to docs/bench-loopback.json
# and plotted to docs/bench-loopback.png. Extra arguments go to ferry-bench
# (e.g. --verify, --quick, --only single). Runs submit_path_bench too when
# bench/ is part of the build (FERRY_BUILD_BENCH).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-release}
OUT=${OUT:-docs/bench-loopback}

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_BUILD_TESTS=OFF >/dev/null
targets=(ferry-bench)
if ninja -C "$BUILD_DIR" -t targets all | grep -q '^submit_path_bench:'; then
  targets+=(submit_path_bench)
fi
# Shared 2-core machines: keep the build from starving everyone else.
cmake --build "$BUILD_DIR" -j "${JOBS:-2}" --target "${targets[@]}"

# matplotlib comes from PyPI into a private venv (.cache/ is git-ignored).
VENV=${VENV:-.cache/bench-venv}
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet matplotlib
fi

echo "== $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) CPUs," \
  "$(lscpu | grep 'Model name' | sed 's/Model name: *//'), $(uname -r)"
"$BUILD_DIR/tools/ferry-bench/ferry-bench" --provider 'tcp;ofi_rxm' --json "$OUT.json" "$@"
"$VENV/bin/python" bench/plot.py "$OUT.json" -o "$OUT.png"

if [[ -x "$BUILD_DIR/bench/submit_path_bench" ]]; then
  "$BUILD_DIR/bench/submit_path_bench" --benchmark_min_time=0.5
fi
