"""maskpack.gated_delta_rule(..., out=(o, final_state)): preallocated outputs.

Checks: results written into reused (stale, NaN-filled) buffers equal bitwise a fresh call, pad rows
included; strided (non-contiguous) outputs are honoured; wrong shapes or dtypes are refused with
the outputs untouched; out= is refused while autograd records.
"""

import pytest
import torch
import torch.nn.functional as F

import maskpack

LENGTHS, WIDTH, H, HV, K, V = [70, 130, 0], 140, 2, 4, 32, 16


def inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    lead = (len(LENGTHS), WIDTH)
    q = torch.randn(*lead, H, K, generator=gen)
    k = torch.randn(*lead, H, K, generator=gen)
    v = torch.randn(*lead, HV, V, generator=gen)
    g = -F.softplus(torch.randn(*lead, HV, generator=gen)) * 0.5
    beta = torch.sigmoid(torch.randn(*lead, HV, generator=gen))
    return q, k, v, g, beta


@pytest.fixture
def layout():
    return maskpack.Layout.from_lengths(LENGTHS, placement="right", capacity=WIDTH)


def stale_outputs():
    o = torch.full((len(LENGTHS), WIDTH, HV, V), float("nan"))
    ht = torch.full((len(LENGTHS), HV, K, V), float("nan"))
    return o, ht


@pytest.mark.parametrize("chunked", [True, False])
def test_out_reused_equals_fresh_bitwise(layout, chunked):
    o_buf, ht_buf = stale_outputs()
    for seed in (1, 2):  # the second call overwrites the first call's results in the same memory
        args = inputs(seed)
        h0 = torch.randn(len(LENGTHS), HV, K, V, generator=torch.Generator().manual_seed(seed))
        ref_o, ref_ht = maskpack.gated_delta_rule(*args, layout, initial_state=h0, chunked=chunked)
        o, ht = maskpack.gated_delta_rule(*args, layout, initial_state=h0, chunked=chunked, out=(o_buf, ht_buf))
        assert o is o_buf and ht is ht_buf
        assert torch.equal(o, ref_o) and torch.equal(ht, ref_ht)
        assert torch.equal(o[0, 70:], torch.zeros_like(o[0, 70:]))  # pad rows written as 0
        assert torch.equal(ht[2], h0[2])  # the empty segment keeps its initial state


def test_out_strided(layout):
    args = inputs(3)
    ref_o, ref_ht = maskpack.gated_delta_rule(*args, layout)
    o_big = torch.full((len(LENGTHS), WIDTH, HV, 2 * V), float("nan"))
    ht_t = torch.full((len(LENGTHS), HV, V, K), float("nan")).transpose(2, 3)
    o, ht = maskpack.gated_delta_rule(*args, layout, out=(o_big[..., :V], ht_t))
    assert torch.equal(o, ref_o) and torch.equal(ht, ref_ht)
    assert torch.isnan(o_big[..., V:]).all()  # nothing written outside the view


def test_out_refusals_leave_outputs_untouched(layout):
    args = inputs(4)
    o_buf, ht_buf = stale_outputs()
    bad_o = torch.full((len(LENGTHS), WIDTH, HV, V + 1), float("nan"))
    with pytest.raises(maskpack.Error, match="out\\[0\\]"):
        maskpack.gated_delta_rule(*args, layout, out=(bad_o, ht_buf))
    with pytest.raises(maskpack.Error, match="final_state"):
        maskpack.gated_delta_rule(*args, layout, out=(o_buf, ht_buf.double()))
    assert torch.isnan(bad_o).all() and torch.isnan(o_buf).all() and torch.isnan(ht_buf).all()
    with pytest.raises(TypeError, match="pair"):
        maskpack.gated_delta_rule(*args, layout, out=o_buf)
    q = args[0].clone().requires_grad_(True)
    with pytest.raises(TypeError, match="autograd"):
        maskpack.gated_delta_rule(q, *args[1:], layout, out=(o_buf, ht_buf))
    assert torch.isnan(o_buf).all()
    with torch.no_grad():  # fine when autograd does not record
        o, _ = maskpack.gated_delta_rule(q, *args[1:], layout, out=(o_buf, ht_buf))
    assert not torch.isnan(o).any()
