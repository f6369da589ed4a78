#!/usr/bin/env bash
# The stop-race stress of docs/RELIABILITY.md: PROCS copies of
# StopRace.EveryOnDoneRunsExactlyOnceAndLateCallsThrowFailedPrecondition at a
# time, each 1 000 engine stops, repeated for SECONDS. Failures are rare (about
# one in 100 000 stops before the fixes of 2026-12-05), so this wants many CPUs.
#   scripts/stop_race.sh [SECONDS=300] [PROCS=$(nproc)] [OUT=stop-race-out]
# Prints runs, failures and "events were still queued" lines per copy; failing
# and leftover logs stay under OUT. BIN (default build/tests/hardening_tests)
# picks the binary, e.g. a carried one on another machine.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
procs=${2:-$(nproc)}
out=${3:-stop-race-out}
bin=${BIN:-build/tests/hardening_tests}
[[ -x $bin ]] || { echo "no $bin: build the tests first (scripts/build.sh)" >&2; exit 2; }
mkdir -p "$out"
end=$(($(date +%s) + seconds))
copy() {
  local i=$1 runs=0 fails=0 left=0 log="$out/copy$1.log"
  while (($(date +%s) < end)); do
    runs=$((runs + 1))
    if ! FERRY_LOG=warn FERRY_STOP_RACE_CYCLES=1000 timeout 300 "$bin" \
      --gtest_filter='StopRace.*' >"$log" 2>&1; then
      fails=$((fails + 1))
      cp "$log" "$out/copy$i.fail$fails.log"
    fi
    if grep -q "still queued after it stopped" "$log"; then
      left=$((left + 1))
      cp "$log" "$out/copy$i.leftover$left.log"
    fi
  done
  rm -f "$log"
  echo "copy $i: runs=$runs (x1000 stops) failures=$fails runs_with_leftovers=$left"
}
for ((i = 1; i <= procs; i++)); do copy "$i" & done
wait
