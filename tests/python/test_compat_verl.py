"""maskpack.compat.verl against verl 0.9.1's own functions (verl/models/mcore/util.py, loaded unmodified
from build/upstream), bit for bit on property-based batches: left, right and no padding, empty rows,
sequences shorter than 2*cp, cp 1..8, tp 1..4, FP8 on and off, the NPU branch on and off; every returned
tensor and every PackedSeqParams field; each CP rank of a case in one process (torch.distributed.all_gather
faked); gradients across 2 and 4 gloo processes in test_compat_verl_dist.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import maskpack
from maskpack.compat import verl as tw

import compat_upstream as cu

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module")
def up():
    yield cu.verl_mcore_util()
    cu.write_counts()


def _upstream(up, tp, cp, rank, npu=False, **extra):
    return cu.patched(up, mpu=cu.FakeParallelState(tp, cp, rank), is_npu_available=npu, **extra)


# ---- strategies ------------------------------------------------------------------------------------

@st.composite
def padded_batches(draw, max_b=5, max_s=24):
    b = draw(st.integers(1, max_b))
    s = draw(st.integers(1, max_s))
    side = draw(st.sampled_from(["right", "left", "none", "mixed"]))
    mask = torch.zeros(b, s, dtype=torch.bool)
    for i in range(b):
        n = s if side == "none" else draw(st.integers(0, s))
        left = side == "left" or (side == "mixed" and draw(st.booleans()))
        if left:
            mask[i, s - n:] = True
        else:
            mask[i, :n] = True
    if not bool(mask.any()):
        mask[0, 0] = True  # verl's max() over an all-empty batch is a crash; tested apart
    seed = draw(st.integers(0, 2**16))
    return mask, seed


parallel = st.tuples(st.integers(1, 4), st.integers(1, 8))


@st.composite
def nested_batches(draw, max_b=5, max_len=24, min_len=1):
    lens = draw(st.lists(st.integers(min_len, max_len), min_size=1, max_size=max_b))
    seed = draw(st.integers(0, 2**16))
    return lens, seed


def _nested(lens, seed, dense=(), dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        parts = [torch.randn((n,) + dense, generator=g, dtype=dtype) for n in lens]
    else:
        parts = [torch.randint(1, 1000, (n,) + dense, generator=g, dtype=dtype) for n in lens]
    return torch.nested.as_nested_tensor(parts, layout=torch.jagged)


# ---- preprocess_packed_seqs / postprocess_packed_seqs ---------------------------------------------------

@SETTINGS
@given(padded_batches(), parallel, st.booleans(), st.sampled_from([(), (3,)]))
def test_preprocess_packed_seqs(up, batch, par, fp8, dense):
    mask, seed = batch
    tp, cp = par
    ids = torch.randint(1, 1000, mask.shape + dense, generator=torch.Generator().manual_seed(seed))
    for r in range(cp):
        with _upstream(up, tp, cp, r):
            a, pa = up.preprocess_packed_seqs(ids, mask, True, fp8)
        b, pb = tw.preprocess_packed_seqs(ids, mask, True, fp8, tp=tp, cp=cp, cp_rank=r)
        cu.assert_same(a, b, "input_ids_rmpad")
        cu.assert_params(pa, pb, "packed_seq_params")
        cu.count("verl.preprocess_packed_seqs")
    with _upstream(up, tp, cp, 0):
        a, pa = up.preprocess_packed_seqs(ids, mask, False, fp8)
    b, pb = tw.preprocess_packed_seqs(ids, mask, False, fp8, tp=tp, cp=cp, cp_rank=0)
    assert a is ids and b is ids
    cu.assert_params(pa, pb, "packed_seq_params")


@SETTINGS
@given(padded_batches(), parallel, st.booleans(), st.sampled_from([(), (4,)]), st.sampled_from(["own", "sum"]))
def test_postprocess_packed_seqs(up, batch, par, fp8, dense, grad):
    """Forward bits against verl; the gradient of this rank's output against verl's (grad="own"; the "sum"
    gradient needs real ranks: test_compat_verl_dist.py)."""
    mask, seed = batch
    tp, cp = par
    b_, s = mask.shape
    hidden = torch.randn((b_, s) + dense, generator=torch.Generator().manual_seed(seed))
    parts = []
    for r in range(cp):
        x, params = tw.preprocess_packed_seqs(hidden, mask, True, fp8, tp=tp, cp=cp, cp_rank=r)
        parts.append(x)
    w = torch.randn((b_, s) + dense, generator=torch.Generator().manual_seed(seed + 1))
    for r in range(cp if grad == "own" else 1):
        xa = parts[r].clone().requires_grad_(True)
        xb = parts[r].clone().requires_grad_(True)
        with _upstream(up, tp, cp, r), cu.fake_all_gather(parts):
            oa = up.postprocess_packed_seqs(xa, params, mask, b_, s, True)
        with cu.fake_all_gather(parts):
            if grad == "sum" and cp > 1:
                continue
            ob = tw.postprocess_packed_seqs(xb, params, mask, b_, s, True, grad=grad, cp=cp, cp_rank=r)
        cu.assert_same(oa, ob, "output")
        (oa * w).sum().backward()
        (ob * w).sum().backward()
        cu.assert_same(xa.grad, xb.grad, "grad")
        cu.count("verl.postprocess_packed_seqs")
    assert tw.postprocess_packed_seqs(hidden, params, mask, b_, s, False, cp=cp, cp_rank=0) is hidden


# ---- the engine's nested-tensor THD pair ------------------------------------------------------------------

@pytest.fixture(scope="module")
def newer_psp():
    """megatron-core's PackedSeqParams with the cp_partition_mode field of newer releases (verl 0.9.1
    reads it when present; megatron-core 0.16.1 lacks it)."""
    cu.require_upstream("megatron")
    from megatron.core.packed_seq_params import PackedSeqParams

    @dataclasses.dataclass
    class PSP(PackedSeqParams):
        cp_partition_mode: str = "zigzag"

    return PSP


thd_options = st.fixed_dictionaries({
    "need_roll": st.booleans(),
    "fp8": st.booleans(),
    "cp_layout": st.sampled_from(["zigzag", "contiguous"]),
    "min_local_rows": st.sampled_from([None, None, 1, 7, 40]),
    "bucket": st.sampled_from([None, None, 8, 24, 64]),
    "dense": st.sampled_from([(), (2,)]),
})


def _thd_expect_error(lens, tp, cp, o):
    """Where verl 0.9.1 builds a batch whose last slot no longer splits into 2*cp chunks (min_local_rows or a
    bucket padded it), it truncates silently; the twin refuses."""
    import math

    layout = o["cp_layout"]
    align = tp * cp * (2 if layout == "zigzag" and cp > 1 else 1)
    total_align = None
    if o["fp8"]:
        align, total_align = math.lcm(16, align), align * 128
    slots = [n + (-n) % align for n in lens]
    tot = sum(slots)
    if total_align:
        slots[-1] += (-tot) % total_align
        tot = sum(slots)
    if o["min_local_rows"] is not None and tot < cp * o["min_local_rows"]:
        slots[-1] += cp * o["min_local_rows"] - tot
        tot = sum(slots)
    if o["bucket"] is not None:
        t = math.lcm(o["bucket"], cp)
        if total_align:
            t = math.lcm(t, total_align)
        slots[-1] += (-tot) % t
        tot = sum(slots)
    if tot % cp:
        return True
    return layout == "zigzag" and cp > 1 and any(s % (2 * cp) for s in slots)


@SETTINGS
@given(nested_batches(), parallel, thd_options)
def test_preprocess_thd_engine(up, newer_psp, batch, par, o):
    lens, seed = batch
    tp, cp = par
    ids = _nested(lens, seed, o["dense"])
    args = (True, o["need_roll"], o["fp8"], None, o["min_local_rows"], o["bucket"], o["cp_layout"])
    contiguous = o["cp_layout"] == "contiguous"
    extra = dict(PackedSeqParams=newer_psp, _PACKED_SEQ_PARAMS_HAS_CP_PARTITION_MODE=True) if contiguous else {}
    if _thd_expect_error(lens, tp, cp, o):
        with pytest.raises(maskpack.Error) as e:
            tw.preprocess_thd_engine(ids, *args, tp=tp, cp=cp, cp_rank=0)
        assert e.value.argument in ("cp", "min_local_rows")
        cu.count("verl.preprocess_thd_engine (refused)")
        return
    for r in range(cp):
        with _upstream(up, tp, cp, r, **extra):
            a, pa, posa = up.preprocess_thd_engine(ids, *args)
        b, pb, posb = tw.preprocess_thd_engine(ids, *args, tp=tp, cp=cp, cp_rank=r)
        cu.assert_same(a, b, "input_ids_rmpad")
        cu.assert_same(posa, posb, "position_ids")
        cu.assert_params(pa, pb, "packed_seq_params")
        assert getattr(pb, "cp_partition_mode") == o["cp_layout"]
        cu.count("verl.preprocess_thd_engine")
    with _upstream(up, tp, cp, 0, **extra):
        a, pa, posa = up.preprocess_thd_engine(ids, False, *args[1:])
    b, pb, posb = tw.preprocess_thd_engine(ids, False, *args[1:], tp=tp, cp=cp, cp_rank=0)
    assert a is ids and b is ids and posa is None and posb is None
    cu.assert_params(pa, pb, "packed_seq_params")


@SETTINGS
@given(nested_batches(), parallel, st.booleans(), st.sampled_from(["zigzag", "contiguous"]),
       st.sampled_from([(), (3,)]))
def test_postprocess_thd_engine(up, newer_psp, batch, par, fp8, cp_layout, dense):
    lens, seed = batch
    tp, cp = par
    ids = _nested(lens, seed)
    hid = _nested(lens, seed + 1, dense, torch.float32)
    parts = []
    for r in range(cp):
        x, params, _ = tw.preprocess_thd_engine(hid, True, False, fp8, None, None, None, cp_layout, tp=tp, cp=cp,
                                                cp_rank=r)
        parts.append(x)
    for r in range(cp):
        xa = parts[r].clone().requires_grad_(True)
        xb = parts[r].clone().requires_grad_(True)
        with _upstream(up, tp, cp, r), cu.fake_all_gather(parts):
            oa = up.postprocess_thd_engine(xa, params, ids, len(lens), True, None, cp_layout)
        with cu.fake_all_gather(parts):
            ob = tw.postprocess_thd_engine(xb, params, ids, len(lens), True, None, cp_layout, cp=cp, cp_rank=r)
        cu.assert_same(oa, ob, "output")
        cu.assert_same(ob.values(), hid.values(), "round trip")
        w = torch.randn(oa.values().shape, generator=torch.Generator().manual_seed(seed + 2))
        (oa.values() * w).sum().backward()
        (ob.values() * w).sum().backward()
        cu.assert_same(xa.grad, xb.grad, "grad")
        cu.count("verl.postprocess_thd_engine")


# ---- the engine's nested-tensor BSHD pair -----------------------------------------------------------------

@SETTINGS
@given(nested_batches(), parallel, st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from([None, 0, 5, 30]), st.sampled_from([(), (2,)]))
def test_preprocess_bshd_engine(up, batch, par, need_roll, fp8, npu, forced, dense):
    lens, seed = batch
    tp, cp = par
    ids = _nested(lens, seed, dense)
    if forced is not None:
        forced = max(lens) + forced
    for r in range(cp):
        with _upstream(up, tp, cp, r, npu=npu):
            a = up.preprocess_bshd_engine(ids, True, need_roll, fp8, forced)
        b = tw.preprocess_bshd_engine(ids, True, need_roll, fp8, forced, tp=tp, cp=cp, cp_rank=r, npu=npu)
        for k, (x, y) in enumerate(zip(a, b)):
            cu.assert_same(x, y, f"output[{k}]")
        cu.count("verl.preprocess_bshd_engine")


@SETTINGS
@given(nested_batches(), parallel, st.booleans(), st.booleans(), st.sampled_from([(), (3,)]))
def test_postprocess_bshd_engine(up, batch, par, fp8, npu, dense):
    lens, seed = batch
    tp, cp = par
    hid = _nested(lens, seed, dense, torch.float32)
    pre = [tw.preprocess_bshd_engine(hid, True, False, fp8, None, tp=tp, cp=cp, cp_rank=r, npu=npu) for r in range(cp)]
    parts = [p[0] for p in pre]
    masks = [p[1] for p in pre]
    masks2d = [tw.preprocess_bshd_engine(hid, True, False, fp8, None, tp=tp, cp=cp, cp_rank=r, npu=False)[1]
               for r in range(cp)]  # what both sides all-gather (the NPU mask is read back to 2D first)
    for r in range(cp):
        xa = parts[r].clone().requires_grad_(True)
        xb = parts[r].clone().requires_grad_(True)

        def gather(tensor_list, tensor, group=None, async_op=False):
            src = masks2d if tensor.dtype == torch.bool else parts
            for j, t in enumerate(tensor_list):
                t.copy_(src[j].detach())

        with _upstream(up, tp, cp, r, npu=npu), cu.patched(torch.distributed, all_gather=gather):
            oa = up.postprocess_bshd_engine(xa, masks[r], True)
        with cu.patched(torch.distributed, all_gather=gather):
            ob = tw.postprocess_bshd_engine(xb, masks[r], True, cp=cp, cp_rank=r, npu=npu)
        cu.assert_same(oa, ob, "output")
        cu.assert_same(ob.values(), hid.values(), "round trip")
        w = torch.randn(oa.values().shape, generator=torch.Generator().manual_seed(seed + 2))
        (oa.values() * w).sum().backward()
        (ob.values() * w).sum().backward()
        cu.assert_same(xa.grad, xb.grad, "grad")
        cu.count("verl.postprocess_bshd_engine")


# ---- VLM masks ----------------------------------------------------------------------------------------

@SETTINGS
@given(nested_batches(), parallel, st.integers(0, 5), st.sampled_from([None, 0, 9]), st.booleans())
def test_build_vlm_attn_mask(up, batch, par, pad_id, forced, npu):
    lens, seed = batch
    tp, cp = par
    ids = _nested(lens, seed)
    if forced is not None:
        forced = max(lens) + forced
    with _upstream(up, tp, cp, 0, npu=npu):
        a = up.build_vlm_attn_mask_thd(ids, pad_id)
        c = up.build_vlm_attn_mask_bshd(ids, len(lens), pad_id, forced)
    b = tw.build_vlm_attn_mask_thd(ids, pad_id, tp=tp, cp=cp)
    d = tw.build_vlm_attn_mask_bshd(ids, len(lens), pad_id, forced, tp=tp, cp=cp, npu=npu)
    for k in range(2):
        cu.assert_same(a[k], b[k], f"thd[{k}]")
        cu.assert_same(c[k], d[k], f"bshd[{k}]")
    cu.count("verl.build_vlm_attn_mask_thd")
    cu.count("verl.build_vlm_attn_mask_bshd")


# ---- bad input: errors where verl crashes or builds a silently wrong batch ---------------------------------

def test_bad_input():
    ids = torch.arange(8).view(2, 4)
    holes = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    with pytest.raises(maskpack.Error) as e:
        tw.preprocess_packed_seqs(ids, holes, tp=1, cp=1, cp_rank=0)
    assert e.value.argument == "attention_mask" and e.value.status == "MASKPACK_ERR_HOLE"
    with pytest.raises(maskpack.Error) as e:  # verl would index with the 0/1 values
        tw.preprocess_packed_seqs(ids, torch.ones(2, 4, dtype=torch.int64), tp=1, cp=1, cp_rank=0)
    assert e.value.argument == "attention_mask" and e.value.status == "MASKPACK_ERR_DTYPE"
    with pytest.raises(maskpack.Error) as e:
        tw.preprocess_packed_seqs(ids, torch.ones(2, 4, dtype=torch.bool))
    assert e.value.argument == "tp" and "tp=" in str(e.value) and "parallel_state" in str(e.value)
    mask = torch.ones(2, 4, dtype=torch.bool)
    x, params = tw.preprocess_packed_seqs(ids, mask, tp=1, cp=2, cp_rank=0)
    bad = dataclasses.replace(params, cu_seqlens_q_padded=torch.tensor([0, 3, 8], dtype=torch.int32))
    with pytest.raises(maskpack.Error) as e:  # cu_seqlens that do not cover the tokens
        tw.postprocess_packed_seqs(x.float(), bad, mask, 2, 4, cp=1, cp_rank=0)
    assert e.value.argument in ("cu_seqlens_padded", "output")
    nested = torch.nested.as_nested_tensor([torch.arange(5), torch.arange(3)], layout=torch.jagged)
    with pytest.raises(maskpack.Error) as e:  # verl 0.9.1 truncates the last slot's zigzag chunks
        tw.preprocess_thd_engine(nested, True, False, False, None, 7, None, "zigzag", tp=1, cp=2, cp_rank=0)
    assert e.value.argument == "min_local_rows"
    with pytest.raises(maskpack.Error) as e:
        tw.preprocess_bshd_engine(nested, True, False, False, 2, tp=1, cp=1, cp_rank=0, npu=False)
    assert e.value.argument == "forced_max_seqlen"
    with pytest.raises(maskpack.Error) as e:
        tw.preprocess_thd_engine(ids, tp=1, cp=1, cp_rank=0)
    assert e.value.argument == "input_ids"


def test_documented_differences(up):
    """verl puts the padded offsets in cu_seqlens_q under CP (TransformerEngine issue 1930); maskpack's native
    bundle keeps the real ones there and the padded ones in cu_seqlens_q_padded."""
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    ids = torch.arange(10).view(2, 5)
    with _upstream(up, 1, 2, 0):
        _, pa = up.preprocess_packed_seqs(ids, mask)
    _, pb = tw.preprocess_packed_seqs(ids, mask, tp=1, cp=2, cp_rank=0)
    bundle = maskpack.prepare_batch({"input_ids": ids, "attention_mask": mask.long()}, backend="megatron",
                                    padding_free=True, cp=2, cp_rank=0)
    native = bundle.megatron_packed_seq_params()
    assert pa.cu_seqlens_q.tolist() == pb.cu_seqlens_q.tolist() == [0, 4, 12]
    assert native["cu_seqlens_q"].tolist() == [0, 3, 8]
    assert native["cu_seqlens_q_padded"].tolist() == pb.cu_seqlens_q_padded.tolist() == [0, 4, 12]


# ---- verl/utils/ulysses.py ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def uly():
    cu.require_upstream("verl")
    return cu._load_file("upstream_verl_ulysses", cu.UPSTREAM / "verl/utils/ulysses.py", {})


@SETTINGS
@given(st.integers(1, 30), st.integers(1, 8), st.booleans(), st.booleans(), st.integers(0, 3), st.integers(1, 2))
def test_ulysses_pad_and_slice_inputs(uly, t, sp, mrope, skip, pad_value, bsz):
    g = torch.Generator().manual_seed(t * 10 + sp)
    ids = torch.randint(1, 99, (bsz, t), generator=g)
    pos = torch.arange(t).unsqueeze(0)
    if mrope:
        pos = pos.expand(3, 1, t).clone()
    for r in range(sp):
        grp = cu.FakeGroup(sp, r)
        with cu.patched(uly, _ULYSSES_SEQUENCE_PARALLEL_GROUP=grp), cu.fake_group_queries():
            a = uly.ulysses_pad_and_slice_inputs(ids, pos, sp, skip, pad_value)
        b = tw.ulysses_pad_and_slice_inputs(ids, pos, sp, skip, pad_value, sp_rank=r)
        for k in range(3):
            if k == 1 and mrope and not skip and sp > 1:
                # verl slices dim 1 of M-RoPE [3, 1, T] position ids (the batch dimension): an empty tensor;
                # the twin slices the tokens, like the [1, T] case
                assert a[1].shape[1] == 0
                flat = tw.ulysses_pad_and_slice_inputs(ids, pos[0], sp, skip, pad_value, sp_rank=r)[1]
                cu.assert_same(b[1], flat.unsqueeze(0).expand(3, -1, -1), "M-RoPE positions sliced on tokens")
                continue
            cu.assert_same(a[k], b[k], f"output[{k}]")
        cu.count("verl.ulysses_pad_and_slice_inputs")


@SETTINGS
@given(st.integers(1, 6), st.integers(1, 8), st.integers(0, 2), st.booleans(), st.booleans())
def test_gather_outputs_and_unpad(uly, piece, sp, gather_dim, unpad, scaler):
    g = torch.Generator().manual_seed(piece * 10 + sp)
    shape = [2, 3, 4]
    shape[gather_dim] = piece
    parts = [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(sp)]
    total = piece * sp
    pad = total % 3 if unpad else 0
    unpad_dim = gather_dim if unpad else None

    def all_gather_into_tensor(output, local, group=None, async_op=False):
        output.copy_(torch.cat([p.detach() for p in parts], 0))

    for r in range(sp):
        grp = cu.FakeGroup(sp, r)
        xa = parts[r].clone().requires_grad_(True)
        xb = parts[r].clone().requires_grad_(True)
        with cu.fake_group_queries(), cu.patched(torch.distributed, all_gather_into_tensor=all_gather_into_tensor):
            a = uly.gather_outputs_and_unpad(xa, gather_dim, unpad_dim, pad, scaler, grp)
        with cu.fake_all_gather(parts):
            b = tw.gather_outputs_and_unpad(xb, gather_dim, unpad_dim, pad, scaler, None, sp_rank=r, sp_size=sp)
        cu.assert_same(a, b, "gathered")
        w = torch.randn(a.shape, generator=g, dtype=torch.float64)
        (a * w).sum().backward()
        (b * w).sum().backward()
        cu.assert_same(xa.grad, xb.grad, "grad")
        cu.count("verl.gather_outputs_and_unpad")


# ---- verl/utils/seqlen_balancing.py -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def balancing():
    import heapq

    ns = {"heapq": heapq, "torch": torch}
    cu.extract("verl/utils/seqlen_balancing.py", "karmarkar_karp", ns)
    return cu.extract("verl/utils/seqlen_balancing.py", "get_seqlen_balanced_partitions", ns)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.lists(st.integers(0, 8192), min_size=1, max_size=48), st.integers(1, 8), st.booleans(), st.booleans())
def test_get_seqlen_balanced_partitions(balancing, lens, k, equal, workload):
    """Not the same partition as verl's Karmarkar-Karp (another algorithm), but never a heavier heaviest part."""
    k = min(k, len(lens))
    if equal:
        lens = lens[: len(lens) // k * k]
    values = [24576 * n + n * n for n in lens] if workload else lens
    a = balancing(values, k, equal)
    b = tw.get_seqlen_balanced_partitions(values, k, equal)
    assert len(b) == k and all(q == sorted(q) and q for q in b)
    assert sorted(i for q in b for i in q) == list(range(len(values)))
    if equal:
        assert all(len(q) * k == len(values) for q in b)
    heaviest = lambda parts: max(sum(values[i] for i in q) for q in parts)  # noqa: E731
    assert heaviest(b) <= heaviest(a), (heaviest(b), heaviest(a))
    cu.count("verl.get_seqlen_balanced_partitions (never heavier)")


def test_parallel_state_fallback(up, monkeypatch):
    """Without tp= / cp= / cp_rank= a twin reads an initialized Megatron parallel_state, as upstream does."""
    cu.require_upstream("megatron")
    from megatron.core import parallel_state as ps

    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    ids = torch.arange(10).view(2, 5)
    fake = cu.FakeParallelState(2, 2, 1)
    for name in ("model_parallel_is_initialized", "get_tensor_model_parallel_world_size",
                 "get_context_parallel_world_size", "get_context_parallel_rank", "get_context_parallel_group"):
        monkeypatch.setattr(ps, name, getattr(fake, name))
    a = tw.preprocess_packed_seqs(ids, mask)
    b = tw.preprocess_packed_seqs(ids, mask, tp=2, cp=2, cp_rank=1)
    cu.assert_same(a[0], b[0], "input_ids_rmpad")
    cu.assert_params(a[1], b[1], "params")
    with _upstream(up, 2, 2, 1):
        c = up.preprocess_packed_seqs(ids, mask)
    cu.assert_same(a[0], c[0], "upstream")


def test_packed_seq_params_stand_in(monkeypatch):
    """Without megatron.core the twins return a dataclass with Megatron's fields plus cp_partition_mode."""
    from maskpack.compat import _common

    monkeypatch.setattr(_common, "_CLASS", [_common._PackedSeqParams])
    nested = torch.nested.as_nested_tensor([torch.arange(5), torch.arange(3)], layout=torch.jagged)
    _, p, _ = tw.preprocess_thd_engine(nested, True, False, False, None, None, None, "contiguous", tp=1, cp=2,
                                       cp_rank=0)
    assert type(p) is _common._PackedSeqParams and p.cp_partition_mode == "contiguous"
    names = {f.name for f in dataclasses.fields(p)}
    from megatron.core.packed_seq_params import PackedSeqParams

    assert {f.name for f in dataclasses.fields(PackedSeqParams)} <= names


def test_dynamic_cp(up, newer_psp):
    """verl's dynamic CP (local_cp_size): the twin takes the group and its rank."""
    nested = torch.nested.as_nested_tensor([torch.arange(1, 10), torch.arange(1, 4)], layout=torch.jagged)
    for r in range(2):
        grp = cu.FakeGroup(2, r)
        fake = cu.FakeParallelState(1, 1, 0)
        fake.get_dynamic_data_context_parallel_groups = lambda group_size: grp
        with _upstream(up, 1, 1, 0), cu.patched(up, mpu=fake), cu.fake_group_queries():
            a = up.preprocess_thd_engine(nested, True, False, False, 2)
        b = tw.preprocess_thd_engine(nested, True, False, False, 2, tp=1, cp_rank=r, group=grp)
        cu.assert_same(a[0], b[0], "input_ids_rmpad")
        cu.assert_same(a[2], b[2], "position_ids")
        cu.assert_params(a[1], b[1], "params")
        cu.count("verl.preprocess_thd_engine (dynamic CP)")


# ---- the padded pair and the fused-kernel output ------------------------------------------------------------

@SETTINGS
@given(padded_batches(), st.integers(1, 4), st.booleans(), st.booleans(), st.sampled_from([(), (3,)]))
def test_preprocess_postprocess_bshd(up, batch, tp, sp, pre, dense):
    mask, seed = batch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 99, mask.shape + dense, generator=g)
    pos = torch.randint(0, 99, mask.shape, generator=g)
    with _upstream(up, tp, 1, 0):
        a = up.preprocess_bshd(ids, mask, pos, sp, pre)
    b = tw.preprocess_bshd(ids, mask, pos, sp, pre, tp=tp, cp=1)
    for k in range(3):
        cu.assert_same(a[k], b[k], f"preprocess_bshd[{k}]")
    cu.count("verl.preprocess_bshd")
    res = torch.randn(a[1].shape + (2,), generator=g, dtype=torch.float64)
    ra = res.clone().requires_grad_(True)
    rb = res.clone().requires_grad_(True)
    oa = up.postprocess_bshd(ra, a[1], mask, mask.shape[1])
    ob = tw.postprocess_bshd(rb, b[1], mask, mask.shape[1])
    cu.assert_same(oa, ob, "postprocess_bshd")
    w = torch.randn(oa.shape, generator=g, dtype=torch.float64)
    (oa * w).sum().backward()
    (ob * w).sum().backward()
    cu.assert_same(ra.grad, rb.grad, "grad")
    cu.count("verl.postprocess_bshd")


@SETTINGS
@given(padded_batches(), parallel)
def test_postprocess_packed_seqs_for_dict_output(up, batch, par):
    mask, seed = batch
    tp, cp = par
    b_, s = mask.shape
    g = torch.Generator().manual_seed(seed)
    ent = torch.randn(b_, s, generator=g)
    lp = torch.randn(b_, s, generator=g)
    parts_e = [tw.preprocess_packed_seqs(ent, mask, tp=tp, cp=cp, cp_rank=r)[0] for r in range(cp)]
    parts_l = [tw.preprocess_packed_seqs(lp, mask, tp=tp, cp=cp, cp_rank=r)[0] for r in range(cp)]
    params = tw.preprocess_packed_seqs(ent, mask, tp=tp, cp=cp, cp_rank=0)[1]
    for r in range(cp):
        labels_mask = torch.rand(parts_l[r].shape, generator=g) > 0.3

        def gather(tensor_list, tensor, group=None, async_op=False):
            src = parts_e if tensor.data_ptr() == outs[0].entropy.data_ptr() else None
            for j, t in enumerate(tensor_list):
                t.copy_((parts_e if src is not None else masked_l)[j])

        masked_l = [p.masked_fill(~labels_mask, 0.0) if j == r else p for j, p in enumerate(parts_l)]
        outs = []
        res = []
        for fn, extra in ((up.postprocess_packed_seqs_for_dict_output, {}),
                          (tw.postprocess_packed_seqs_for_dict_output, dict(cp=cp, cp_rank=r))):
            o = types_ns(entropy=parts_e[r].clone(), log_probs=parts_l[r].clone())
            outs[:] = [o]
            with _upstream(up, tp, cp, r), cu.patched(torch.distributed, all_gather=gather):
                res.append(fn(labels_mask, o, params, mask, b_, s, True, **extra))
        for k in ("entropy", "log_probs"):
            cu.assert_same(res[0][k], res[1][k], k)
        cu.count("verl.postprocess_packed_seqs_for_dict_output")


def types_ns(**kw):
    import types

    return types.SimpleNamespace(**kw)


def test_balanced_partitions_zero_lengths(balancing):
    for lens, k, eq in (([0, 0, 0], 3, False), ([0, 0, 0, 0], 2, True), ([0, 5, 0, 0], 3, False), ([0] * 8, 4, False)):
        b = tw.get_seqlen_balanced_partitions(lens, k, eq)
        assert all(b) and sorted(i for q in b for i in q) == list(range(len(lens)))
        a = balancing(lens, k, eq)
        assert max(sum(lens[i] for i in q) for q in b) <= max(sum(lens[i] for i in q) for q in a)


@st.composite
def micro_batch_cases(draw):
    """Rows of real lengths (a padded [B, S] batch or a nested one), a token limit no smaller than the
    longest row (or group of rows), and verl's options."""
    fg = draw(st.sampled_from([1, 1, 2]))
    b = fg * draw(st.integers(1, 12 // fg))
    s = draw(st.integers(1, 64))
    lens = [draw(st.integers(0, s)) for _ in range(b)]
    groups = [sum(lens[g * fg:(g + 1) * fg]) for g in range(b // fg)]
    limit = max(s, max(groups)) + draw(st.integers(0, 3 * s))
    opts = {"use_dynamic_bsz_balance": draw(st.booleans()), "force_group_size": fg,
            "num_batches_divided_by": draw(st.sampled_from([None, None, 2])),
            "min_num_micro_batch": draw(st.sampled_from([None, None, 1, 3]))}
    return lens, s, limit, opts, draw(st.sampled_from(["padded", "nested", "dict"]))


def _rows_batch(lens, s, form, seed):
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(seed)
    b = len(lens)
    if form == "nested":
        ids = _nested([max(n, 1) for n in lens], seed)
        return TensorDict({"input_ids": ids, "loss_mask": _nested([max(n, 1) for n in lens], seed + 1, dense=(2,)),
                           "reward": torch.randn(b, generator=g)}, batch_size=b)
    mask = torch.zeros(b, s, dtype=torch.bool)
    for i, n in enumerate(lens):
        if i % 2:
            mask[i, s - n:] = True   # left padding
        else:
            mask[i, :n] = True
    data = {"input_ids": torch.randint(0, 100, (b, s), generator=g), "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0), "reward": torch.randn(b, 3, generator=g)}
    return data if form == "dict" else TensorDict(data, batch_size=b)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(micro_batch_cases())
def test_rearrange_micro_batches(case):
    """Against verl 0.9.1's own rearrange_micro_batches (its source, its TensorDict helpers, tensordict 0.10.0):
    every row once, each micro-batch within the token limit, groups whole, the rows selected exactly as verl's
    index_select_tensor_dict selects them; never more micro-batches than verl, and at verl's count never a
    heavier heaviest one; verl's bubble order (light ends, heavy middle)."""
    up, tu = cu.verl_seqlen_balancing()
    lens, s, limit, opts, form = case
    batch = _rows_batch(lens, s, form, seed=len(lens) * 100 + s)
    eff = [max(n, 1) for n in lens] if form == "nested" else lens
    td = batch if form != "dict" else _rows_batch(lens, s, "padded", seed=len(lens) * 100 + s)
    try:
        a_mbs, a_idx = up(td, limit, **opts)
    except (ValueError, AssertionError, IndexError):  # IndexError: verl asks for 0 partitions of a tokenless batch
        a_idx = None
    try:
        b_mbs, b_idx = tw.rearrange_micro_batches(batch, limit, **opts)
    except maskpack.Error:
        assert a_idx is None, "the twin refused a batch verl splits"
        return
    fg = opts["force_group_size"]
    assert sorted(i for q in b_idx for i in q) == list(range(len(lens)))
    for q in b_idx:
        assert sum(eff[i] for i in q) <= limit
        assert all(q[j] % fg == 0 and q[j:j + fg] == list(range(q[j], q[j] + fg)) for j in range(0, len(q), fg))
    if opts["num_batches_divided_by"]:
        assert len(b_idx) % opts["num_batches_divided_by"] == 0
    if opts["min_num_micro_batch"]:
        assert len(b_idx) >= opts["min_num_micro_batch"]
    for q, mb in zip(b_idx, b_mbs):
        ref = tu.index_select_tensor_dict(td, q)
        assert type(mb) is (dict if form == "dict" else type(ref))
        assert set(mb.keys()) == set(ref.keys())
        for k in ref.keys():
            cu.assert_same(ref[k], mb[k], f"micro-batch rows {q}: {k}")
    work = lambda q: sum(24576 * eff[i] + eff[i] ** 2 for i in q)  # noqa: E731  (verl's calculate_workload)
    if opts["use_dynamic_bsz_balance"]:
        w = sorted((work(q) for q in b_idx), reverse=True)
        assert [work(q) for q in b_idx] == w[::2][::-1] + w[1::2]
    if a_idx is not None:
        assert len(b_idx) <= len(a_idx), (len(b_idx), len(a_idx))
        if len(b_idx) == len(a_idx):
            assert max(map(work, b_idx)) <= max(map(work, a_idx))
    cu.count("verl.rearrange_micro_batches")


def test_rearrange_micro_batches_bad_input():
    mask = torch.ones(4, 8, dtype=torch.bool)
    with pytest.raises(maskpack.Error) as e:   # verl asserts
        tw.rearrange_micro_batches({"attention_mask": mask}, 7)
    assert e.value.argument == "max_token_len"
    with pytest.raises(maskpack.Error) as e:
        tw.rearrange_micro_batches({"attention_mask": mask}, 8, force_group_size=3)
    assert e.value.argument == "force_group_size"
    with pytest.raises(maskpack.Error) as e:   # a group of two full rows (16 tokens) cannot be split
        tw.rearrange_micro_batches({"attention_mask": mask}, 12, force_group_size=2)
    assert e.value.argument == "max_token_len" and isinstance(e.value, ValueError)
    with pytest.raises(maskpack.Error) as e:
        tw.rearrange_micro_batches({"input_ids": torch.zeros(4, 8)}, 8)
    assert e.value.argument == "batch"
    mbs, idx = tw.rearrange_micro_batches({"attention_mask": torch.zeros(3, 8, dtype=torch.bool),
                                           "meta": "kept", "names": ["a", "b", "c"]}, 8)
    assert idx == [[0, 1, 2]] and mbs[0]["meta"] == "kept" and mbs[0]["names"] == ["a", "b", "c"]
