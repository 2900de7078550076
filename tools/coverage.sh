#!/usr/bin/env bash
# coverage.sh [BUILD_DIR]: line and branch coverage of the library, the CLI and the Python binding,
# measured with gcc's instrumentation (-Db_coverage=true: --coverage at the release -O3) and reported
# by gcovr. Runs every meson test of the instrumented build (the C suite, the emulated AVX-512 tests,
# the CLI tests and the fuzz targets: each replays its seed corpus through the standalone driver,
# fuzz/driver.c, then runs its seeded mutations), replays fuzz/crashes through the same drivers, and
# runs the Python suite against the instrumented extension. Writes under BUILD_DIR/coverage/:
#   summary.txt   lines and branches per folder, the total for src/, and that total without the
#                 files of instruction sets this CPU lacks (listed, with the reason)
#   index.html    gcovr's HTML report, one page per file with each line's and branch's counts
#   coverage.json gcovr's JSON summary (tools/coverage_summary.py reads it)
#   coverage-details.json  gcovr's per-line JSON: the summary lists the never-run lines of the
#                 instruction sets this CPU lacks from it
# Not part of `make test`: instrumented, every suite takes several times its usual time.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cov}
PY=${PY:-.venv/bin/python}
OUT="$BUILD/coverage"

if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" -Db_coverage=true -Dpython=true
fi
ninja -C "$BUILD"

# gcovr (requirements-test.txt): the interpreter's own, else a private copy under the build dir
if ! "$PY" -m gcovr --version >/dev/null 2>&1; then
  if [ ! -d "$BUILD/gcovr-pkg/gcovr" ]; then
    "$PY" -m pip install -q --target "$BUILD/gcovr-pkg" gcovr
  fi
  export PYTHONPATH="$PWD/$BUILD/gcovr-pkg${PYTHONPATH:+:$PYTHONPATH}"
fi

# counters from an earlier run would add up: start from zero
find "$BUILD" -name '*.gcda' -delete
# notes of objects this build no longer makes (their source moved or was removed) would send gcovr
# looking for sources that are gone: drop them
find "$BUILD" -name '*.gcno' | while read -r g; do
  rel="${g#"$BUILD"/}"
  grep -qF "${rel%.gcno}.o" "$BUILD/build.ninja" || rm -f "$g"
done
rm -rf "$OUT"; mkdir -p "$OUT"

status=0
# Every suite: a failing test still leaves its counts, so the report is written either way and the
# failure is the script's exit status.
meson test -C "$BUILD" --print-errorlogs --num-processes "${COVERAGE_JOBS:-2}" || status=1

# Inputs that once crashed a target (each fixed since) through the instrumented drivers.
for t in "$BUILD"/fuzz/fuzz_*; do
  [ -f "$t" ] && [ -x "$t" ] || continue
  name=$(basename "$t")
  if [ -d "fuzz/crashes/$name" ]; then "$t" -runs=0 "fuzz/crashes/$name" >/dev/null || status=1; fi
done

# The Python suite against the instrumented extension: a throwaway package dir holding the sources
# and the instrumented modules (their counters land in $BUILD/python/*.gcda).
pkgdir="$BUILD/pyroot"
rm -rf "$pkgdir"; mkdir -p "$pkgdir/maskpack"
cp python/maskpack/*.py python/maskpack/py.typed "$pkgdir/maskpack/"
cp "$BUILD"/python/_*.so "$pkgdir/maskpack/"
PYTHONPATH="$PWD/$pkgdir" "$PY" -m pytest tests/python -q -p no:cacheprovider || status=1

# The report: our sources only (not the tests, the fuzz harnesses or the benchmarks).
"$PY" -m gcovr --root . --object-directory "$BUILD" \
  --filter 'src/' --filter 'python/' \
  --exclude-unreachable-branches \
  --gcov-ignore-parse-errors=negative_hits.warn_once_per_file \
  --gcov-ignore-parse-errors=suspicious_hits.warn_once_per_file \
  --merge-mode-functions=merge-use-line-0 \
  --json-summary-pretty --json-summary "$OUT/coverage.json" --json "$OUT/coverage-details.json" \
  --html-details "$OUT/index.html" --html-title "maskpack coverage" \
  --txt "$OUT/files.txt" >/dev/null
"$PY" tools/coverage_summary.py "$OUT/coverage.json" --details "$OUT/coverage-details.json" | tee "$OUT/summary.txt"
echo "coverage: $OUT/summary.txt, $OUT/index.html (per file: $OUT/files.txt)"
exit $status
