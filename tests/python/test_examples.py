"""The example programs run and print what they claim: examples/python/qwen3_5_padding_free.py
trains a tiny transformers Qwen3.5 model padded (transformers' own path), padded through maskpack
and padding-free through maskpack, and exits non-zero when the losses differ."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_qwen3_5_padding_free_example_losses_agree():
    script = os.path.join(ROOT, "examples", "python", "qwen3_5_padding_free.py")
    res = subprocess.run([sys.executable, script, "--steps", "3"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    table = [ln.split() for ln in lines if ln.strip()[:1].isdigit()]
    assert len(table) == 3 and all(len(row) == 4 for row in table)  # step + three runs
    for row in table:
        padded, padded_mp, packed_mp = map(float, row[1:])
        assert abs(padded_mp - padded) <= 1e-4 * abs(padded) and abs(packed_mp - padded) <= 1e-4 * abs(padded)
    assert "(same)" in lines[-1]
