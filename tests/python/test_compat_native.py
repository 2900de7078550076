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


# ---- Batch.megatron_packed_seq_params(cu_seqlens_q=), cp_all_gather(grad=), prepare_batch(backend="mindspeed") ----

def _batch():
    return {"input_ids": torch.arange(10).view(2, 5), "attention_mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])}


def test_megatron_packed_seq_params_offsets():
    """cu_seqlens_q="real" (TransformerEngine's contract, the default) or "padded" (verl's and Megatron's
    packed loader's, TransformerEngine issue 1930): the latter equals verl's preprocess_packed_seqs."""
    from maskpack.compat import verl

    b = maskpack.prepare_batch(_batch(), backend="megatron", padding_free=True, cp=2, cp_rank=0)
    real = b.megatron_packed_seq_params()
    padded = b.megatron_packed_seq_params(cu_seqlens_q="padded")
    assert real["cu_seqlens_q"].tolist() == real["cu_seqlens_kv"].tolist() == [0, 3, 8]
    assert padded["cu_seqlens_q"].tolist() == padded["cu_seqlens_kv"].tolist() == [0, 4, 12]
    assert padded["cu_seqlens_q_padded"].tolist() == real["cu_seqlens_q_padded"].tolist() == [0, 4, 12]
    _, twin = verl.preprocess_packed_seqs(_batch()["input_ids"], _batch()["attention_mask"].bool(), tp=1, cp=2,
                                          cp_rank=0)
    for k, v in padded.items():
        got = getattr(twin, k)
        assert (got.tolist() if hasattr(got, "tolist") else got) == (v.tolist() if hasattr(v, "tolist") else v), k
    with pytest.raises(maskpack.Error) as e:
        b.megatron_packed_seq_params(cu_seqlens_q="slots")
    assert e.value.argument == "cu_seqlens_q"


def test_mindspeed_backend():
    """No 4D mask for causal attention (MindSpeed builds its compressed mask), the 2D keep mask kept for Gated
    DeltaNet, NPU-form sequence ends global and per rank (P2P), MindSpeed's alignment lcm(2, tp) * cp."""
    b = maskpack.prepare_batch(_batch(), backend="mindspeed", padding_free=True, tp=2, cp=2, cp_rank=1)
    assert b.attention_mask is None
    assert b.attention_mask_2d is not None
    kw = b.mindspeed_kwargs()
    assert kw["actual_seq_len"].tolist() == [4, 12]            # slots of lcm(2, 2) * 2 = 4, NPU form
    assert kw["actual_seq_len_local"].tolist() == [2, 6]       # per rank (P2P): the padded ends / cp
    assert b.global_layout.cu_seqlens_padded().tolist() == [0, 4, 12]
    verl_aligned = maskpack.prepare_batch(_batch(), backend="megatron", padding_free=True, tp=2, cp=2, cp_rank=1)
    assert verl_aligned.global_layout.cu_seqlens_padded().tolist() == [0, 8, 16]   # tp * cp * 2
    padded = maskpack.prepare_batch(_batch(), backend="mindspeed", padding_free=False)
    assert padded.attention_mask is None and padded.mindspeed_kwargs()["actual_seq_len"] is None
    windowed = maskpack.prepare_batch(_batch(), backend="mindspeed", padding_free=False, window=(2, 0))
    assert windowed.attention_mask.shape == (2, 1, 5, 5) and windowed.attention_mask.dtype == torch.bool


def _grad_worker(rank, world, init_file, out_dir):
    import os

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        lay = maskpack.Layout.from_lengths([5, 9, 2], "packed")
        whole = torch.arange(float(lay.pad_to_multiple(2 * world).q_width)).unsqueeze(-1).repeat(1, 3)
        g = lay.pad_to_multiple(2 * world)
        part = g.shard(whole, world, rank, align=None).requires_grad_(True)
        res = {}
        for grad in ("sum", "own"):
            p = part.detach().clone().requires_grad_(True)
            out = maskpack.cp_all_gather(p, g, dist.group.WORLD, align=None, grad=grad)
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
            res[grad] = (out.detach(), p.grad)
        torch.save(res, os.path.join(out_dir, f"g{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_cp_all_gather_grad_own():
    """grad="own": this rank's part gets its own loss's gradient (verl's detached gather); grad="sum" (the
    default) every rank's: the same loss on every rank gives exactly cp times the "own" gradient."""
    import os
    import tempfile

    import torch.multiprocessing as mp

    world = 2
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_grad_worker, args=(world, os.path.join(d, "init"), d), nprocs=world, join=True,
                           start_method="spawn")
        for r in range(world):
            res = torch.load(os.path.join(d, f"g{r}.pt"))
            assert torch.equal(res["sum"][0], res["own"][0])
            assert torch.equal(res["sum"][1], world * res["own"][1])
    with pytest.raises(maskpack.Error) as e:
        maskpack.cp_all_gather(torch.zeros(2), maskpack.Layout.from_lengths([4], "packed"), None, grad="mine")
    assert e.value.argument == "grad"
