#!/usr/bin/env bash
# Installs everything ferry needs to build and test, from Debian packages and
# PyPI. Safe to run again. Uses sudo only when not root.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ccache
  libfabric-dev libfabric-bin
  libconcurrentqueue-dev libspdlog-dev libfmt-dev libcli11-dev
  libhwloc-dev libnuma-dev libibverbs-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev iproute2
  python3 python3-dev python3-pip python3-venv
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
