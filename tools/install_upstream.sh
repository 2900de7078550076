#!/bin/sh
# The pinned upstream packages the maskpack.compat twins are compared with (make test-conformance),
# installed without their dependencies into a directory of their own; skipped when that directory
# already holds exactly these pins. Only the tests import them; maskpack never does.
set -eu
DIR=${1:-build/upstream}
PY=${PY:-.venv/bin/python}
PINS="verl==0.9.1 megatron-core==0.16.1 ms-swift==4.6.0 mcore-bridge==1.6.5"
if [ -f "$DIR/.pins" ] && [ "$(cat "$DIR/.pins")" = "$PINS" ]; then
    exit 0
fi
rm -rf "$DIR"
# shellcheck disable=SC2086
"$PY" -m pip install --quiet --no-deps --target "$DIR" $PINS
echo "$PINS" > "$DIR/.pins"
