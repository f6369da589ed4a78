#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang, ASan+UBSan) into build-fuzz/ and runs
# each one for a bounded time and/or number of executions, starting from the seed
# corpus in fuzz/corpus/<target>/. Exits non-zero when a build fails or any target
# crashes, leaks, times out or breaks a property; prints execs per target.
#
#   bash scripts/fuzz.sh [seconds_per_target] [runs]
#     seconds_per_target  -max_total_time per target (default 20; 0 = no time bound)
#     runs                -runs per target (default: unbounded, the time bound applies)
#   bash scripts/fuzz.sh 0 10000000      # a long run: ten million executions per target
#
# Environment: BUILD_DIR (default build-fuzz), JOBS (default 2), FUZZ_TARGETS (space
# separated subset), FUZZ_ARGS (extra libFuzzer flags). New inputs libFuzzer finds go
# to $BUILD_DIR/corpus/<target>/ (the checked-in seeds are never modified); crash
# inputs to $BUILD_DIR/artifacts/<target>/, replay one with
#   $BUILD_DIR/fuzz/<target> $BUILD_DIR/artifacts/<target>/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

SECONDS_PER_TARGET=${1:-20}
RUNS=${2:-}
BUILD_DIR=${BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-2}
CC_BIN=${FUZZ_CC:-clang}
CXX_BIN=${FUZZ_CXX:-clang++}

if ! command -v "$CXX_BIN" >/dev/null; then
  echo "fuzz: $CXX_BIN not found (Debian: apt-get install clang libclang-rt-14-dev)" >&2
  exit 1
fi
# libFuzzer's runtime ships in libclang-rt-*-dev, which clang only recommends.
if ! "$CXX_BIN" -print-file-name=libclang_rt.fuzzer-x86_64.a | grep -q /; then
  echo "fuzz: libFuzzer runtime missing (Debian: apt-get install libclang-rt-14-dev)" >&2
  exit 1
fi

start=$(date +%s)
CC=$CC_BIN CXX=$CXX_BIN cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFERRY_BUILD_FUZZ=ON -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_TOOLS=OFF -DFERRY_BUILD_PYTHON=OFF \
  -DFERRY_WERROR=OFF -DFERRY_SANITIZE=address,undefined >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target fuzz_targets
built=$(date +%s)
echo "fuzz: built in $((built - start)) s"

if [ -n "${FUZZ_TARGETS:-}" ]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
else
  targets=()
  for src in fuzz/fuzz_*.cpp; do
    t=$(basename "$src" .cpp)
    [ -x "$BUILD_DIR/fuzz/$t" ] && targets+=("$t")
  done
fi

if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: no fuzz targets were built (is $CXX_BIN clang?)" >&2
  exit 1
fi

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

limits=()
[ "$SECONDS_PER_TARGET" != 0 ] && limits+=("-max_total_time=$SECONDS_PER_TARGET")
[ -n "$RUNS" ] && limits+=("-runs=$RUNS")

failed=()
summary=()
for t in "${targets[@]}"; do
  work="$BUILD_DIR/corpus/$t"
  art="$BUILD_DIR/artifacts/$t"
  log="$BUILD_DIR/logs/$t.log"
  mkdir -p "$work" "$art" "$(dirname "$log")" "fuzz/corpus/$t"
  t0=$(date +%s)
  rc=0
  # -timeout: one input taking over 10 s is a bug (every decoder is linear);
  # -rss_limit_mb: the decoders never need much memory; -print_final_stats: execs.
  # shellcheck disable=SC2086
  "$BUILD_DIR/fuzz/$t" "$work" "fuzz/corpus/$t" "${limits[@]}" -timeout=10 -rss_limit_mb=2048 \
    -max_len=4096 -print_final_stats=1 -artifact_prefix="$art/" ${FUZZ_ARGS:-} >"$log" 2>&1 || rc=$?
  t1=$(date +%s)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  line=$(printf '%-22s %12s execs  %8s exec/s  %5s s  %-10s rc=%s' "$t" "${execs:-?}" "${rate:-?}" \
    "$((t1 - t0))" "${cov:-}" "$rc")
  echo "fuzz: $line"
  summary+=("$line")
  if [ "$rc" != 0 ]; then
    failed+=("$t")
    echo "---- $t failed; last lines of $log:" >&2
    tail -n 60 "$log" >&2
    ls -1 "$art" >&2 || true
  fi
done

echo "fuzz: summary (seconds_per_target=$SECONDS_PER_TARGET runs=${RUNS:-unbounded}, total $(( $(date +%s) - start )) s)"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets clean"
