#!/usr/bin/env bash
# The whole test suite: builds with warnings as errors and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "${JOBS:-2}" --timeout 600
