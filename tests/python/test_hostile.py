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


# ---- errors that name the problem ---------------------------------------------------------------------

def _error(fn, status, argument, *fragments):
    with pytest.raises(Error) as ei:
        fn()
    e = ei.value
    assert e.status == status, e
    assert e.argument == argument, e
    for f in fragments:
        assert f in str(e), (f, str(e))
    return e


def test_integers_past_int64_are_errors_naming_the_argument():
    # were OverflowError "int too big to convert"
    e = _error(lambda: Layout.from_lengths([3, 2 ** 63]), "MASKPACK_ERR_OVERFLOW", "lengths", "lengths[1]",
               str(2 ** 63))
    assert e.index == (1,)
    _error(lambda: Layout.from_lengths(np.array([2 ** 63], np.uint64)), "MASKPACK_ERR_OVERFLOW", "lengths")
    _error(lambda: Layout.from_cu_seqlens([0, 2 ** 63]), "MASKPACK_ERR_OVERFLOW", "cu_seqlens")
    _error(lambda: Layout.from_lengths([3], placement="packed", capacity=2 ** 64), "MASKPACK_ERR_OVERFLOW",
           "capacity")


def _gdn_inputs(T=5, H=1, K=4, V=4):
    torch.manual_seed(0)
    return (torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, H, V), -torch.rand(T, H), torch.rand(T, H))


def test_gated_delta_rule_argument_errors():
    L = Layout.from_lengths([3, 2], placement="packed")
    q, k, v, g, beta = _gdn_inputs()
    # K = 0: was ZeroDivisionError
    _error(lambda: maskpack.gated_delta_rule(q[..., :0], k[..., :0], v, g, beta, L), "MASKPACK_ERR_SHAPE", "q",
           "K >= 1")
    # numpy inputs: was AttributeError "no attribute 'dim'"
    with pytest.raises(TypeError, match="q: expected a torch.Tensor, found numpy.ndarray"):
        maskpack.gated_delta_rule(q.numpy(), k, v, g, beta, L)
    with pytest.raises(TypeError, match="beta: expected a torch.Tensor"):
        maskpack.gated_delta_rule(q, k, v, g, beta.numpy(), L)
    # layout=None: was AttributeError about n_segments
    with pytest.raises(TypeError, match="layout: expected a maskpack.Layout, found NoneType"):
        maskpack.gated_delta_rule(q, k, v, g, beta, None)
    # threads 0 / -1 / 257 refused as attention and relayout do (were clamped silently)
    for bad in (0, -1, 257):
        _error(lambda: maskpack.gated_delta_rule(q, k, v, g, beta, L, threads=bad), "MASKPACK_ERR_INVALID_ARGUMENT",
               "threads", f"found {bad}")
    with pytest.raises(TypeError, match="threads: expected an int"):
        maskpack.gated_delta_rule(q, k, v, g, beta, L, threads=1.5)
    o, _ = maskpack.gated_delta_rule(q, k, v, g, beta, L, threads=np.int64(2))
    assert torch.equal(o, maskpack.gated_delta_rule(q, k, v, g, beta, L, threads=1)[0])


def test_causal_conv1d_width_zero_is_a_shape_error():
    L = Layout.from_lengths([3, 2], placement="packed")
    x = torch.randn(5, 8)
    # was torch's RuntimeError about a negative dimension
    _error(lambda: maskpack.causal_conv1d(x, torch.randn(8, 0), L), "MASKPACK_ERR_SHAPE", "weight", "W >= 1")
    _error(lambda: maskpack.causal_conv1d(x, torch.randn(8, 1, 0), L), "MASKPACK_ERR_SHAPE", "weight")
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        maskpack.causal_conv1d(x.numpy(), torch.randn(8, 4), L)


def test_unpack_pad_value_must_fit_the_output():
    L = Layout.from_lengths([3, 5], placement="right", capacity=5)
    packed32 = torch.arange(8, dtype=torch.int32).reshape(8, 1)
    # 1.5 into int32 silently wrote 1
    _error(lambda: L.unpack(packed32, pad_value=1.5), "MASKPACK_ERR_VALUE", "pad_value", "1.5", "int32")
    assert L.unpack(packed32, pad_value=-1.0)[0, 4, 0].item() == -1  # an integral float is fine
    packed8 = torch.arange(8, dtype=torch.int8).reshape(8, 1)
    # 1000 into int8 was OverflowError
    _error(lambda: L.unpack(packed8, pad_value=1000), "MASKPACK_ERR_OVERFLOW", "pad_value", "[-128, 127]", "1000")
    assert L.unpack(packed8, pad_value=-128)[0, 3, 0].item() == -128
    # a string was ValueError from numpy
    with pytest.raises(TypeError, match="pad_value: expected a number, found str"):
        L.unpack(packed32, pad_value="x")
    _error(lambda: L.unpack(torch.zeros(8, 1, dtype=torch.float16), pad_value=1e6), "MASKPACK_ERR_OVERFLOW",
           "pad_value", "float16")
    assert L.unpack(torch.zeros(8, 1), pad_value=float("-inf"))[0, 4, 0].item() == float("-inf")


def test_relayout_shape_error_shows_every_dimension():
    L = Layout.from_lengths([3, 4], placement="right", capacity=4)
    x = np.zeros((3, 5, 7), np.float32)  # the grid is [2, 4]
    with pytest.raises(Error) as ei:
        L.pack(x)
    assert ei.value.status == "MASKPACK_ERR_SHAPE"
    assert "[3, 5, 7]" in str(ei.value), str(ei.value)


def test_one_threads_rule_and_one_layout_check_for_every_family():
    # attention, Gated DeltaNet, conv and the moves read threads= and layout through one path
    import torch

    lay = maskpack.Layout.from_lengths([3, 2], placement="packed")
    right = maskpack.Layout.from_lengths([3, 2], placement="right")
    q = torch.randn(5, 2, 8)
    g, beta = -torch.rand(5, 2), torch.rand(5, 2)
    calls = {
        "attention": lambda th, L=lay: maskpack.attention(q, q, q, L, threads=th),
        "gated_delta_rule": lambda th, L=lay: maskpack.gated_delta_rule(q, q, q, g, beta, L, threads=th),
        "causal_conv1d": lambda th, L=lay: maskpack.causal_conv1d(torch.randn(5, 4), torch.randn(4, 3), L,
                                                                  threads=th),
        "relayout": lambda th, L=lay: maskpack.relayout(torch.randn(5, 3), L, right, threads=th),
    }
    for name, call in calls.items():
        call(2)  # a valid count runs
        for bad in (0, -1, 257):
            with pytest.raises(maskpack.Error, match=rf"threads: expected in \[1, 256\], found {bad}") as e:
                call(bad)
            assert e.value.argument == "threads" and e.value.status == "MASKPACK_ERR_INVALID_ARGUMENT", name
        for bad in (True, 1.5, "2"):
            with pytest.raises(TypeError, match="threads: expected an int"):
                call(bad)
        with pytest.raises(TypeError, match="(layout|src): expected a maskpack.Layout, found int"):
            call(2, 12345)
    with pytest.raises(TypeError, match="dst: expected a maskpack.Layout, found str"):
        maskpack.relayout(torch.randn(5, 3), lay, "right")
