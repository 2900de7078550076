#!/usr/bin/env bash
# run_python_tests.sh [MODULE...]: the Python tests on a machine with an accelerator (tools/device), one
# module at a time, so that a run stopped by the device's time limit still names every failure found so
# far: each module's summary line and its FAILED/ERROR lines as soon as it ends. Expects the package
# built by build_ext.sh on PYTHONPATH. Default modules: the ones that need nothing but torch and
# transformers (the CLI, MPI and coverage modules need this repository's own build).
set -uo pipefail
cd "$(dirname "$0")/../.."
mods=("$@")
if [ ${#mods[@]} -eq 0 ]; then
  mods=(attention isa_per_call gdn gdn_out move_autograd moves bundle batch against_transformers distributed)
fi
status=0
for m in "${mods[@]}"; do
  f=tests/python/test_$m.py
  start=$(date +%s)
  out=$(timeout "${MODULE_TIMEOUT:-240}" "${PYTHON:-python3}" -m pytest -q -rfE -p no:cacheprovider "$f" 2>&1)
  rc=$?
  summary=$(printf '%s\n' "$out" | grep -E '^[0-9]+ (passed|failed|error|skipped)|^=+ .*(passed|failed|error)' | tail -1)
  printf '%-24s rc %-3s %4ss  %s\n' "$m" "$rc" "$(( $(date +%s) - start ))" "${summary:-(no summary: timed out?)}"
  printf '%s\n' "$out" | grep -E '^(FAILED|ERROR) ' | head -20
  [ $rc -eq 0 ] || status=1
done
exit $status
