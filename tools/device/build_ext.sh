#!/usr/bin/env bash
# build_ext.sh OUT_DIR: the maskpack Python package built with nothing but a C compiler and the Python
# headers (no meson, no pip, no network), for a machine with an accelerator that holds torch but
# reaches no package registry. OUT_DIR/maskpack is then importable with PYTHONPATH=OUT_DIR.
# Every kernel chooses its ISA at run time through target pragmas, so one plain compile suffices; -O3 as
# the meson release build (at -O2 the kernels run about half as fast).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: build_ext.sh OUT_DIR}
py=${PYTHON:-python3}
mkdir -p "$out/maskpack" "$out/obj"
inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
cflags=(-std=c11 -O3 -fPIC -D_POSIX_C_SOURCE=200809L -DNDEBUG -Iinclude -Isrc/core -fvisibility=hidden)
objs=()
# the library's own folders (src/io, src/cli and the optional src/mpi are not part of the package)
for f in $(find src/core src/layout src/derive src/npu src/relayout src/distributed src/plan src/kernels -name '*.c' \
           -not -path '*/test*' | sort); do
  o="$out/obj/$(echo "$f" | tr / _).o"
  cc "${cflags[@]}" -c "$f" -o "$o" &
  objs+=("$o")
done
wait
# one extension module from several files sharing one Layout type (as python/meson.build builds it)
cc "${cflags[@]}" -I"$inc" -Ipython -shared python/_maskpack.c python/ext_common.c python/_plan.c python/_gdn.c \
  python/_attention.c "${objs[@]}" -lm -lpthread -o "$out/maskpack/_maskpack$suffix"
cp python/maskpack/*.py python/maskpack/py.typed "$out/maskpack/"
mkdir -p "$out/maskpack/compat" && cp python/maskpack/compat/*.py "$out/maskpack/compat/"
echo "build_ext: $out/maskpack"
