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


# ---- outputs that overlap themselves ---------------------------------------------------------------

def _overlap_error(excinfo, argument):
    e = excinfo.value
    assert isinstance(e, Error)
    assert e.status == "MASKPACK_ERR_OVERLAP", e
    assert e.argument == argument, e
    assert "overlaps itself" in str(e)


def test_pack_and_unpack_refuse_an_expanded_out():
    L = Layout.from_lengths([3, 5], placement="right", capacity=5)
    x = torch.arange(2 * 5 * 4, dtype=torch.float32).reshape(2, 5, 4)
    out = torch.zeros(1, 4).expand(8, 4)  # every token would write the same 4 floats
    with pytest.raises(Error) as ei:
        L.pack(x, out=out)
    _overlap_error(ei, "out")
    assert not out.any()
    packed = L.pack(x)
    up = torch.zeros(1, 1, 4).expand(2, 5, 4)
    with pytest.raises(Error) as ei:
        L.unpack(packed, out=up)
    _overlap_error(ei, "out")
    # its own memory per element: accepted
    assert torch.equal(L.unpack(packed, out=torch.empty(2, 5, 4)), L.unpack(packed))


def test_gated_delta_rule_and_attention_refuse_expanded_outputs():
    torch.manual_seed(0)
    L = Layout.from_lengths([3, 2], placement="packed")
    T, H, K, V = 5, 1, 4, 4
    q, k, v = torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, H, V)
    g, beta = -torch.rand(T, H), torch.rand(T, H)
    o_exp = torch.zeros(1, H, V).expand(T, H, V)
    state = torch.zeros(L.n_segments, H, K, V)
    with pytest.raises(Error) as ei:
        maskpack.gated_delta_rule(q, k, v, g, beta, L, out=(o_exp, state))
    _overlap_error(ei, "o")
    st_exp = torch.zeros(1, H, K, V).expand(L.n_segments, H, K, V)
    with pytest.raises(Error) as ei:
        maskpack.gated_delta_rule(q, k, v, g, beta, L, out=(torch.empty(T, H, V), st_exp))
    assert ei.value.status == "MASKPACK_ERR_OVERLAP"
    a_out = torch.zeros(1, H, V).expand(T, H, V)
    with pytest.raises(Error) as ei:
        maskpack.attention(q, k, v, L, out=a_out)
    _overlap_error(ei, "out")
