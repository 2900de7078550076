#!/bin/sh
# run_fuzz.sh TARGET_DIR SECONDS [TARGET...]
#
# Runs every fuzz target found in TARGET_DIR (e.g. build/fuzz) for SECONDS seconds each, seeded with
# its corpus fuzz/corpus/<target>/. Works with both builds: libFuzzer (-Dlibfuzzer=true, clang) and
# the standalone driver, which take the same flags. New inputs and crash artifacts go to
# fuzz/corpus-out/<target>/ (git-ignored), never into the committed corpus. Exits non-zero when any
# target crashed or reported an invariant violation; the crashing inputs are listed.
set -u
if [ $# -lt 2 ]; then
    echo "usage: $0 TARGET_DIR SECONDS [TARGET...]" >&2
    exit 2
fi
dir=$1
secs=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
# sanitizers: stop at the first report and abort, so the driver's signal handler saves the input
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}"
if [ $# -gt 0 ]; then
    targets="$*"
else
    targets=$(cd "$dir" && for f in fuzz_*; do [ -f "$f" ] && [ -x "$f" ] && echo "$f"; done)
fi
if [ -z "$targets" ]; then
    echo "$0: no fuzz_* executables in $dir" >&2
    exit 2
fi
failed=""
for t in $targets; do
    exe=$dir/$t
    seeds=$root/fuzz/corpus/$t
    out=$root/fuzz/corpus-out/$t
    mkdir -p "$out"
    echo "== $t: ${secs}s"
    if ! "$exe" -max_total_time="$secs" -timeout=25 -rss_limit_mb=2048 -print_final_stats=0 \
            -artifact_prefix="$out/" "$out" "$seeds" >"$out/log.txt" 2>&1; then
        echo "   FAILED (log: $out/log.txt)"
        tail -n 25 "$out/log.txt" | sed 's/^/   | /'
        failed="$failed $t"
    else
        tail -n 1 "$out/log.txt" | sed 's/^/   /'
    fi
done
if [ -n "$failed" ]; then
    echo "fuzz targets with findings:$failed"
    ls "$root"/fuzz/corpus-out/*/crash-* "$root"/fuzz/corpus-out/*/leak-* "$root"/fuzz/corpus-out/*/timeout-* \
        "$root"/fuzz/corpus-out/*/oom-* 2>/dev/null
    exit 1
fi
echo "all fuzz targets ran clean"
