"""tools/coverage_summary.py on a made-up gcovr report: the src/ figure without the files of an
instruction set the CPU lacks, those files' never-run lines, and the dispatch lines elsewhere."""
import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tool():
    spec = importlib.util.spec_from_file_location("coverage_summary", os.path.join(ROOT, "tools", "coverage_summary.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _summary(name, lines, lines_run, branches, branches_run):
    return {"filename": name, "line_total": lines, "line_covered": lines_run, "branch_total": branches,
            "branch_covered": branches_run}


def test_ranges():
    r = _tool().ranges
    assert r([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10"
    assert r([5]) == "5" and r([]) == ""


def test_figures_without_lacking_isa_and_its_lines(tmp_path, capsys, monkeypatch):
    # a CPU with AVX-512 but no AMX: attn_amx.c is left out of the second figure
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nflags : fpu avx2 fma avx512f avx512dq avx512bw avx512vl avx512_bf16\n")
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"files": [
        _summary("src/core/a.c", 10, 9, 20, 18),
        _summary("src/kernels/attention/attn_amx.c", 4, 0, 6, 0),
        _summary("src/kernels/attention/attn_avx512.c", 10, 10, 10, 9),
        _summary("python/_m.c", 5, 5, 2, 1),
    ]}))
    # per-line details: a.c's line 3 never ran and names AMX (dispatch); line 4 never ran, no ISA
    src = tmp_path / "src" / "core"
    src.mkdir(parents=True)
    (src / "a.c").write_text("int x;\nint y;\nif (has_amx()) use_amx();\nreturn 0;\n")
    details = tmp_path / "details.json"
    details.write_text(json.dumps({"files": [
        {"file": "src/core/a.c", "lines": [{"line_number": 1, "count": 1}, {"line_number": 3, "count": 0},
                                           {"line_number": 4, "count": 0}]},
        {"file": "src/kernels/attention/attn_amx.c", "lines": [{"line_number": n, "count": 0} for n in (5, 6, 7, 9)]},
    ]}))
    monkeypatch.chdir(tmp_path)
    assert _tool().main([str(summary), "--details", str(details), "--cpuinfo", str(cpuinfo)]) == 0
    out = capsys.readouterr().out
    rows = {line.split("lines")[0].strip(): line for line in out.splitlines() if "branches" in line}
    # all of src/: 27 of 36 branches; without attn_amx.c: 27 of 30 (90.00%)
    assert "branches     27/30      90.00%" in rows["src/ without ISA code not run here"]
    assert "branches     27/36      75.00%" in rows["src/ (all)"]
    assert "needs AMX: no amx_tile amx_bf16" in rows["src/kernels/attention/attn_amx.c"]
    assert "never run: all 4 lines with code (5-9)" in out
    assert "lines elsewhere in src/ that only a CPU with AMX runs (never run here): 1" in out
    assert "src/core/a.c:3: if (has_amx()) use_amx();" in out
    assert "a.c:4" not in out
