"""bench/bench_shapes.py: a benchmark program's default arguments from bench/shapes.json, the one place
the benchmark shapes live (bench/report.py runs every program with the same file).

    import bench_shapes                    # bench/ is the script's own folder, or put it on sys.path
    bench_shapes.apply(ap, "bench_cp")     # before ap.parse_args(): defaults = shapes.json's "full" arguments

The program's "full" argument list in shapes.json is parsed by the program's own parser and becomes its
defaults, so a bare run measures what `make bench` measures and any option given still wins.
MASKPACK_BENCH_SHAPES=FILE reads another shapes file. A program shapes.json does not list keeps the
defaults written in it.
"""

import json
import os

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shapes.json")


def load(path=None):
    with open(path or os.environ.get("MASKPACK_BENCH_SHAPES") or PATH) as f:
        return json.load(f)


def full_args(name, shapes=None):
    """The program's "full" argument list with {threads} filled in, or None when it is not listed."""
    shapes = shapes or load()
    for p in shapes["programs"]:
        if p["name"] == name and "full" in p:
            return [a.format(threads=shapes.get("threads", 2)) for a in p["full"]]
    return None


def apply(parser, name):
    args = full_args(name)
    if args:
        parser.set_defaults(**vars(parser.parse_args(args)))
    return parser
