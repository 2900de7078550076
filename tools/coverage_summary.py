"""coverage_summary.py COVERAGE_JSON [--cpuinfo FILE]: the per-folder figures of a gcovr JSON summary.

Prints lines and branches covered per folder, the total over src/, and the src/ total without the
files written for instruction sets this CPU lacks: such code cannot run here, so it is listed apart,
each file with the instruction sets it needs and its own figures (the emulated AVX-512 test builds
run the AVX-512 f32 kernels' code on any CPU, so those files may still show counts). Python standard
library only; called by tools/coverage.sh.
"""

import argparse
import json
import os
import sys

# The files compiled for one instruction-set extension each (target pragmas inside them; the run-time
# CPU checks of src/core/cpu_features.c pick them), and the /proc/cpuinfo flags their code needs.
_AVX512 = ("avx512f", "avx512dq", "avx512bw", "avx512vl")
ISA_FILES = {
    "src/kernels/attention/attn_amx.c": ("AMX", _AVX512 + ("amx_tile", "amx_bf16")),
    "src/kernels/attention/attn_avx512bf16.c": ("AVX512-BF16", _AVX512 + ("avx512_bf16",)),
    "src/kernels/attention/attn_avx512.c": ("AVX-512", _AVX512),
    "src/kernels/attention/attn_avx512_bwd.c": ("AVX-512", _AVX512),
    "src/kernels/attention/attn_avx512_tiles.h": ("AVX-512", _AVX512),
    "src/kernels/attention/attn_avx512_common.h": ("AVX-512", _AVX512),
    "src/kernels/gdn/gdn_avx512.c": ("AVX-512", _AVX512),
    "src/kernels/attention/attn_avx2.c": ("AVX2", ("avx2", "fma")),
    "src/kernels/attention/attn_avx2_bwd.c": ("AVX2", ("avx2", "fma")),
    "src/kernels/attention/attn_avx2_tiles.h": ("AVX2", ("avx2", "fma")),
    "src/kernels/gdn/gdn_avx2.c": ("AVX2", ("avx2", "fma")),
}


def cpu_flags(path):
    """The flags of the first processor in a /proc/cpuinfo file (empty when there is none)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def pct(covered, total):
    return f"{100.0 * covered / total:6.2f}%" if total else "     -"


def row(name, t):
    return (f"{name:<34} lines {t[0]:6d}/{t[1]:<6d} {pct(t[0], t[1])}   "
            f"branches {t[2]:6d}/{t[3]:<6d} {pct(t[2], t[3])}")


def add(acc, f):
    acc[0] += f["line_covered"]
    acc[1] += f["line_total"]
    acc[2] += f["branch_covered"]
    acc[3] += f["branch_total"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--cpuinfo", default="/proc/cpuinfo")
    args = ap.parse_args(argv)
    with open(args.json) as f:
        files = json.load(f)["files"]
    flags = cpu_flags(args.cpuinfo)

    folders = {}
    src, src_runnable = [0] * 4, [0] * 4
    lacking = []
    for f in sorted(files, key=lambda f: f["filename"]):
        name = f["filename"].replace(os.sep, "/")
        add(folders.setdefault(os.path.dirname(name), [0] * 4), f)
        if not name.startswith("src/"):
            continue
        add(src, f)
        isa = ISA_FILES.get(name)
        missing = [x for x in isa[1] if x not in flags] if isa else []
        if missing:
            lacking.append((name, isa[0], missing, f))
        else:
            add(src_runnable, f)

    print("per folder")
    for name in sorted(folders):
        print(row(name, folders[name]))
    print()
    print(row("src/ (all)", src))
    print(row("src/ without ISA code not run here", src_runnable))
    print()
    if lacking:
        print("left out of the second src/ figure: instruction sets this CPU lacks "
              "(its /proc/cpuinfo flags miss them, so the run-time checks never pick these files)")
        for name, isa, missing, f in lacking:
            t = [0] * 4
            add(t, f)
            print(row(f"  {name}", t), f"  needs {isa}: no {' '.join(missing)}")
    else:
        print("this CPU has every instruction set the kernels are written for: nothing left out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
