#!/usr/bin/env bash
# fuzz_ci.sh BUILD_DIR SECONDS: builds every fuzz target and runs each for SECONDS on its corpus.
# With clang and its libFuzzer runtime present (tools/install_deps.sh installs them) the targets are
# coverage-guided libFuzzer binaries under AddressSanitizer + UndefinedBehaviorSanitizer; otherwise
# they are the standalone mutation driver built with the default compiler and the same sanitizers.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-fuzz}
SECS=${2:-20}
if [ ! -f "$BUILD/build.ninja" ]; then
  common=(-Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false -Dpython=false)
  if command -v clang >/dev/null 2>&1 && echo 'int LLVMFuzzerTestOneInput(const char*d,long n){return 0;}' |
       clang -x c -fsanitize=fuzzer -o /dev/null - >/dev/null 2>&1; then
    CC=clang meson setup "$BUILD" "${common[@]}" -Dlibfuzzer=true >/dev/null
  else
    echo "fuzz_ci: clang with libFuzzer not found; using the standalone driver"
    meson setup "$BUILD" "${common[@]}" >/dev/null
  fi
fi
targets=$(sed -n "s/^fuzz_targets = \[\(.*\)/\1/p;/^ *'fuzz_/p" fuzz/meson.build | grep -o "fuzz_[a-z0-9_]*" | sort -u)
ninja -C "$BUILD" $(for t in $targets; do echo "fuzz/$t"; done)
bash tools/run_fuzz.sh "$BUILD/fuzz" "$SECS"
