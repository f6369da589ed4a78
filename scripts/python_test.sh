#!/usr/bin/env bash
# Builds and installs the ferry Python package (C++ core + nanobind extension, one
# step through scikit-build-core) into the current interpreter, then runs the Python
# tests. Extra arguments go to pytest (e.g. -k paged, -x).
#
#   PYTHON=python3.12 scripts/python_test.sh   # another interpreter (default: python3)
#   FERRY_PIP_EDITABLE=1 scripts/python_test.sh # editable install (pip install -e .)
#
# An interpreter whose packages the system manages (PEP 668, e.g. Debian's
# /usr/bin/python3) gets a virtual environment in build/py-venv instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}

if "$PYTHON" - <<'PY'
import os, sys, sysconfig
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
         and sys.prefix == sys.base_prefix else 1)
PY
then
  echo "python_test: $PYTHON is externally managed; using the virtual environment build/py-venv"
  "$PYTHON" -m venv build/py-venv
  PYTHON=build/py-venv/bin/python
fi

"$PYTHON" -m pip install -q --disable-pip-version-check \
  "nanobind>=2.4" "scikit-build-core>=0.10" "numpy>=1.22" "pytest>=7" "ml_dtypes>=0.3"
# The build tree is kept in build/py-<wheel tag> (pyproject.toml names none, so a plain
# `pip install .` leaves the checkout alone): later runs rebuild only what changed.
"$PYTHON" -m pip install -q --disable-pip-version-check --no-build-isolation \
  -Cbuild-dir="build/py-{wheel_tag}" ${FERRY_PIP_EDITABLE:+-e} .
"$PYTHON" -m ferry.info --provider "tcp;ofi_rxm" --provider shm
"$PYTHON" -m pytest tests/python -rs -p no:cacheprovider "$@"
