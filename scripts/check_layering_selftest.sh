#!/usr/bin/env bash
# The layering check must fail on a planted violation and pass on a clean tree.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/core" "$tmp/src/fabric"
printf '#include "core/domain.h"\n' >"$tmp/src/fabric/ok.cpp"
printf '#include "core/worker.h"\n' >"$tmp/src/core/ok.cpp"
bash "$here/check_layering.sh" "$tmp" >/dev/null
printf '#include "fabric/fabric_domain.h"\n' >"$tmp/src/core/bad.cpp"
if bash "$here/check_layering.sh" "$tmp" >/dev/null; then
  echo "layering self-test: a core file including a transport header passed"
  exit 1
fi
rm "$tmp/src/core/bad.cpp"
printf '#  include "engine/domain_families.h"\n' >"$tmp/src/fabric/bad.cpp"
if bash "$here/check_layering.sh" "$tmp" >/dev/null; then
  echo "layering self-test: a transport including an engine header passed"
  exit 1
fi
echo "layering self-test: ok"
