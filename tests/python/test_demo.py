"""maskpack.demo (``maskpack demo``, ``make run``) with tiny options: the padded, packed and cp = 2 layouts
agree (losses and gradients to float32 rounding), the JSON carries the table's fields, what cannot run is
skipped with a note (no gloo, no torch, no CLI) and bad options exit 2 with one line naming the option."""

import json
import os
import subprocess
import sys

import pytest

import maskpack
import maskpack.demo as demo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# tiny: the planner's first row of 128 tokens holds 4 sequences (5, 106, 4, 5 tokens); a 32-wide model
TINY = ["--tokens", "128", "--scale", "64", "--sequences", "24", "--steps", "2", "--hidden", "32", "--vocab", "64",
        "--threads", "1"]


def _env():
    # the child imports the maskpack this test imported, and finds the source tree's length sample
    env = dict(os.environ, MASKPACK_ROOT=ROOT)
    pkg = os.path.dirname(os.path.dirname(maskpack.__file__))
    env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_demo_json_layouts_agree(tmp_path):
    """The whole demo as `python -m maskpack.demo --json`: three layouts, each with the table's fields;
    packed and cp2 equal the padded run; the batch is the planner's first row; the hand-offs are there."""
    r = subprocess.run([sys.executable, "-m", "maskpack.demo", *TINY, "--json", "--out", str(tmp_path)],
                       capture_output=True, text=True, env=_env(), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    res = json.loads(r.stdout)
    assert res["agree"] is True
    lay = res["layouts"]
    assert list(lay) == ["padded", "packed", "cp2"]
    b = res["batch"]
    assert b["lengths"] == [5, 106, 4, 5] and b["real_tokens"] == 120 and b["padded_shape"] == [4, 106]
    for name, e in lay.items():
        for key in ("tokens", "pad_fraction", "step_ms", "losses"):
            assert key in e, (name, key)
        assert len(e["losses"]) == 2 and e["step_ms"] > 0
    assert lay["padded"]["tokens"] == "4 x 106"
    assert lay["padded"]["pad_fraction"] == pytest.approx(1 - 120 / (4 * 106))
    assert lay["packed"]["tokens"] == "1 x 120" and lay["packed"]["pad_fraction"] == 0
    # cp = 2: each sequence rounded to a multiple of 4 (8 + 108 + 4 + 8 = 128), half on each rank
    assert lay["cp2"]["tokens"] == "2 x 64"
    for name in ("packed", "cp2"):
        e = lay[name]
        assert e["agree"] is True
        assert e["loss_diff"] <= demo.TOLERANCE and e["grad_diff"] <= demo.TOLERANCE
        assert e["losses"] == pytest.approx(lay["padded"]["losses"], rel=demo.TOLERANCE)
    # the loss falls: the sequences count, the model learns them
    assert lay["padded"]["losses"][1] < lay["padded"]["losses"][0]
    h = res["handoff"]
    fa = h["flash-attn varlen"]
    assert fa["cu_seqlens_q"]["values"] == [0, 5, 111, 115, 120] and fa["max_seqlen_q"] == 106
    mg = h["Megatron PackedSeqParams (cp=2, rank 0)"]
    assert mg["cu_seqlens_q_padded"]["values"] == [0, 8, 116, 120, 128]
    npu = h["Ascend npu_fusion_attention (TND)"]
    assert npu["input_layout"] == "TND" and npu["actual_seq_qlen"]["values"] == [5, 111, 115, 120]
    assert h["sdpa (padded)"]["attn_mask"]["shape"] == [4, 1, 106, 106]
    assert res["plan"]["capacity"] == 128 and res["plan"]["multiple"] == 4


def _run_inprocess(capsys, argv):
    rc = demo.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_demo_table_and_no_gloo(capsys, monkeypatch, tmp_path):
    """The printed table (header, one line per layout, the agreement line); a torch without gloo: cp2 is
    skipped with a note saying why, padded and packed still run, exit 0."""
    import torch.distributed as dist

    monkeypatch.setenv("MASKPACK_ROOT", ROOT)
    monkeypatch.setattr(dist, "is_gloo_available", lambda: False)
    rc, out, err = _run_inprocess(capsys, [*TINY, "--no-pictures", "--out", str(tmp_path)])
    assert rc == 0, out + err
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.startswith("layout"))
    for col in ("tokens", "pad", "step ms", "speed-up", "loss per step", "d loss", "d grad"):
        assert col in header
    assert any(ln.startswith("padded (transformers)") and "reference" in ln for ln in lines)
    assert any(ln.startswith("packed (maskpack)") and "1 x 120" in ln for ln in lines)
    assert not any(ln.startswith("cp=2") for ln in lines)
    assert "every layout agrees" in out
    assert "note: cp2 skipped: this torch has no gloo backend" in out
    assert "flash-attn varlen:" in out and "Ascend npu_fusion_attention (TND):" in out


def test_demo_mpi_backend_without_mpi(capsys, monkeypatch, tmp_path):
    """--cp-backend mpi with a torch built without MPI: cp2 is skipped with a note saying why (and that
    gloo needs none); the other layouts run, exit 0."""
    import torch.distributed as dist

    monkeypatch.setenv("MASKPACK_ROOT", ROOT)
    monkeypatch.setattr(dist, "is_mpi_available", lambda: False)
    rc, out, err = _run_inprocess(capsys, [*TINY, "--layouts", "packed,cp2", "--cp-backend", "mpi", "--no-pictures",
                                           "--out", str(tmp_path)])
    assert rc == 0, out + err
    assert "note: cp2 skipped: this torch is built without the MPI backend" in out
    assert any(ln.startswith("packed (maskpack)") for ln in out.splitlines())
    assert "no padded run to compare with" in out


def test_demo_without_torch_or_cli(capsys, monkeypatch, tmp_path):
    """No torch / transformers: the training is skipped with a note naming them, the plan is still
    printed, exit 0. No CLI program: the pictures are skipped with a note."""
    monkeypatch.setenv("MASKPACK_ROOT", ROOT)
    monkeypatch.setenv("MASKPACK_CLI", str(tmp_path / "no-such-program"))
    monkeypatch.setattr(demo, "_have", lambda mod: f"No module named '{mod}'")
    rc, out, err = _run_inprocess(capsys, [*TINY, "--out", str(tmp_path)])
    assert rc == 0, out + err
    assert "note: training skipped: torch and transformers not importable" in out
    assert "note: pictures skipped: no maskpack program found" in out
    assert not any(ln.startswith("layout") for ln in out.splitlines()) and "batch: 4 sequences, 120 tokens" in out


@pytest.mark.parametrize("argv, words", [
    (["--steps", "0"], "--steps: expected an integer in [1, 100], found 0"),
    (["--tokens", "many"], "--tokens: expected an integer"),
    (["--layouts", "padded,thd"], "--layouts: expected a comma-separated subset of padded,packed,cp2"),
    (["--hidden", "40"], "--hidden: expected a multiple of 16, found 40"),
    (["--lr", "-1"], "--lr: expected a number in [0.0, 100.0]"),
    (["--lengths", "/nonexistent/lengths.txt"], "--lengths: cannot read /nonexistent/lengths.txt"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["--cp-backend", "nccl"], "--cp-backend: invalid choice: 'nccl'"),
    (["--tokens", "10"], "--tokens: expected a multiple of 4"),
    (["--scale", "4096", "--sequences", "1", "--tokens", "8"], "has no next-token target"),
])
def test_demo_bad_options_exit_2_with_one_line(capsys, argv, words):
    rc, out, err = _run_inprocess(capsys, argv)
    assert rc == 2
    assert out == ""
    assert err.startswith("maskpack demo: ") and words in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_demo_bad_length_sample(capsys, tmp_path):
    bad = tmp_path / "lengths.txt"
    bad.write_text("12\nseven\n")
    rc, out, err = _run_inprocess(capsys, ["--lengths", str(bad)])
    assert rc == 2 and "expected one integer length per line" in err


@pytest.mark.skipif(not os.access(os.path.join(ROOT, "build", "maskpack"), os.X_OK), reason="no build/maskpack (make build)")
def test_cli_demo_execs_the_python_demo():
    """`maskpack demo` runs the Python demo: its option errors come back through the CLI (exit 2), and an
    interpreter without maskpack gets the message saying what to do (exit 3)."""
    cli = os.path.join(ROOT, "build", "maskpack")
    env = dict(_env(), MASKPACK_PYTHON=sys.executable)
    r = subprocess.run([cli, "demo", "--steps", "0"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "maskpack demo: argument --steps" in r.stderr, r.stderr
    env["MASKPACK_PYTHON"] = "/nonexistent/python"
    r = subprocess.run([cli, "demo"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "cannot run /nonexistent/python" in r.stderr


def test_length_sample_file_is_its_recipe(monkeypatch, tmp_path):
    """data/sft_lengths.txt is what data/make_sft_lengths.py writes, and the demo's fallback away from the
    source tree (an installed package) regenerates the same lengths, saying so."""
    import numpy as np

    monkeypatch.setenv("MASKPACK_ROOT", ROOT)
    notes = []
    from_file, src = demo._sample_lengths(None, notes)
    assert src.endswith(os.path.join("data", "sft_lengths.txt")) and not notes
    monkeypatch.setattr(demo, "_source_root", lambda: None)
    regen, src = demo._sample_lengths(None, notes)
    assert "recipe" in src and notes and "regenerated" in notes[0]
    assert np.array_equal(from_file, regen)
    sys.path.insert(0, os.path.join(ROOT, "data"))
    try:
        import make_sft_lengths
    finally:
        sys.path.pop(0)
    assert np.array_equal(make_sft_lengths.lengths(), from_file)
    assert from_file.size == 4096 and int(np.median(from_file)) == 696
