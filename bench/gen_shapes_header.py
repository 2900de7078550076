"""bench/gen_shapes_header.py: the C benchmark programs' default shapes, generated at build time from
bench/shapes.json (bench/meson.build runs it, with shapes.json as its input, so editing the file rebuilds
the programs), so that their shapes are written in one place only.

    python3 bench/gen_shapes_header.py SHAPES_JSON OUT_H TABLE [TABLE ...]

For each TABLE of shapes.json's "tables" it writes a macro BENCH_SHAPES_<TABLE> holding the table's
options as string literals, exactly as bench_shapes.table_args (and so bench/report.py) passes them:

    #define BENCH_SHAPES_GDN "--tokens", "4096", "--segments", "8", ...

The program parses them with its own option parser before its command line, so the command line wins.
A macro, not an array: a program uses one table of the header, and an unused array would be warned
about. A table missing from the file (or a value that is not a number, a string or a list of them) ends
it with one line naming the table, and exit status 1, which fails the build.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_shapes  # noqa: E402  (the same file reading and table -> options as the Python programs)


def c_string(text):
    """A C string literal of text (only printable ASCII appears in a shapes file's options)."""
    if not all(32 <= ord(c) < 127 for c in text):
        raise bench_shapes.ShapesError(f"not printable ASCII: {text!r}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def check_value(table, key, value):
    """A table value is a number, a string, or a list of those (what options() can write)."""
    ok = (lambda v: isinstance(v, (int, str)) and not isinstance(v, bool))
    if not (ok(value) or (isinstance(value, list) and value and all(ok(v) for v in value))):
        raise bench_shapes.ShapesError(f"table {table!r}: {key!r} is not a number, a string or a list of them")


def header(shapes_file, tables):
    """The text of bench_shapes.h for the named tables of shapes_file."""
    shapes = bench_shapes.load(shapes_file)
    lines = ["/* bench_shapes.h: generated from bench/shapes.json by bench/gen_shapes_header.py at build time;",
             " * do not edit (edit bench/shapes.json). Each macro is a shape table's options, parsed by its program",
             " * before its command line. */",
             "#ifndef MASKPACK_BENCH_SHAPES_H", "#define MASKPACK_BENCH_SHAPES_H", ""]
    for name in tables:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise bench_shapes.ShapesError(f"table name {name!r} is not a C identifier")
        table = bench_shapes.table_of(name, shapes, shapes_file)
        for key, value in table.items():
            check_value(name, key, value)
        opts = bench_shapes.options(table)
        shown = " ".join(opts).replace("*/", "* /")  # a label cannot end the comment
        lines.append(f"/* tables.{name}: {shown} */")
        lines.append(f"#define BENCH_SHAPES_{name.upper()} {', '.join(c_string(o) for o in opts)}")
        lines.append("")
    lines.append("#endif")
    return "\n".join(lines) + "\n"


def main(argv):
    if len(argv) < 3:
        sys.stderr.write("usage: gen_shapes_header.py SHAPES_JSON OUT_H TABLE [TABLE ...]\n")
        return 2
    try:
        text = header(argv[0], argv[2:])
    except bench_shapes.ShapesError as e:
        sys.stderr.write(f"gen_shapes_header.py: {argv[0]}: {e}\n" if not str(e).startswith(argv[0]) else
                         f"gen_shapes_header.py: {e}\n")
        return 1
    with open(argv[1], "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
