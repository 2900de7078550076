"""The native API the maskpack.compat twins stand on, each usable on its own: nested (jagged) tensors in
and out of layouts and moves, the frameworks' padding recipes as named presets."""

from __future__ import annotations

import math

import pytest
import torch

import maskpack
from maskpack.padding import padding_recipe, swift_padding_to, verl_alignment


def _nested(lens, dense=(), dtype=torch.float32):
    g = torch.Generator().manual_seed(sum(lens) + 1)
    return torch.nested.as_nested_tensor([torch.randn((n,) + dense, generator=g).to(dtype) for n in lens],
                                         layout=torch.jagged)


@pytest.mark.parametrize("lens", [[3, 5], [1], [4, 0, 2], [7, 7, 7]])
@pytest.mark.parametrize("dense", [(), (2, 3)])
def test_from_nested_and_to_nested(lens, dense):
    nj = _nested(lens, dense)
    lay = maskpack.Layout.from_nested(nj)
    assert lay.packed and lay.seqlens.tolist() == lens
    assert torch.equal(torch.as_tensor(lay.cu_seqlens(dtype="int64")), nj.offsets())
    pad = lay.padded_of("left")
    x = maskpack.relayout(nj, lay, pad)                      # a nested tensor moves as its values
    assert torch.equal(x, maskpack.relayout(nj.values(), lay, pad))
    back = pad.to_nested(x)                                  # nested out of any layout of the same sequences
    assert torch.equal(back.offsets(), nj.offsets()) and torch.equal(back.values(), nj.values())
    shard = lay.pad_to_multiple(4).cp_shard(2, 1)
    part = maskpack.relayout(nj, lay, shard)
    assert part.shape[0] == shard.q_width


def test_to_nested_is_differentiable():
    lay = maskpack.Layout.from_lengths([2, 3], "left")
    x = torch.randn(2, 3, 4, requires_grad=True)
    nj = lay.to_nested(x)
    (nj.values() * 2).sum().backward()
    assert torch.equal(x.grad, 2 * torch.as_tensor(lay.mask2d()).float()[..., None].expand(2, 3, 4))


def test_nested_bad_input():
    strided = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(maskpack.Error) as e:
        maskpack.Layout.from_nested(strided)
    assert e.value.argument == "nested"
    with pytest.raises(TypeError):
        maskpack.Layout.from_nested(torch.zeros(3))
    nj = _nested([2, 3])
    other = maskpack.Layout.from_lengths([3, 2], "packed")
    with pytest.raises(maskpack.Error) as e:                 # offsets that do not describe src
        maskpack.relayout(nj, other, other.padded_of())
    assert e.value.argument == "x"


def test_padding_recipes():
    assert verl_alignment(tp=4, cp=2) == padding_recipe("verl", tp=4, cp=2)
    assert padding_recipe("verl", tp=4, cp=2).per_sequence == 16        # tp*cp*2 (never lcm(tp, 2cp) = 4)
    assert padding_recipe("verl", tp=3, cp=1).per_sequence == 3
    r = padding_recipe("verl", tp=2, cp=2, fp8=True)
    assert (r.per_sequence, r.total) == (math.lcm(16, 8), 8 * 128)
    assert padding_recipe("verl", tp=2, cp=2, zigzag=False).per_sequence == 4
    assert swift_padding_to(tp=1, cp=1) is None
    assert swift_padding_to(tp=4, sequence_parallel=True, cp=2, fp8_recipe="mxfp8") == 4 * 2 * 32
    assert swift_padding_to(tp=1, cp=2, fp8_recipe="blockwise") == 256
    assert swift_padding_to(tp=1, cp=2, fp8="e4m3") == 32
    assert swift_padding_to(tp=2, sequence_parallel=True, cp=1, attention_backend="fused") == 128
    assert padding_recipe("bucket", bucket=24, cp=16).total == 48
    assert padding_recipe("forced_max", forced_max=1001, tp=2, cp=2).per_sequence == 1008
    with pytest.raises(maskpack.Error) as e:
        padding_recipe("nemo")
    assert e.value.argument == "name"
    lay = maskpack.Layout.from_lengths([5, 9], "packed")
    r = padding_recipe("verl", tp=1, cp=2, fp8=True)
    padded = lay.pad_to_multiple(r.per_sequence).pad_total_to_multiple(r.total)
    assert padded.q_width % r.total == 0
