#!/usr/bin/env bash
# Installs the C library into a scratch prefix and builds the README's C example against it through
# pkg-config, both shared and static: the install target and the .pc file are part of the product.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
meson install -C "$BUILD" --destdir "$prefix" --quiet >/dev/null
root="$prefix$(meson introspect "$BUILD" --buildoptions | .venv/bin/python -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"][0])')"
pcdir=$(dirname "$(find "$root" -name maskpack.pc -print -quit)")
export PKG_CONFIG_PATH="$pcdir"
export PKG_CONFIG_SYSROOT_DIR="$prefix"
libdir=$(dirname "$(find "$root" -name libmaskpack.so -print -quit)")
cc -std=c11 -Wall -Wextra -Werror examples/c/basic.c $(pkg-config --cflags --libs maskpack) -Wl,-rpath,"$libdir" \
  -o "$prefix/basic_shared"
"$prefix/basic_shared" | tee "$prefix/out.txt"
grep -q "cu_seqlens (TE)  = \[0, 5, 8, 15\]" "$prefix/out.txt"
cc -std=c11 examples/c/basic.c $(pkg-config --cflags maskpack) "$libdir/libmaskpack.a" -lm -lpthread -o "$prefix/basic_static"
"$prefix/basic_static" >/dev/null
echo "check_install: the installed library, header and pkg-config file build and run the README example"
