"""bench/report.py (make bench) in --quick mode on a tiny shapes file: one program run and parsed, the
sweeps (maskpack against torch SDPA and transformers' GDN rule) at two short lengths, cp-sim; the report
states the machine and the load, tabulates medians with their spread, and the plots are written."""

import json
import os
import subprocess
import sys

import maskpack

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_report_quick(tmp_path):
    with open(os.path.join(ROOT, "bench", "shapes.json")) as f:
        shapes = json.load(f)
    names = [p["name"] for p in shapes["programs"]]
    assert len(names) == len(set(names))
    for p in shapes["programs"]:  # every entry either runs (both argument sets) or says why not
        assert p.get("left_out") or ("cmd" in p and "quick" in p and "full" in p and p.get("baselines")), p["name"]
    shapes["sweep"].update(quick_seq_lens=[32, 64], quick_reps=2)
    shapes["cp_sim"]["quick_tokens"] = 20000
    shapes["programs"] = [dict(p, quick=["--n", "2000", "--reps", "1"]) if p["name"] == "bench_plan" else p
                          for p in shapes["programs"]]
    sp = tmp_path / "shapes.json"
    sp.write_text(json.dumps(shapes))
    out = tmp_path / "report.md"
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(maskpack.__file__)))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "report.py"), "--quick", "--only", "bench_plan",
                        "--shapes", str(sp), "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    text = out.read_text()
    assert "load average" in text and "cores" in text and "torch " in text and "kernels ran:" in text
    assert "| 32 |" in text and "| 64 |" in text  # the sweep rows, medians with the 25-75 % spread
    assert "torch sdpa ms" in text and "transformers torch_chunk ms" in text
    assert "left out: an A/B" in text
    res = json.loads((tmp_path / "report" / "report.json").read_text())
    plan = next(p for p in res["programs"] if p["name"] == "bench_plan")
    assert plan["status"] in ("ok", "not built"), plan["status"]
    for name, rows in res["sweeps"].items():
        assert [row["S"] for row in rows] == [32, 64], name
        for row in rows:
            for side in row["times"].values():
                assert side["p25"] <= side["median"] <= side["p75"] and side["n"] == 2
    for f in ("sweep_attention_causal.png", "sweep_gated_delta_rule.png"):
        assert (tmp_path / "report" / f).stat().st_size > 1000
    if os.access(os.path.join(ROOT, "build", "maskpack"), os.X_OK):
        assert {row["scheme"] for row in res["cp_sim"]["rows"]} == {"zigzag", "contiguous", "area-balanced"}
        assert (tmp_path / "report" / "cp_schemes.png").exists()


def test_gdn_flop_count_matches_bench_gdn():
    """report.py counts the chunked rule's work as bench_gdn.c does: its printed 'chunked matrix work'
    for the shape of shapes.json's table "gdn" (bench_gdn's default; T in equal segments)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import bench_shapes
        import report
    finally:
        sys.path.pop(0)
    assert 5 < 8 * 2 * report.gdn_chunk_macs(512, 16, 32, 128, 128) / 1e9 < 20  # T 4096 in 8, H 16, HV 32, K = V = 128
    g = bench_shapes.load(bench_shapes.PATH)["tables"]["gdn"]
    n = g["segments"]
    macs = report.gdn_chunk_macs(g["tokens"] // n, g["heads"], g["value-heads"], g["key-dim"], g["value-dim"])
    gflop = n * 2 * macs / 1e9
    r = os.path.join(ROOT, "build", "bench", "gdn", "bench_gdn")
    assert report.spread([3.0, 1.0, 2.0])["median"] == 2.0
    if not os.access(r, os.X_OK):
        return
    # bench_gdn prints the figure before it times anything (line by line): read just that line
    p = subprocess.Popen([r, "1", "1"], stdout=subprocess.PIPE, text=True)
    try:
        for line in p.stdout:
            if line.startswith("problem:"):
                assert f"{gflop:.2f} GFLOP" in line, (line, gflop)
                break
    finally:
        p.kill()
        p.wait()


def test_programs_marked_reads_take_their_defaults_from_shapes_json():
    """Every program shapes.json marks "reads" calls bench_shapes.apply with its own name (and table=True
    when its entry names a shape table), or, a C program, includes the header generated from its table
    (bench/meson.build generates it with that table); its full arguments have no {placeholder} left."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import bench_shapes
    finally:
        sys.path.pop(0)
    shapes = bench_shapes.load()
    reads = [p for p in shapes["programs"] if p.get("reads")]
    assert len(reads) >= 7
    with open(os.path.join(ROOT, "bench", "meson.build")) as f:
        meson = f.read()
    for p in reads:
        script = next((c for c in p["cmd"] if c.endswith(".py")), None)
        if script is None:  # a C program: {build}/bench/... built from bench/....c
            src = p["cmd"][0].replace("{build}/", "") + ".c"
            with open(os.path.join(ROOT, src)) as f:
                code = f.read()
            assert p.get("table") and f"BENCH_SHAPES_{p['table'].upper()}" in code, p["name"]
            assert f"'{p['table']}'" in meson, p["name"]
        else:
            call = f"bench_shapes.apply(ap, {p['name']!r}" + (", table=True)" if p.get("table") else ")")
            with open(os.path.join(ROOT, script)) as f:
                assert call in f.read(), p["name"]
        args = (bench_shapes.full_args(p["name"], shapes) or []) + bench_shapes.table_args(p["name"], shapes)
        assert args and "{" not in " ".join(args), p["name"]
