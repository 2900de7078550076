#!/usr/bin/env bash
# Builds maskpack with AddressSanitizer + UndefinedBehaviorSanitizer and runs the whole C suite, the
# fuzz corpora replay and the Python suite against the sanitized extension, plus ThreadSanitizer over
# the threaded relayout tests. Any report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-asan}
PY=.venv/bin/python
if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" -Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false \
    -Dc_args=-fno-sanitize-recover=undefined -Dpython=true
fi
ninja -C "$BUILD"
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
meson test -C "$BUILD" --print-errorlogs --suite c
# the C API across processes (mpirun), when MPI is there; leaks off: Open MPI keeps its own allocations
# until exit by design
if [ -d "$BUILD/tests/mpi" ]; then
  ASAN_OPTIONS=abort_on_error=1:detect_leaks=0 meson test -C "$BUILD" --print-errorlogs --suite mpi
fi

# Replay every fuzz corpus through the sanitized standalone fuzz drivers.
for t in "$BUILD"/fuzz/fuzz_*; do
  [ -f "$t" ] && [ -x "$t" ] || continue
  name=$(basename "$t")
  "$t" -runs=0 "fuzz/corpus/$name" >/dev/null
done

# Python suite against the sanitized extension: a throwaway package dir holding the sources and the
# sanitized module, with the ASan runtime preloaded into the interpreter (leaks off: CPython and
# torch keep allocations alive at exit by design). MASKPACK_EXPECT_SANITIZED=1 makes
# tests/python/conftest.py refuse to run unless ASan is loaded and the extension is this pkgdir's.
pkgdir="$BUILD/pyroot"
bash tools/make_pkgdir.sh "$pkgdir" "$BUILD"/python/_*.so
asan_rt=$(gcc -print-file-name=libasan.so)
ubsan_rt=$(gcc -print-file-name=libubsan.so)
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 LD_PRELOAD="$asan_rt $ubsan_rt" PYTHONPATH="$pkgdir" \
  MASKPACK_EXPECT_SANITIZED=1 "$PY" -m pytest tests/python -q -p no:cacheprovider -x

# ThreadSanitizer over the programs that start threads (the relayout worker team and its fork/busy
# paths, the multi-threaded kernels), when clang is there (CI installs it for the fuzzers).
if command -v clang >/dev/null 2>&1; then
  TSAN_BUILD="$BUILD-tsan"
  if [ ! -f "$TSAN_BUILD/build.ninja" ]; then
    CC=clang meson setup "$TSAN_BUILD" -Dbuildtype=debugoptimized -Db_sanitize=thread -Db_lundef=false -Dpython=false
  fi
  ninja -C "$TSAN_BUILD" tests/c/test_relayout
  TSAN_OPTIONS=halt_on_error=1 "$TSAN_BUILD/tests/c/test_relayout"
fi
