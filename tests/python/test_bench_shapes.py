"""The benchmark shapes live in bench/shapes.json only (issue 35): the programs that measured shapes
written in their code (bench_derive, bench_relayout, bench_gdn, bench_attention in C; their torch twins
bench_relayout_torch, bench_gdn_torch, bench_attention_torch; bench_cp_agree) read a shape table of it.
A Python program run bare with MASKPACK_BENCH_SHAPES pointing at a file of tiny tables measures those;
a C program's defaults are the header generated from shapes.json at build time (it agrees with the
file, and a bare run prints the file's shape), and its options override them; bench_attention gives its
torch co-process the same shape. Bad shapes end a program with one line naming the option or entry.

The C programs are looked for in MASKPACK_BUILD (default: build/, as `make build` leaves it)."""

import json
import os
import re
import subprocess
import sys

import pytest

import maskpack

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)
try:
    import bench_shapes
    import gen_shapes_header
finally:
    sys.path.pop(0)

# the programs that had their shapes written in their code, and the table each reads now
TABLES = {"bench_derive": "derive", "bench_relayout": "relayout", "bench_relayout_torch": "relayout",
          "bench_gdn": "gdn", "bench_gdn_torch": "gdn", "bench_attention": "attention",
          "bench_attention_torch": "attention", "bench_cp_agree": "cp_agree"}
C_TABLES = ["derive", "relayout", "gdn", "attention"]  # what bench/meson.build generates bench_shapes.h with

# tiny shapes, none of them a default, so a program that printed its own would fail
TINY = {
    "derive": {"batch": 3, "seq": 96, "tokens": 640, "segments": 5, "dense": 200},
    "relayout": {"cases": ["tiny:2x48x8", "wee:3x40x4"]},
    "gdn": {"tokens": 96, "segments": 3, "heads": 2, "value-heads": 4, "key-dim": 16, "value-dim": 24},
    "attention": {"seq": 48, "heads": 2, "head-dim": 16, "docs": [20, 12, 28]},
    "cp_agree": {"lengths": [24, 40], "heads": 2, "head-dim": 8},
}


def build_dir():
    """The meson build whose bench programs are tested: MASKPACK_BUILD, else build/."""
    return os.environ.get("MASKPACK_BUILD") or os.path.join(ROOT, "build")


def c_program(rel):
    """The path of a C benchmark program of the build; the test fails (not skips) when it is missing."""
    path = os.path.join(build_dir(), rel)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is not built (make build, or set MASKPACK_BUILD to a build folder)")
    return path


def env(shapes_file=None):
    """The environment of a program run: this maskpack importable, and the shapes file to read."""
    e = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(maskpack.__file__)))
    e.pop("MASKPACK_BENCH_SHAPES", None)
    if shapes_file:
        e["MASKPACK_BENCH_SHAPES"] = str(shapes_file)
    return e


@pytest.fixture
def tiny_file(tmp_path):
    """bench/shapes.json with the TINY tables in place of its own."""
    shapes = bench_shapes.load(bench_shapes.PATH)
    shapes["tables"] = dict(shapes["tables"], **TINY)
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps(shapes))
    return path


def run(cmd, shapes_file=None, timeout=300):
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env(shapes_file))
    return r


def first_line_with(cmd, needle, timeout=120):
    """Runs cmd until it prints a line containing needle (a bare run's shape, printed before the long
    measurements), then ends it; returns that line, or fails with what it printed."""
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env())
    seen = []
    try:
        for line in p.stdout:
            seen.append(line)
            if needle in line:
                return line
    finally:
        p.kill()
        p.wait(timeout=timeout)
    pytest.fail(f"{cmd[0]} never printed {needle!r}:\n{''.join(seen)}")


# ---- shapes.json ----------------------------------------------------------------------------------


def test_every_program_reads_a_table_and_twins_share_one():
    shapes = bench_shapes.load(bench_shapes.PATH)
    for name, table in TABLES.items():
        p = bench_shapes.entry(name, shapes)
        assert p and p.get("table") == table and p.get("reads") and p["shapes"] == "args", name
        assert isinstance(shapes["tables"][table], dict) and shapes["tables"][table], table
        opts = bench_shapes.table_args(name, shapes)
        assert opts == bench_shapes.options(shapes["tables"][table]) and len(opts) >= 2, name
    # no program the report runs keeps shapes of its own
    assert not [p["name"] for p in shapes["programs"] if "left_out" not in p and "fixed" in p.get("shapes", "")]
    # the torch baseline of a C program measures the C program's table
    for c, py in (("bench_relayout", "bench_relayout_torch"), ("bench_gdn", "bench_gdn_torch"),
                  ("bench_attention", "bench_attention_torch")):
        assert bench_shapes.table_args(c, shapes) == bench_shapes.table_args(py, shapes)


def test_options_of_a_table():
    assert bench_shapes.options({"seq": 48, "head-dim": 16, "docs": [20, 12], "cases": ["a:1x2x3", "b:4x5x6"]}) == [
        "--seq", "48", "--head-dim", "16", "--docs", "20,12", "--cases", "a:1x2x3,b:4x5x6"]


# ---- the Python programs: a bare run measures the file's shapes -----------------------------------


PY_CASES = {
    "bench_relayout_torch": (["bench/bench_relayout_torch.py"],
                             ["tiny: [2 x 48] x 8 bf16", "wee: [3 x 40] x 4 bf16"]),
    "bench_gdn_torch": (["bench/gdn/bench_gdn_torch.py", "--runs", "1", "--threads", "1"],
                        ["T 96 in 3 segments, H 2, HV 4, K 16, V 24, threads 1"]),
    "bench_attention_torch": (["bench/attention/bench_attention_torch.py", "--reps", "1", "--threads", "1"],
                              ["shape S=48 H=2 D=16 docs=20,12,28", "sdpa_fwd_packed3_dense_mask "]),
    "bench_cp_agree": (["bench/bench_cp_agree.py", "--calls", "1", "--rounds", "1"],
                       ["packed lengths 24,40, H 2, D 8"]),
}


@pytest.mark.parametrize("name", sorted(PY_CASES))
def test_python_program_measures_the_tables_shapes(name, tiny_file):
    script, expect = PY_CASES[name]
    r = run([sys.executable] + script, tiny_file)
    assert r.returncode == 0, r.stdout + r.stderr
    for text in expect:
        assert text in r.stdout, (text, r.stdout)
    if name == "bench_relayout_torch":  # both cases of the table, in its order, and nothing else
        assert re.findall(r"^(\w[\w-]*): \[", r.stdout, re.M) == ["tiny", "wee"], r.stdout


# ---- the C programs: the generated header, a bare run, the options ----------------------------------


def header_tables(text):
    """The option lists of bench_shapes.h's BENCH_SHAPES_<TABLE> macros, by table."""
    out = {}
    for m in re.finditer(r"^#define BENCH_SHAPES_(\w+) (.*)$", text, re.M):
        out[m[1].lower()] = re.findall(r'"((?:[^"\\]|\\.)*)"', m[2])
    return out


def test_generated_header_agrees_with_shapes_json():
    shapes = bench_shapes.load(bench_shapes.PATH)
    with open(os.path.join(build_dir(), "bench", "bench_shapes.h")) as f:
        built = header_tables(f.read())
    assert set(built) == set(C_TABLES)
    for t in C_TABLES:
        assert built[t] == bench_shapes.options(shapes["tables"][t]), t
    # the build generates it from shapes.json, an input of the step (an edit rebuilds the programs)
    with open(os.path.join(BENCH, "meson.build")) as f:
        meson = f.read()
    assert "'shapes.json'" in meson and "gen_shapes_header.py" in meson
    assert all(f"'{t}'" in meson for t in C_TABLES)
    for src in ("bench_derive.c", "bench_relayout.c", "gdn/bench_gdn.c", "attention/bench_attention.c"):
        with open(os.path.join(BENCH, src)) as f:
            code = f.read()
        assert '#include "bench_shapes.h"' in code and "BENCH_SHAPES_" in code, src


def test_generator_writes_the_tables_it_is_given(tiny_file, tmp_path):
    out = tmp_path / "bench_shapes.h"
    r = run([sys.executable, "bench/gen_shapes_header.py", str(tiny_file), str(out)] + C_TABLES)
    assert r.returncode == 0, r.stderr
    got = header_tables(out.read_text())
    assert got == {t: bench_shapes.options(TINY[t]) for t in C_TABLES}
    assert got["attention"] == ["--seq", "48", "--heads", "2", "--head-dim", "16", "--docs", "20,12,28"]


def test_c_programs_bare_run_measures_shapes_json():
    """No shape option given: each prints the shape of bench/shapes.json's table (read before the long
    measurements start, then ended)."""
    t = bench_shapes.load(bench_shapes.PATH)["tables"]
    d = t["derive"]
    first_line_with([c_program("bench/bench_derive")], f"padded batch [{d['batch']} x {d['seq']}]")
    label, dims = t["relayout"]["cases"][0].split(":")
    B, S, C = dims.split("x")
    first_line_with([c_program("bench/bench_relayout")], f"{label}: [{B} x {S}] x {C} bf16")
    g = t["gdn"]
    first_line_with([c_program("bench/gdn/bench_gdn"), "1", "1"],
                    f"problem: T {g['tokens']} in {g['segments']} segments, H {g['heads']}, HV {g['value-heads']}, "
                    f"K {g['key-dim']}, V {g['value-dim']};")
    a = t["attention"]
    line = first_line_with([c_program("bench/attention/bench_attention"), "--threads", "1", "--reps", "1",
                            "--no-torch", "--only", "1"], "[1] f32 forward")
    assert f"S={a['seq']} D={a['head-dim']} batch*heads={a['heads']}" in line, line


def test_c_programs_take_shape_options():
    r = run([c_program("bench/bench_derive"), "--batch", "3", "--seq", "96", "--tokens", "640", "--segments", "5",
             "--dense", "200"])
    assert r.returncode == 0, r.stdout + r.stderr
    for text in ("padded batch [3 x 96]", "mask2d [3x96] u8:", "cu_seqlens [4] i32:",
                 "block_mask [640 tokens, 5 segments,", "mask4d [1,1,200,200] bool"):
        assert text in r.stdout, (text, r.stdout)
    r = run([c_program("bench/bench_relayout"), "1", "--cases", "tiny:2x48x8,wee:3x40x4"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.findall(r"^(\w+): \[(\d+) x (\d+)\] x (\d+) bf16", r.stdout, re.M) == [
        ("tiny", "2", "48", "8"), ("wee", "3", "40", "4")]
    r = run([c_program("bench/gdn/bench_gdn"), "1", "1", "--tokens", "96", "--segments", "3", "--heads", "2",
             "--value-heads", "4", "--key-dim", "16", "--value-dim", "24"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "problem: T 96 in 3 segments, H 2, HV 4, K 16, V 24;" in r.stdout


def test_bench_attention_gives_its_torch_co_process_the_same_shape():
    opts = ["--seq", "48", "--heads", "2", "--head-dim", "16", "--docs", "20,12,28"]
    r = run([c_program("bench/attention/bench_attention"), "--threads", "1", "--reps", "1", "--only", "1,3",
             "--python", sys.executable] + opts)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--serve --threads 1 " + " ".join(opts) + "," in r.stdout, r.stdout
    assert "did not start" not in r.stdout
    assert "[1] f32 forward S=48 D=16 batch*heads=2" in r.stdout
    assert "[3] 3 documents (12..28 tokens) packed into 60 tokens, causal, H=2 D=16" in r.stdout
    # torch answered both measurements (the packed one under the name of 3 documents): no "nan ms"
    assert re.search(r"torch SDPA \d+\.\d+ ms", r.stdout), r.stdout
    assert re.search(r"dense block-diagonal mask \d+\.\d+ ms", r.stdout), r.stdout


# ---- bad shapes: one line naming the option or entry, non-zero, no crash --------------------------


@pytest.mark.parametrize("cmd,named", [
    (["bench/bench_derive", "--seq", "0"], "--seq"),
    (["bench/bench_derive", "--segments", "700", "--tokens", "640"], "--segments"),
    (["bench/bench_derive", "--batch"], "--batch"),
    (["bench/bench_relayout", "--cases", "tiny:2x48"], "--cases"),
    (["bench/bench_relayout", "--cases", "tiny:2x48x8,"], "--cases"),
    (["bench/gdn/bench_gdn", "--tokens", "97", "--segments", "3"], "--segments"),
    (["bench/gdn/bench_gdn", "--key-dim", "x"], "--key-dim"),
    (["bench/attention/bench_attention", "--docs", "20,,12"], "--docs"),
    (["bench/attention/bench_attention", "--head-dim", "-4"], "--head-dim"),
])
def test_c_program_bad_shape_option(cmd, named):
    r = run([c_program(cmd[0])] + cmd[1:], timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and lines[0].startswith(os.path.basename(cmd[0]) + ":"), r.stderr


def test_generator_names_a_missing_table(tmp_path):
    shapes = bench_shapes.load(bench_shapes.PATH)
    del shapes["tables"]["gdn"]
    f = tmp_path / "shapes.json"
    f.write_text(json.dumps(shapes))
    r = run([sys.executable, "bench/gen_shapes_header.py", str(f), str(tmp_path / "h.h")] + C_TABLES)
    assert r.returncode == 1 and not (tmp_path / "h.h").exists()
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "'gdn'" in lines[0] and "Traceback" not in r.stderr, r.stderr


def parser():
    """A program's parser of the shape options, as the Python programs declare them."""
    import argparse

    ap = argparse.ArgumentParser(prog="prog.py")
    ap.add_argument("--lengths", type=bench_shapes.integers(1, 1 << 20))
    ap.add_argument("--heads", type=bench_shapes.integer(1, 256))
    ap.add_argument("--head-dim", type=bench_shapes.integer(1, 1024))
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    return ap


def exit_line(capsys, fn):
    """fn() must end the program: returns (its exit code, its one line on stderr)."""
    with pytest.raises(SystemExit) as e:
        fn()
    code = e.value.code
    err = capsys.readouterr().err.strip()
    if isinstance(code, str):  # sys.exit("message"): Python prints it and exits 1
        err, code = code, 1
    assert len(err.splitlines()) == 1, err
    return code, err


def test_apply_reads_the_table_and_names_what_is_wrong(tmp_path, monkeypatch, capsys, tiny_file):
    monkeypatch.setenv("MASKPACK_BENCH_SHAPES", str(tiny_file))
    a = bench_shapes.apply(parser(), "bench_cp_agree", table=True).parse_args([])
    assert (a.lengths, a.heads, a.head_dim, a.calls, a.rounds) == ([24, 40], 2, 8, 200, 7)
    assert bench_shapes.apply(parser(), "bench_cp_agree", table=True).parse_args(["--heads", "3"]).heads == 3
    # a bad option on the command line
    code, err = exit_line(capsys, lambda: bench_shapes.apply(parser(), "bench_cp_agree", table=True)
                          .parse_args(["--heads", "0"]))
    assert code == 2 and err.startswith("prog.py: argument --heads: expected an integer in [1, 256]"), err
    shapes = json.loads(tiny_file.read_text())
    # a bad value in the file: the message names the file and the option
    shapes["tables"]["cp_agree"]["lengths"] = [24, "x"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(shapes))
    monkeypatch.setenv("MASKPACK_BENCH_SHAPES", str(bad))
    code, err = exit_line(capsys, lambda: bench_shapes.apply(parser(), "bench_cp_agree", table=True))
    assert code == 2 and str(bad) in err and "--lengths" in err, err
    # the program's entry, or its table, missing from the file
    for drop, named in (("table", "'cp_agree'"), ("entry", "'bench_cp_agree'")):
        s = json.loads(tiny_file.read_text())
        if drop == "table":
            del s["tables"]["cp_agree"]
        else:
            s["programs"] = [p for p in s["programs"] if p.get("name") != "bench_cp_agree"]
        bad.write_text(json.dumps(s))
        code, err = exit_line(capsys, lambda: bench_shapes.apply(parser(), "bench_cp_agree", table=True))
        assert code != 0 and named in err and str(bad) in err, err
    # a file that is not JSON, or not there
    bad.write_text("{")
    code, err = exit_line(capsys, lambda: bench_shapes.apply(parser(), "bench_cp_agree", table=True))
    assert code != 0 and str(bad) in err, err
    monkeypatch.setenv("MASKPACK_BENCH_SHAPES", str(tmp_path / "none.json"))
    code, err = exit_line(capsys, lambda: bench_shapes.apply(parser(), "bench_cp_agree", table=True))
    assert code != 0 and "none.json" in err, err


def test_python_program_without_its_table_says_so(tmp_path):
    shapes = bench_shapes.load(bench_shapes.PATH)
    del shapes["tables"]["gdn"]
    f = tmp_path / "shapes.json"
    f.write_text(json.dumps(shapes))
    r = run([sys.executable, "bench/gdn/bench_gdn_torch.py", "--runs", "1"], f, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "'gdn'" in lines[0] and lines[0].startswith("bench_gdn_torch.py:"), r.stderr


def test_bench_bundle_and_thread_pool_take_their_shapes():
    """The two programs whose shapes are plain options: shapes.json's "full" arguments name their shapes (a
    bare run takes them through bench_shapes.apply), options given win, and a bad shape is one line, exit 2."""
    shapes = bench_shapes.load(bench_shapes.PATH)
    full = bench_shapes.entry("bench_bundle", shapes)["full"]
    assert {"--B", "--S", "--tokens", "--sequences"} <= set(full)
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench_bundle.py"), "--pairs", "1", "--B", "3",
                        "--S", "64", "--tokens", "300", "--sequences", "7"], capture_output=True, text=True,
                       env=env(), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "shapes: padded B = 3, S = 64; packed row 300 tokens / 7 sequences" in r.stdout
    assert "B=3, S=64 padded -> padding-free" in r.stdout
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench_bundle.py"), "--pairs", "1", "--tokens", "3",
                        "--sequences", "7"], capture_output=True, text=True, env=env(), timeout=300)
    assert r.returncode == 2 and "--tokens (3) must be at least --sequences (7)" in r.stderr
    assert "--cases" in bench_shapes.entry("bench_thread_pool", shapes)["full"]
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench_thread_pool.py"), "--pairs", "1", "--threads", "2",
                        "--cases", "attention:2x40"], capture_output=True, text=True, env=env(), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "attention 2 x 40 tokens" in r.stdout and "attention 4 x 64" not in r.stdout
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench_thread_pool.py"), "--cases", "conv:2x40"],
                       capture_output=True, text=True, env=env(), timeout=300)
    assert r.returncode == 2 and "--cases: 'conv:2x40'" in r.stderr and "Traceback" not in r.stderr
