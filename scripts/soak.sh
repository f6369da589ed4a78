#!/usr/bin/env bash
# ferry-soak: 3 processes x 2 NICs, randomised transfers of every kind under
# the fault injector, every byte and immediate checked (docs/RELIABILITY.md,
# "Fault injection and soak").
#   scripts/soak.sh short   ~2 minutes on tcp;ofi_rxm (what CI runs)
#   scripts/soak.sh full    >= 1 000 000 transfers on tcp, then on shm
#   scripts/soak.sh -- ARGS ferry-soak with your own options (--help)
# BUILD_DIR (default build-soak) and JOBS (default 2) pick the build.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-soak}
mode=${1:-short}
[[ $# -gt 0 ]] && shift

if [[ ! -f $BUILD_DIR/build.ninja ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DFERRY_WERROR=ON
fi
ninja -C "$BUILD_DIR" -j "${JOBS:-2}" ferry-soak
soak=$BUILD_DIR/tests/ferry-soak

case $mode in
  short) exec "$soak" --provider tcp --seconds 100 --seed 1 "$@" ;;
  full)
    "$soak" --provider tcp --transfers 1000000 --seed 7 --progress 30 "$@"
    exec "$soak" --provider shm --transfers 1000000 --seed 8 --progress 30 "$@"
    ;;
  --) exec "$soak" "$@" ;;
  *) echo "usage: $0 short|full|-- ARGS" >&2; exit 2 ;;
esac
