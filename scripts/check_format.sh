#!/usr/bin/env bash
# Fails when a C++/CUDA source does not follow .clang-format.
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | xargs clang-format --dry-run -Werror
