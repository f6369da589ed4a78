#!/usr/bin/env bash
# Builds a libfabric with CUDA (FI_HMEM_CUDA) into .fab-carry/, for the GPU tests of
# the fabric domain (nvlink_tests' shm variant, tests/python/test_gpu.py) on machines
# whose packaged libfabric has no CUDA (Debian 12's and Ubuntu 24.04's 1.17). Not part
# of CI. Run the GPU tests with LD_LIBRARY_PATH=$PWD/.fab-carry/lib (docs/NVLINK.md).
#
# Source: Debian 13's libfabric 2.1.0 tarball (the 1.17 tarball is no longer on the
# mirror); same SONAME (libfabric.so.1) and the 1.x symbol versions, so binaries built
# against 1.17 run on it. nvml.h (needed by the CUDA code) comes from PyPI's
# nvidia-nvml-dev, as CUDA 13 toolkits here lack it. CUDA is loaded with dlopen, so
# the library links only libc. Build tools: autoconf automake libtool (apt).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VER=${LIBFABRIC_VERSION:-2.1.0}
CUDA=${CUDA:-/usr/local/cuda}
WORK=${WORK:-$ROOT/.cache/libfabric-cuda}
mkdir -p "$WORK"
cd "$WORK"

tarball=libfabric_$VER.orig.tar.xz
[[ -f $tarball ]] || curl -fsSLO "https://deb.debian.org/debian/pool/main/libf/libfabric/$tarball"
if [[ ! -f nvml/include/nvml.h ]]; then
  python3 -m pip download --quiet --no-deps --only-binary=:all: --dest wheels nvidia-nvml-dev
  mkdir -p nvml/include
  python3 - <<'PY'
import glob, zipfile
whl = sorted(glob.glob("wheels/nvidia_nvml_dev*.whl"))[-1]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith("include/nvml.h"))
    open("nvml/include/nvml.h", "wb").write(z.read(name))
PY
fi

rm -rf "libfabric-$VER" install
tar xf "$tarball"
cd "libfabric-$VER"
[[ -x configure ]] || ./autogen.sh >../autogen.log 2>&1
# Only the providers the tests use; CUDA through dlopen.
./configure --prefix="$WORK/install" --disable-static --enable-only --enable-shm --enable-tcp \
  --enable-rxm --enable-udp --enable-rxd --with-cuda="$CUDA" --enable-cuda-dlopen \
  --with-uring=no --disable-xpmem --with-gdrcopy=no --with-lttng=no \
  CPPFLAGS="-I$WORK/nvml/include" >../configure.log 2>&1
make -j"${JOBS:-2}" >../make.log 2>&1
make install >../install.log 2>&1

rm -rf "$ROOT/.fab-carry"
mkdir -p "$ROOT/.fab-carry/lib" "$ROOT/.fab-carry/bin"
cp -a "$WORK"/install/lib/libfabric.so.1* "$ROOT/.fab-carry/lib/"
cp "$WORK/install/bin/fi_info" "$ROOT/.fab-carry/bin/"
strip --strip-debug "$ROOT"/.fab-carry/lib/libfabric.so.1.*
LD_LIBRARY_PATH="$ROOT/.fab-carry/lib" "$ROOT/.fab-carry/bin/fi_info" -p shm -v | grep -q FI_HMEM
echo "libfabric $VER with CUDA in .fab-carry/ (shm offers FI_HMEM)"
