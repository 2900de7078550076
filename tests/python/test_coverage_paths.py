"""Binding paths no other test runs: maskpack.gdn_l2norm (forward and backward against torch),
Layout.padded_of (right and left placement, a given width, too narrow a width), the extension's
status_message, and the int32 output-buffer checks of block_mask and magi_slices (wrong dtype,
wrong size, not contiguous, missing buffers, negative capacity)."""

import numpy as np
import pytest
import torch

import maskpack
from maskpack import _maskpack


# ---- gdn_l2norm --------------------------------------------------------------------------------------

def _l2_ref(x, eps):
    x64 = x.double()
    return x64 / torch.sqrt((x64 * x64).sum(-1, keepdim=True) + eps)


@pytest.mark.parametrize("placement", ["packed", "right"])
def test_gdn_l2norm_forward_backward(placement):
    lay = maskpack.Layout.from_lengths([5, 3], placement=placement)
    gen = torch.Generator().manual_seed(3)
    shape = (lay.q_width, 2, 16) if lay.packed else (lay.n_rows, lay.q_width, 2, 16)
    x = torch.randn(*shape, generator=gen, dtype=torch.float32)
    valid = torch.zeros(shape[:-2], dtype=torch.bool)
    if lay.packed:
        valid[:8] = True
    else:
        valid[0, :5] = True
        valid[1, :3] = True
    x[~valid] = float("nan")  # padding is never read
    x.requires_grad_(True)
    eps = 1e-3
    y = maskpack.gdn_l2norm(x, lay, eps=eps)
    assert y.shape == x.shape and y.dtype == torch.float32
    want = _l2_ref(x.detach()[valid], eps)
    torch.testing.assert_close(y.detach()[valid].double(), want, rtol=1e-5, atol=1e-6)
    assert torch.all(y.detach()[~valid] == 0), "padding rows are 0"
    # backward against autograd of the double reference on the real rows
    dy = torch.randn(*shape, generator=gen)
    (dx,) = torch.autograd.grad(y, x, dy)
    xr = x.detach()[valid].double().requires_grad_(True)
    (dref,) = torch.autograd.grad(_l2_ref(xr, eps), xr, dy[valid].double())
    torch.testing.assert_close(dx[valid].double(), dref, rtol=1e-4, atol=1e-6)
    assert torch.all(dx[~valid] == 0)


def test_gdn_l2norm_rejects_a_wrong_grid():
    lay = maskpack.Layout.from_lengths([5, 3], placement="packed")
    with pytest.raises((maskpack.Error, TypeError)):
        maskpack.gdn_l2norm(torch.zeros(7, 2, 16), lay)  # 7 tokens, the layout has 8


# ---- Layout.padded_of ----------------------------------------------------------------------------------

def test_padded_of_right_left_and_width():
    packed = maskpack.Layout.from_lengths([4, 2, 3], placement="packed")
    right = packed.padded_of()
    assert (right.n_rows, right.q_width, right.packed) == (3, 4, False)
    np.testing.assert_array_equal(right.mask2d(), [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    left = packed.padded_of("left", width=6)
    assert (left.n_rows, left.q_width) == (3, 6)
    np.testing.assert_array_equal(left.mask2d(), [[0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(left.position_ids()[1], [0, 0, 0, 0, 0, 1])
    # the same sequences, in order
    np.testing.assert_array_equal(left.seqlens, [4, 2, 3])
    with pytest.raises(maskpack.Error) as e:
        packed.padded_of("right", width=3)  # the longest sequence has 4 tokens
    assert e.value.status.startswith("MASKPACK_ERR")
    with pytest.raises(ValueError):
        packed.padded_of("middle")


# ---- status_message -----------------------------------------------------------------------------------

def test_status_message_for_every_status():
    names = _maskpack.status_names()
    msgs = [_maskpack.status_message(code) for code in range(len(names))]
    assert all(isinstance(m, str) and m for m in msgs)
    assert len(set(msgs)) == len(msgs), "one description per status"
    assert "success" in msgs[0].lower() or "ok" in msgs[0].lower()
    unknown = _maskpack.status_message(10_000)
    assert isinstance(unknown, str) and unknown not in msgs[1:]
    with pytest.raises(TypeError):
        _maskpack.status_message("MASKPACK_OK")


# ---- int32 output buffers -----------------------------------------------------------------------------

def _desc(a):
    """What the extension reads for a buffer argument: the numpy array itself."""
    return a


def _block_mask_buffers(lay, bq, bk):
    qb, kb = _maskpack.block_mask_dims(lay._h, bq, bk)
    b = lay.n_rows
    sizes = [b * qb, b * qb * kb, b * qb, b * qb * kb, b * kb, b * kb * qb, b * kb, b * kb * qb]
    return [np.zeros(n, dtype=np.int32) for n in sizes]


def test_block_mask_buffer_checks():
    lay = maskpack.Layout.from_lengths([5, 3], placement="right")
    bufs = _block_mask_buffers(lay, 4, 4)
    _maskpack.block_mask(lay._h, 4, 4, tuple(_desc(a) for a in bufs))
    want = lay.block_mask(4, 4)
    np.testing.assert_array_equal(bufs[0], np.asarray(want["kv_num_blocks"]).ravel())
    # int64 where int32 is needed
    bad = list(bufs)
    bad[2] = np.zeros(bufs[2].size, dtype=np.int64)
    with pytest.raises(TypeError, match="full_kv_num_blocks: expected an int32 buffer"):
        _maskpack.block_mask(lay._h, 4, 4, tuple(_desc(a) for a in bad))
    # one element short
    bad = list(bufs)
    bad[1] = np.zeros(bufs[1].size - 1, dtype=np.int32)
    with pytest.raises(ValueError, match="kv_indices: expected %d elements, found %d" % (bufs[1].size, bufs[1].size - 1)):
        _maskpack.block_mask(lay._h, 4, 4, tuple(_desc(a) for a in bad))
    # every other element of a buffer twice as long: the right count, not contiguous
    bad = list(bufs)
    bad[5] = np.zeros(bufs[5].size * 2, dtype=np.int32)[::2]
    with pytest.raises(ValueError, match="q_indices: expected a C-contiguous buffer"):
        _maskpack.block_mask(lay._h, 4, 4, tuple(_desc(a) for a in bad))
    with pytest.raises(TypeError, match="expected 8 output arrays"):
        _maskpack.block_mask(lay._h, 4, 4, tuple(_desc(a) for a in bufs[:7]))


def test_magi_slices_buffer_checks():
    lay = maskpack.Layout.from_lengths([5, 3], placement="packed")
    n = _maskpack.magi_slices(lay._h, None, None, None, 0)
    assert n == 2
    q, k, t = np.zeros(2 * n, np.int32), np.zeros(2 * n, np.int32), np.zeros(n, np.int32)
    assert _maskpack.magi_slices(lay._h, _desc(q), _desc(k), _desc(t), n) == n
    np.testing.assert_array_equal(q, [0, 5, 5, 8])
    with pytest.raises(TypeError, match="all three buffers are needed"):
        _maskpack.magi_slices(lay._h, _desc(q), None, _desc(t), n)
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        _maskpack.magi_slices(lay._h, None, None, None, -1)
    with pytest.raises(TypeError, match="types: expected an int32 buffer"):
        _maskpack.magi_slices(lay._h, _desc(q), _desc(k), _desc(np.zeros(n, np.int64)), n)
    with pytest.raises(ValueError, match="k_ranges: expected 4 elements, found 2"):
        _maskpack.magi_slices(lay._h, _desc(q), _desc(np.zeros(2, np.int32)), _desc(t), n)


# ---- relayout of strided tokens of 256 bytes or more, large enough to stream -----------------------

def test_pack_unpack_strided_wide_tokens():
    # 35000 tokens of 128 float32 (512 bytes) read from a [.., 256] buffer (token stride 1024 bytes):
    # 17.9 MB moved, past the relayout's non-temporal-store threshold, token by token
    lay = maskpack.Layout.from_lengths([20000, 15000], placement="right")
    base = torch.arange(2 * 20000 * 256, dtype=torch.float32).reshape(2, 20000, 256)
    x = base[..., :128]
    assert not x.is_contiguous()
    packed = lay.pack(x)
    want = torch.cat([x[0, :20000], x[1, :15000]])
    assert torch.equal(packed, want)
    # back into a strided destination: copies token by token, padding zeroed token by token
    dst = torch.full((2, 20000, 256), -1.0)
    out = dst[..., :128]
    lay.unpack(packed, out=out)
    assert torch.equal(out[0], x[0]) and torch.equal(out[1, :15000], x[1, :15000])
    assert torch.all(out[1, 15000:] == 0), "padding tokens zeroed"
    assert torch.all(dst[..., 128:] == -1.0), "bytes between the strided tokens untouched"


# ---- Gated DeltaNet: strided head dimension, bf16 in and out, NaN to bf16 ----------------------------

def _every_other(x):
    """x's values in a tensor whose last dimension has stride 2 (a view of a buffer twice as wide)."""
    wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
    wide[..., ::2] = x
    view = wide[..., ::2]
    assert view.stride(-1) == 2
    return view


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunked", [True, False])
def test_gdn_strided_head_dim_matches_contiguous(dtype, chunked):
    lay = maskpack.Layout.from_lengths([70, 9], placement="packed")
    gen = torch.Generator().manual_seed(11)
    T, H, HV, K, V = 79, 1, 2, 16, 16
    q = torch.randn(T, H, K, generator=gen).to(dtype)
    k = torch.randn(T, H, K, generator=gen).to(dtype)
    v = torch.randn(T, HV, V, generator=gen).to(dtype)
    g = (-0.1 * torch.rand(T, HV, generator=gen)).to(dtype)
    beta = torch.rand(T, HV, generator=gen).to(dtype)
    o, ht = maskpack.gated_delta_rule(q, k, v, g, beta, lay, chunked=chunked)
    # the same values read through head-dim stride 2, and written through stride 2
    o_out = _every_other(torch.full_like(v, 7.0))
    ht_out = torch.empty_like(ht)
    o2, ht2 = maskpack.gated_delta_rule(_every_other(q), _every_other(k), _every_other(v), g, beta, lay,
                                        chunked=chunked, out=(o_out, ht_out))
    assert o2 is o_out and o2.stride(-1) == 2
    assert torch.equal(o2, o), "strided inputs and output give the contiguous result bit for bit"
    assert torch.equal(ht2, ht)


def test_gdn_nan_to_bf16_stays_nan():
    lay = maskpack.Layout.from_lengths([5, 4], placement="packed")
    T, K, V = 9, 16, 16
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(T, 1, K, generator=gen).bfloat16()
    k = torch.randn(T, 1, K, generator=gen).bfloat16()
    v = torch.randn(T, 1, V, generator=gen).bfloat16()
    v[6, 0, 3] = float("nan")  # token 1 of the second segment
    g = torch.full((T, 1), -0.1).bfloat16()
    beta = torch.full((T, 1), 0.5).bfloat16()
    for chunked in (True, False):
        o, ht = maskpack.gated_delta_rule(q, k, v, g, beta, lay, chunked=chunked)
        assert o.dtype == torch.bfloat16
        assert torch.isfinite(o[:5].float()).all(), "the first segment never sees the second's NaN"
        assert torch.isnan(o[6:].float()).any(dim=-1).all(), "the NaN reaches the segment's later outputs as NaN"
        bits = o[6:].view(torch.int16).int() & 0xFFFF
        nan_bits = bits[torch.isnan(o[6:].float())]
        assert torch.all((nan_bits & 0x7F80) == 0x7F80) and torch.all((nan_bits & 0x0040) != 0), "quiet NaN"
        assert torch.isfinite(ht[0]).all() and torch.isnan(ht[1]).any()
