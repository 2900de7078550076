#!/usr/bin/env bash
# tools/make_pkgdir.sh PKGDIR EXTENSION...: a throwaway package dir for running the Python suite against
# an extension built another way (sanitized, emulated ISAs): PKGDIR/maskpack holds this tree's Python
# sources (subpackages too, without their bytecode caches) and the given extension modules.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgdir=$1
shift
rm -rf "$pkgdir"; mkdir -p "$pkgdir/maskpack"
cp python/maskpack/*.py "$pkgdir/maskpack/"
for sub in python/maskpack/*/; do
  name=$(basename "$sub")
  [ "$name" = __pycache__ ] && continue
  mkdir -p "$pkgdir/maskpack/$name" && cp "$sub"*.py "$pkgdir/maskpack/$name/"
done
cp "$@" "$pkgdir/maskpack/"
