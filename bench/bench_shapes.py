"""bench/bench_shapes.py: a benchmark program's default arguments from bench/shapes.json, the one place
the benchmark shapes live (bench/report.py runs every program with the same file).

    import bench_shapes                    # bench/ is the script's own folder, or put it on sys.path
    bench_shapes.apply(ap, "bench_cp")     # before ap.parse_args(): defaults = shapes.json's "full" arguments

The program's "full" argument list in shapes.json is parsed by the program's own parser and becomes its
defaults, so a bare run measures what `make bench` measures and any option given still wins.
MASKPACK_BENCH_SHAPES=FILE reads another shapes file. A program shapes.json does not list keeps the
defaults written in it.

A program whose entry names a shape table ("table": "gdn", a key of shapes.json's "tables", shared by a
C program and its torch twin) calls ``apply(ap, name, table=True)``: the table's options (``--key value``,
a list as ``a,b,c``; table_args) are parsed after the "full" arguments, and the program has no shape
written in its code, so a missing entry or table is an error. The C programs read the same tables
through a header generated at build time (bench/gen_shapes_header.py). With table=True the parser's
errors are one line (``prog: argument --x: ...``), and those of the file's own values name the file.
"""

import argparse
import json
import os
import sys

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shapes.json")


class ShapesError(Exception):
    """A shapes file that cannot be read, or lacks what a program needs (the message is one line)."""


def path():
    """The shapes file in use: MASKPACK_BENCH_SHAPES, else bench/shapes.json."""
    return os.environ.get("MASKPACK_BENCH_SHAPES") or PATH


def load(file=None):
    """The parsed shapes file; ShapesError (one line, naming the file) when it is missing or not JSON."""
    file = file or path()
    try:
        with open(file) as f:
            shapes = json.load(f)
    except (OSError, ValueError) as e:
        raise ShapesError(f"{file}: {e}") from None
    if not isinstance(shapes, dict) or not isinstance(shapes.get("programs"), list):
        raise ShapesError(f"{file}: no \"programs\" list")
    return shapes


def entry(name, shapes=None):
    """The program's entry of shapes.json, or None when it is not listed."""
    shapes = shapes or load()
    return next((p for p in shapes["programs"] if isinstance(p, dict) and p.get("name") == name), None)


def full_args(name, shapes=None):
    """The program's "full" argument list with {threads} filled in, or None when it is not listed."""
    shapes = shapes or load()
    p = entry(name, shapes)
    if p and "full" in p:
        return [a.format(threads=shapes.get("threads", 2)) for a in p["full"]]
    return None


def options(table):
    """A shape table as command-line options: {"head-dim": 64, "docs": [1, 2]} -> --head-dim 64 --docs 1,2."""
    out = []
    for key, value in table.items():
        out += ["--" + key, ",".join(str(v) for v in value) if isinstance(value, list) else str(value)]
    return out


def table_of(name, shapes, file=None):
    """The named shape table of shapes.json's "tables"; ShapesError naming it when it is not there."""
    tables = shapes.get("tables")
    if not isinstance(tables, dict) or not isinstance(tables.get(name), dict):
        raise ShapesError(f"{file or path()}: no shape table {name!r} in \"tables\"")
    return tables[name]


def table_args(name, shapes=None, required=False):
    """The options of the shape table program `name`'s entry names ([] when it names none, unless
    required: then a missing entry or table is a ShapesError naming it)."""
    shapes = shapes or load()
    p = entry(name, shapes)
    if not p or "table" not in p:
        if required:
            raise ShapesError(f"{path()}: no program {name!r} with a \"table\" in \"programs\"")
        return []
    return options(table_of(p["table"], shapes))


def one_line_errors(parser, where=""):
    """Makes the parser report a bad option in one line, `prog: [where]message`, and exit 2 (argparse
    would print its whole usage first)."""
    def error(message):
        sys.stderr.write(f"{parser.prog}: {where}{message}\n")
        sys.exit(2)

    parser.error = error
    return parser


def integer(lo, hi):
    """An argparse type: a whole number in [lo, hi] (the message names the range and the text)."""
    def parse(text):
        try:
            v = int(text, 10)
        except ValueError:
            v = None
        if v is None or not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer in [{lo}, {hi}], got {text!r}")
        return v

    return parse


def integers(lo, hi):
    """An argparse type: a comma-separated list of whole numbers, each in [lo, hi]."""
    one = integer(lo, hi)

    def parse(text):
        if not text.strip():
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers in [{lo}, {hi}], "
                                             f"got {text!r}")
        return [one(x.strip()) for x in text.split(",")]

    return parse


def apply(parser, name, table=False):
    """Sets the parser's defaults to shapes.json's "full" arguments of program `name` (and, with table,
    its shape table's options); a file that cannot be read, or with table a missing entry or table,
    ends the program with one line naming it."""
    if table:
        one_line_errors(parser)
    try:
        shapes = load()
        args = full_args(name, shapes)
        if table:
            args = (args or []) + table_args(name, shapes, required=True)
    except ShapesError as e:
        sys.exit(f"{parser.prog}: {e}")
    if args:
        if table:  # a bad value in the file is reported as the file's, not as the command line's
            one_line_errors(parser, f"{path()} (program {name!r}): ")
        parser.set_defaults(**vars(parser.parse_args(args)))
        if table:
            one_line_errors(parser)
    return parser
