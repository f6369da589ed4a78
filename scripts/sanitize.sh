#!/usr/bin/env bash
# Sanitizer builds of the whole test suite (GCC), see docs/RELIABILITY.md "Sanitizers".
#
#   bash scripts/sanitize.sh asan   # build-asan/: -fsanitize=address,undefined, then ctest
#   bash scripts/sanitize.sh tsan   # build-tsan/: -fsanitize=thread, then ctest
#
# Environment: JOBS (build and ctest parallelism, default 2), BUILD_DIR (default
# build-asan / build-tsan), TARGETS (build only these CMake targets, e.g.
# "unit_tests property_tests"; default all; tests of binaries not built are then
# left out of ctest only if CTEST_ARGS selects by label or name), CTEST_ARGS
# (extra ctest arguments, e.g. "-L unit" or "-R Sharding"), SANITIZER_EXTRA
# (appended to ASAN_OPTIONS / TSAN_OPTIONS, for investigation only, e.g.
# SANITIZER_EXTRA=new_delete_type_mismatch=0 to look past one known report).
# Exits non-zero when the build fails or any test fails, which includes every
# sanitizer report (the runtimes are set to stop at the first one).
#
# Suppressions (scripts/*.supp) are for third-party code only (libfabric and its
# providers), never for ferry code: each entry says why it is there. Test-harness
# accesses that TSan cannot order are annotated in the harness instead
# (tests/support/tsan.h).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

variant=${1:-}
case "$variant" in
  asan)
    sanitize="address,undefined"
    BUILD_DIR=${BUILD_DIR:-build-asan}
    # detect_leaks: LeakSanitizer at exit of every test process (forked peers leave
    # through _exit and are not leak-checked). abort_on_error: a report kills the
    # process with SIGABRT, so CTest and the parent of a forked peer both see it.
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1${SANITIZER_EXTRA:+:$SANITIZER_EXTRA}"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    export LSAN_OPTIONS="suppressions=$ROOT/scripts/lsan.supp:print_suppressions=0"
    # PeerKillTest restarts its peer 100 times by default; a cycle under ASan takes
    # several times longer. 50 cycles still cross every kill and restart path under
    # the sanitizer, well inside the test's limit; the plain build runs 100.
    export FERRY_PEER_KILL_CYCLES=${FERRY_PEER_KILL_CYCLES:-50}
    ;;
  tsan)
    sanitize="thread"
    BUILD_DIR=${BUILD_DIR:-build-tsan}
    # history_size=7: the largest; without it the earlier access of a race is
    # often "[failed to restore the stack]" (busy worker threads overwrite
    # their history quickly), which leaves a report without its second stack.
    export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=7 suppressions=$ROOT/scripts/tsan.supp print_suppressions=0${SANITIZER_EXTRA:+ $SANITIZER_EXTRA}"
    ;;
  *)
    echo "usage: $0 asan|tsan" >&2
    exit 2
    ;;
esac

JOBS=${JOBS:-2}
start=$(date +%s)
echo "sanitize: $variant: configuring $BUILD_DIR (GCC, -fsanitize=$sanitize)"
CC=${SANITIZE_CC:-gcc} CXX=${SANITIZE_CXX:-g++} \
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFERRY_WERROR=OFF -DFERRY_SANITIZE="$sanitize" -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_TOOLS=OFF \
  -DFERRY_BUILD_BENCH=OFF -DFERRY_CUDA=OFF >/dev/null
# Test discovery (gtest_discover_tests) runs the test binaries at build time, so
# the sanitizer options above are already in force here.
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" -j "$JOBS" ${TARGETS:+--target $TARGETS}
built=$(date +%s)
echo "sanitize: $variant: built in $((built - start)) s"

rc=0
# -LE install: install.FindPackageConsumerBuildsAndRuns links a consumer built
# without -fsanitize against the sanitized static libferry.a, which cannot link
# (undefined __asan_* / __ubsan_* / __tsan_*). It is covered by scripts/test.sh.
# shellcheck disable=SC2086
ctest --test-dir "$BUILD_DIR" -j "$JOBS" --output-on-failure --timeout 900 -LE install ${CTEST_ARGS:-} || rc=$?
end=$(date +%s)
echo "sanitize: $variant: tests took $((end - built)) s, total $((end - start)) s, ctest exit $rc"
exit "$rc"
