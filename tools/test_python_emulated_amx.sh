#!/usr/bin/env bash
# The Python tests of the kernels that AUTO runs on the AMX tiles where a CPU has AMX (bf16 attention
# forward and backward, the gated delta rule in bf16), on any x86-64 CPU: the extension built with
# every AVX-512, AVX512-BF16 and AMX intrinsic carried out in portable C (src/kernels/isa/simde_*.h,
# as the *_emulated_amx C tests are) and its CPU check reporting AMX, in a throwaway package dir.
# What an AMX host would run under AUTO then runs here, so a test whose expectation only holds
# without AMX fails on every CPU, not only on the CI machines that have AMX. Slow kernels (the
# emulation is scalar C): only the kernel-facing test files run.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-emu-amx}
PY=.venv/bin/python
if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" -Dbuildtype=release -Dpython=true \
    "-Dc_args=-DMASKPACK_EMULATE_AVX512 -DMASKPACK_EMULATE_AMX -Wno-psabi"
fi
so=$(ninja -C "$BUILD" -t targets all | sed -n 's/^\(python\/_maskpack[^:]*\.so\): .*/\1/p' | head -1)
ninja -C "$BUILD" "$so"
pkgdir="$BUILD/pyroot"
bash tools/make_pkgdir.sh "$pkgdir" "$BUILD/$so"
# the emulated extension is the one imported, and it runs bf16 on AMX under AUTO
PYTHONPATH="$pkgdir" "$PY" -c "
import maskpack, os, sys
assert os.path.dirname(maskpack.__file__) == os.path.abspath('$pkgdir/maskpack'), maskpack.__file__
assert maskpack.attention_isa('bfloat16') == 'amx' and maskpack.gdn_isa('bfloat16') == 'amx', 'no emulated AMX'
"
PYTHONPATH="$pkgdir" "$PY" -m pytest tests/python/test_attention.py tests/python/test_gdn.py \
  tests/python/test_isa_per_call.py -q -p no:cacheprovider
