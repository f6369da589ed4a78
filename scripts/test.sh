#!/usr/bin/env bash
# The whole test suite: builds with warnings as errors, runs every C++ test
# through CTest, then builds the Python package and runs its tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "${JOBS:-2}" --timeout 600
bash scripts/python_test.sh
