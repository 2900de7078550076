#!/usr/bin/env bash
# Installs what building and testing maskpack needs on a fresh Debian machine: the C libraries
# (zlib, libpng, cJSON), cairo and a font for the CLI's pictures (optional to the build: without
# them `--png` says pictures were not built in), pkg-config, SIMDe (a test build runs the AVX-512
# kernels emulated) and Open MPI (libmaskpack_mpi and its mpirun tests); with `all` (the default) also clang with libFuzzer for
# coverage-guided fuzzing and a Python virtual environment at .venv with the build and test
# packages. Idempotent and quiet when everything is there.
#   tools/install_deps.sh [c|all]
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}

need=()
for pkg in pkg-config zlib1g-dev libpng-dev libcjson-dev libcairo2-dev fonts-dejavu-core libsimde-dev libopenmpi-dev \
           openmpi-bin; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "$what" = all ] && [ "${MASKPACK_WITH_CLANG:-1}" = 1 ]; then
  for pkg in clang libclang-rt-14-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "install_deps: apt-get install ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

[ "$what" = all ] || exit 0

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.maskpack-deps
if [ ! -f "$stamp" ] || [ requirements-test.txt -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -r requirements-test.txt
  touch "$stamp"
fi
