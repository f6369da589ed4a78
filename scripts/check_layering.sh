#!/usr/bin/env bash
# Fails when a file includes a header of a layer above its own (docs/ARCHITECTURE.md):
#   src/core       public headers and src/core only: no transport, engine, cuda or topo
#   src/fabric, src/verbs, src/nvlink, src/testing   core and their own folder; never
#                  the engine or another transport
#   include/ferry  public headers only
set -euo pipefail
# An argument names another tree to check (the self-test uses a planted violation).
cd "${1:-$(dirname "$0")/..}"
status=0
check() {  # folder, forbidden include prefixes (regex alternation)
  local dir=$1 forbidden=$2
  [ -d "$dir" ] || return 0
  local hits
  hits=$(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]*\"($forbidden)/" "$dir" \
    --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' || true)
  if [ -n "$hits" ]; then
    echo "layering: $dir includes a header of a layer above it or beside it:"
    echo "$hits"
    status=1
  fi
}
check src/core "engine|fabric|verbs|nvlink|testing|cuda|topo|moe"
check src/fabric "engine|verbs|nvlink|testing|moe"
check src/verbs "engine|fabric|nvlink|testing|moe"
check src/nvlink "engine|fabric|verbs|testing|moe"
check src/testing "engine|fabric|verbs|nvlink|moe"
# src/moe sits above the engine and uses only its public API (include/ferry).
check src/moe "core|engine|fabric|verbs|nvlink|testing|cuda|topo"
[ -d include/ferry ] && check include/ferry "core|engine|fabric|verbs|nvlink|testing|cuda|topo|moe"
# Public headers name no transport type: only provider strings.
if [ -d include/ferry ] && grep -rnE "fid_|ibv_|cudaIpc" include/ferry --include='*.h' | grep -v '^\S*:[0-9]*:\s*//' ; then
  echo "layering: a public header names a transport's types"
  status=1
fi
[ $status -eq 0 ] && echo "layering: ok"
exit $status
