#!/bin/sh
# The pinned upstream packages the maskpack.compat twins are compared with (make test-conformance),
# installed without their dependencies into a directory of their own; skipped when that directory
# already holds exactly these pins. Only the tests import them; maskpack never does.
set -eu
DIR=${1:-build/upstream}
PY=${PY:-.venv/bin/python}
PINS="verl==0.9.1 megatron-core==0.16.1 ms-swift==4.6.0 mcore-bridge==1.6.5 twinkle-kit==0.5.1"
# TransformerEngine's pure-Python wheel (the version megatron-core 0.16.1 accepts: <2.12) goes into a
# directory of its own: on sys.path beside megatron it would make megatron try its CUDA extension.
TE_PIN="transformer-engine==2.11.0"
# verl's seqlen_balancing moves rows of a TensorDict: tensordict (in verl 0.9.1's range) and the three
# packages its import needs, pinned.
TD_PINS="tensordict==0.10.0 pyvers==0.2.3 orjson==3.13.0 cloudpickle==3.1.3"
if [ -f "$DIR/.pins" ] && [ "$(cat "$DIR/.pins")" = "$PINS $TE_PIN $TD_PINS" ]; then
    exit 0
fi
rm -rf "$DIR"
# shellcheck disable=SC2086
"$PY" -m pip install --quiet --no-deps --target "$DIR" $PINS $TD_PINS
"$PY" -m pip install --quiet --no-deps --target "$DIR/te" "$TE_PIN"
echo "$PINS $TE_PIN $TD_PINS" > "$DIR/.pins"
