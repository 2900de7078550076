"""Hostile input through the Python API: every case ends fast in a specific error or the right
answer, with nothing crashed, nothing hung and nothing written (issue: hostile input)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import maskpack
from maskpack import Error, Layout

BIG = 2 ** 50


def run_bounded(code, seconds=60):
    """Runs `code` in a fresh interpreter with this maskpack; a hang fails the test instead of the run."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(maskpack.__file__))] + sys.path)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=seconds, env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout


# ---- zero-size dimensions: work proportional to the bytes ------------------------------------------

def test_zero_size_dimension_constructors_return_at_once():
    # before: every one of the 2^50 rows was visited (never returned)
    out = run_bounded(f"""
        import numpy as np, maskpack
        from maskpack import Layout
        B = {BIG}
        for L in [Layout.from_mask2d(np.zeros((B, 0), np.int8)),
                  Layout.from_mask2d(np.zeros((B, 0), np.int32), convention="doc_id"),
                  Layout.from_position_ids(np.zeros((B, 0), np.int64)),
                  Layout.from_position_ids(np.zeros((3, B, 0), np.int64)),
                  Layout.from_mask4d(np.zeros((B, 1, 0, 0), np.bool_), convention="keep")]:
            print(L.n_rows, L.q_width, L.n_segments, L.n_tokens)
        m = maskpack.mask2d_from_mask4d(np.zeros((B, 1, 0, 0), np.bool_), "keep")
        print(m.shape)
    """)
    lines = out.split("\n")
    assert lines[:5] == [f"{BIG} 0 0 0"] * 5
    assert lines[5] == f"({BIG}, 0)"


def test_zero_size_layouts_match_small_ones():
    # the short cut gives what the full path gives on a small empty input
    small = Layout.from_mask4d(np.zeros((2, 1, 0, 0), np.bool_), convention="keep")
    assert small.rule == Layout.from_mask2d(np.zeros((2, 0), np.int8)).rule
    assert (small.n_rows, small.q_width, small.n_segments) == (2, 0, 0)
    wide = Layout.from_position_ids(np.zeros((0, 7), np.int64))
    assert (wide.n_rows, wide.q_width, wide.n_segments) == (0, 7, 0)
