"""coverage_summary.py COVERAGE_JSON [--details GCOVR_JSON] [--cpuinfo FILE]: the per-folder figures.

Prints lines and branches covered per folder, the total over src/, and the src/ total without the
files written for instruction sets this CPU lacks: such code cannot run here, so it is listed apart,
each file with the instruction sets it needs and its own figures (the emulated AVX-512 test builds
run the AVX-512 f32 kernels' code on any CPU, so those files may still show counts). With --details
(gcovr's full --json output, per line) it also lists the lines of those files that never ran, as
ranges, and the never-run lines of the other src/ files that only the run-time checks for those
instruction sets reach (the dispatch: a line naming the extension, e.g. `mp_cpu_has_amx()`). Python
standard library only; called by tools/coverage.sh.
"""

import argparse
import json
import os
import re
import sys

# The files compiled for one instruction-set extension each (target pragmas inside them; the run-time
# CPU checks of src/core/cpu_features.c pick them), and the /proc/cpuinfo flags their code needs.
_AVX512 = ("avx512f", "avx512dq", "avx512bw", "avx512vl")
ISA_FILES = {
    "src/kernels/attention/attn_amx.c": ("AMX", _AVX512 + ("amx_tile", "amx_bf16")),
    "src/kernels/attention/attn_avx512bf16.c": ("AVX512-BF16", _AVX512 + ("avx512_bf16",)),
    "src/kernels/attention/attn_avx512.c": ("AVX-512", _AVX512),
    "src/kernels/attention/attn_avx512_bwd.c": ("AVX-512", _AVX512),
    "src/kernels/attention/attn_avx512_uk.h": ("AVX-512", _AVX512),
    "src/kernels/attention/attn_avx512_common.h": ("AVX-512", _AVX512),
    "src/kernels/gdn/gdn_avx512.c": ("AVX-512", _AVX512),
    "src/kernels/gdn/gdn_amx.c": ("AMX", _AVX512 + ("amx_tile", "amx_bf16")),
    "src/kernels/attention/attn_avx2.c": ("AVX2", ("avx2", "fma")),
    "src/kernels/attention/attn_avx2_bwd.c": ("AVX2", ("avx2", "fma")),
    "src/kernels/attention/attn_avx2_uk.h": ("AVX2", ("avx2", "fma")),
    "src/kernels/gdn/gdn_avx2.c": ("AVX2", ("avx2", "fma")),
}


# The words a dispatch line uses for each extension (lower case; a line naming a lacking extension
# and never run is listed with it).
ISA_WORDS = {
    "AMX": re.compile(r"amx|xtile"),
    "AVX512-BF16": re.compile(r"avx512_?bf16"),
    "AVX-512": re.compile(r"avx512"),
    "AVX2": re.compile(r"avx2"),
}


def ranges(numbers):
    """[1, 2, 3, 7, 9, 10] -> "1-3, 7, 9-10"."""
    out, start, prev = [], None, None
    for n in sorted(numbers) + [None]:
        if start is not None and (n is None or n != prev + 1):
            out.append(str(start) if start == prev else "%d-%d" % (start, prev))
            start = None
        if n is not None and start is None:
            start = n
        prev = n
    return ", ".join(out)


def never_run(details, name):
    """The line numbers of `name` with code that never ran (gcovr's per-line JSON)."""
    for f in details:
        if f["file"].replace(os.sep, "/") == name:
            return [l["line_number"] for l in f["lines"] if l["count"] == 0]
    return []


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
    ap.add_argument("--details", help="gcovr --json output (per line) for the never-run ISA lines")
    ap.add_argument("--cpuinfo", default="/proc/cpuinfo")
    args = ap.parse_args(argv)
    details = None
    if args.details:
        with open(args.details) as f:
            details = json.load(f)["files"]
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
            if details is not None:
                lines = never_run(details, name)
                if lines and len(lines) == f["line_total"]:
                    print(f"    never run: all {len(lines)} lines with code ({min(lines)}-{max(lines)})")
                else:
                    print(f"    never run: lines {ranges(lines) or '(none)'}")
        if details is not None:
            # the dispatch to those files elsewhere in src/: never-run lines naming a lacking extension
            lacking_isas = sorted({isa for _, isa, _, _ in lacking})
            words = [ISA_WORDS[i] for i in lacking_isas if i in ISA_WORDS]
            listed = {name for name, _, _, _ in lacking}
            shown = []
            for f in sorted(details, key=lambda f: f["file"]):
                name = f["file"].replace(os.sep, "/")
                if not name.startswith("src/") or name in listed:
                    continue
                try:
                    with open(name) as fh:
                        text = fh.read().split("\n")
                except OSError:
                    continue
                for n in never_run(details, name):
                    line = text[n - 1] if 0 < n <= len(text) else ""
                    if any(w.search(line.lower()) for w in words):
                        shown.append(f"    {name}:{n}: {line.strip()[:100]}")
            print(f"lines elsewhere in src/ that only a CPU with {', '.join(lacking_isas)} runs (never run here): "
                  f"{len(shown)}")
            for s in shown:
                print(s)
    else:
        print("this CPU has every instruction set the kernels are written for: nothing left out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
