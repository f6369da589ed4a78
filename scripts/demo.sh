#!/usr/bin/env bash
# The main job: a verified two-process transfer over loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/tools/ferry-demo/ferry-demo "$@"
