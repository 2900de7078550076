"""maskpack.compat.megatron against megatron-core 0.16.1's own functions, and maskpack.compat.te against
TransformerEngine 2.11.0's pure-torch helpers (their source extracted unmodified) and a line-by-line port of
its CUDA-only thd_get_partitioned_indices (tests/python/compat_upstream.py), bit for bit."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import maskpack
from maskpack.compat import megatron as mg, te
from maskpack.compat._common import _PackedSeqParams

import compat_upstream as cu

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module", autouse=True)
def _counts():
    yield
    cu.write_counts()


@st.composite
def packed(draw, cp_max=8, mult=True, max_seqs=5, max_chunks=4):
    """cu_seqlens of sequences whose lengths divide by 2*cp (mult) or not."""
    cp = draw(st.integers(1, cp_max))
    n = draw(st.integers(1, max_seqs))
    if mult:
        lens = [2 * cp * draw(st.integers(0, max_chunks)) for _ in range(n)]
        if sum(lens) == 0:
            lens[0] = 2 * cp
    else:
        lens = [draw(st.integers(0, 13)) for _ in range(n)]
    c = [0]
    for x in lens:
        c.append(c[-1] + x)
    return cp, torch.tensor(c, dtype=torch.int32)


# ---- megatron ------------------------------------------------------------------------------------------

@SETTINGS
@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 3), st.booleans(), st.booleans())
def test_get_batch_on_this_cp_rank(cp, chunks, b, with_mask, via_group):
    utils = cu.megatron_module("megatron.core.utils")
    s = 2 * cp * chunks
    g = torch.Generator().manual_seed(cp * 100 + chunks)
    batch = {"tokens": torch.randint(0, 100, (b, s), generator=g), "labels": torch.randint(0, 100, (b, s), generator=g),
             "loss_mask": torch.rand(b, s, generator=g), "position_ids": torch.arange(s).expand(b, s),
             "hidden": torch.randn(b, s, 3, generator=g), "none": None}
    if with_mask:
        batch["attention_mask"] = torch.rand(b, 1, s, s, generator=g) > 0.5
    for r in range(cp):
        a_in = {k: v for k, v in batch.items()}
        b_in = {k: v for k, v in batch.items()}
        if via_group:
            grp = cu.FakeGroup(cp, r)
            with cu.patched(utils, get_pg_size=lambda g: g.size(), get_pg_rank=lambda g: g.rank()):
                a = utils.get_batch_on_this_cp_rank(a_in, grp)
            with cu.fake_group_queries():
                out = mg.get_batch_on_this_cp_rank(b_in, grp)
        else:
            with cu.patched(utils, parallel_state=cu.FakeParallelState(1, cp, r)):
                a = utils.get_batch_on_this_cp_rank(a_in)
            out = mg.get_batch_on_this_cp_rank(b_in, cp=cp, cp_rank=r)
        assert out is b_in and a is a_in
        assert a.keys() == out.keys()
        for k in a:
            cu.assert_same(a[k], out[k], k)
        cu.count("megatron.get_batch_on_this_cp_rank")


@SETTINGS
@given(packed(), st.integers(1, 2), st.integers(0, 3))
def test_thd_batch_on_this_cp_rank(case, b, trim):
    """get_thd_batch_on_this_cp_rank against megatron-core's (TransformerEngine's index: the port of its kernel),
    and get_batch_on_this_cp_rank given the same batch with its thd packed_seq_params entry (the newer form)."""
    cp, cuq = case
    utils = cu.megatron_module("megatron.core.utils")
    total = int(cuq[-1])
    slots = cuq.diff()
    real = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum((slots - trim).clamp(min=0), 0).to(torch.int32)])
    g = torch.Generator().manual_seed(total * 10 + trim)
    batch = {"tokens": torch.randint(0, 100, (b, total), generator=g), "labels": torch.randint(0, 100, (b, total), generator=g),
             "loss_mask": torch.rand(b, total, generator=g), "hidden": torch.randn(b, total, 3, generator=g),
             "attention_mask": torch.ones(b, 1, 1, 1), "cu_seqlens": real, "cu_seqlens_padded": cuq,
             "max_seqlen": slots.max().reshape(1)}
    skip = {"attention_mask", "cu_seqlens", "cu_seqlens_padded", "max_seqlen"}
    for r in range(cp):
        with cu.patched(utils, parallel_state=cu.FakeParallelState(1, cp, r), tex=cu.FakeTex,
                        is_te_min_version=lambda v, check_equality=True: True):
            a, pa = utils.get_thd_batch_on_this_cp_rank(dict(batch), real, cuq, batch["max_seqlen"])
        out, pb = mg.get_thd_batch_on_this_cp_rank(dict(batch), real, cuq, batch["max_seqlen"], cp_size=cp, cp_rank=r)
        assert a.keys() == out.keys()
        for k in a:
            cu.assert_same(a[k], out[k], k)
        cu.assert_params(pa, pb, "packed_seq_params")
        entry = {k: v for k, v in batch.items() if k not in skip}
        entry["packed_seq_params"] = pb
        c = mg.get_batch_on_this_cp_rank(entry, cp=cp, cp_rank=r)
        for k in a:
            if k not in skip:
                cu.assert_same(a[k], c[k], "packed_seq_params entry: " + k)
        assert c["packed_seq_params"] is pb and (cp == 1 or pb.cp_partition_mode == "zigzag")
        cu.count("megatron.get_thd_batch_on_this_cp_rank")
        cu.count("megatron.get_batch_on_this_cp_rank(packed_seq_params)")


def test_get_batch_on_this_cp_rank_newer_forms():
    """cp_size= (Megatron's spelling), dim3_keys=, entries that are not tensors, contiguous THD partitioning."""
    utils = cu.megatron_module("megatron.core.utils")
    cp, s = 2, 16
    g = torch.Generator().manual_seed(5)
    tokens, mask = torch.randint(0, 100, (2, s), generator=g), torch.rand(2, 1, s, s, generator=g) > 0.5
    for r in range(cp):
        with cu.patched(utils, parallel_state=cu.FakeParallelState(1, cp, r)):
            ref = utils.get_batch_on_this_cp_rank({"tokens": tokens, "attention_mask": mask})
        out = mg.get_batch_on_this_cp_rank({"tokens": tokens, "mask3": mask, "sizes": [3, 5], "none": None},
                                           cp_size=cp, cp_rank=r, dim3_keys=["mask3"])
        cu.assert_same(ref["tokens"], out["tokens"], "tokens")
        cu.assert_same(ref["attention_mask"], out["mask3"], "dim3_keys")
        assert out["sizes"] == [3, 5] and out["none"] is None
    x = torch.arange(32).view(2, 16)
    psp = _psp(torch.tensor([0, 10, 16], dtype=torch.int32), False)
    psp.cp_partition_mode = "contiguous"
    out = mg.get_batch_on_this_cp_rank({"tokens": x, "packed_seq_params": psp}, cp=2, cp_rank=1)
    assert torch.equal(out["tokens"], x[:, 8:16]) and out["packed_seq_params"] is psp
    psp = _psp(torch.tensor([0, 4, 16], dtype=torch.int32), False)  # the keyword wins and is recorded
    out = mg.get_batch_on_this_cp_rank({"tokens": x, "packed_seq_params": psp}, cp=2, cp_rank=0,
                                       cp_partition_mode="contiguous")
    assert torch.equal(out["tokens"], x[:, :8]) and psp.cp_partition_mode == "contiguous"
    out = mg.get_batch_on_this_cp_rank({"tokens": x, "packed_seq_params": _psp(torch.tensor([0, 4, 16],
                                        dtype=torch.int32), False)}, cp=2, cp_rank=0)
    assert out["tokens"][0].tolist() == [0, 3, 4, 5, 6, 13, 14, 15]  # zigzag per sequence: [0|..|3], [4..6|..|13..15]
    with pytest.raises(maskpack.Error) as e:
        mg.get_batch_on_this_cp_rank({"tokens": x}, cp=2, cp_size=4, cp_rank=0)
    assert e.value.argument == "cp_size"
    with pytest.raises(maskpack.Error) as e:  # a slot of 6 does not cut into 4 chunks
        mg.get_batch_on_this_cp_rank({"tokens": x, "packed_seq_params": _psp(torch.tensor([0, 6, 16],
                                      dtype=torch.int32), False)}, cp=2, cp_rank=0)
    assert e.value.argument == "packed_seq_params"
    with pytest.raises(maskpack.Error) as e:
        mg.get_batch_on_this_cp_rank({"tokens": x, "packed_seq_params": psp}, cp=2, cp_rank=0,
                                     cp_partition_mode="striped")
    assert e.value.argument == "cp_partition_mode"
    with pytest.raises(maskpack.Error) as e:
        mg.get_thd_batch_on_this_cp_rank({"tokens": x, "labels": torch.zeros(2, 15)}, torch.tensor([0, 16]),
                                         torch.tensor([0, 16], dtype=torch.int32), torch.tensor([16]), 2, 0)
    assert e.value.argument == "labels"


def _psp(cu_q, padded):
    return _PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_q, cu_seqlens_kv=cu_q,
                            cu_seqlens_q_padded=cu_q if padded else None, cu_seqlens_kv_padded=None)


@SETTINGS
@given(packed(), st.booleans(), st.booleans(), st.sampled_from([(), (2,), (2, 3)]))
def test_attention_load_balancing(case, use_packed, padded, dense):
    cp, cuq = case
    m = cu.megatron_module("megatron.core.ssm.mamba_context_parallel")
    total = int(cuq[-1])
    x = torch.randn((total,) + dense, generator=torch.Generator().manual_seed(total), dtype=torch.float64)
    psp = _psp(cuq, padded) if use_packed else None
    with cu.patched(m, tex=cu.FakeTex, is_te_min_version=lambda v: True):
        ua = m._undo_attention_load_balancing(x, cp, psp)
        ra = m._redo_attention_load_balancing(x, cp, psp)
    ub = mg.undo_attention_load_balancing(x, cp, psp)
    rb = mg.redo_attention_load_balancing(x, cp, psp)
    cu.assert_same(ua, ub, "undo")
    cu.assert_same(ra, rb, "redo")
    cu.assert_same(mg.redo_attention_load_balancing(ub, cp, psp), x, "redo(undo)")
    xg = x.clone().requires_grad_(True)
    w = torch.randn_like(x)
    (mg.undo_attention_load_balancing(xg, cp, psp) * w).sum().backward()
    cu.assert_same(xg.grad, mg.redo_attention_load_balancing(w, cp, psp), "adjoint")
    cu.count("megatron.undo_attention_load_balancing")
    cu.count("megatron.redo_attention_load_balancing")


@SETTINGS
@given(packed(cp_max=1, mult=False, max_seqs=5), st.booleans(), st.integers(0, 4), st.sampled_from([(), (2,)]),
       st.sampled_from([torch.float32, torch.int64]))
def test_roll_tensor(case, use_packed, tail, lead, dtype):
    mtp = cu.megatron_module("megatron.core.transformer.multi_token_prediction")
    _, cuq = case
    n = int(cuq[-1]) + tail
    if n == 0:
        n = 1
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(lead + (n,), generator=g) * 10).to(dtype)
    psp = _psp(cuq, False) if use_packed else None
    a = mtp.roll_tensor(x, -1, -1, None, psp)
    b = mg.roll_tensor(x, -1, -1, None, psp)
    cu.assert_same(a[0], b[0], "rolled")
    cu.assert_same(a[1], b[1], "sum")
    if not use_packed and x.dim() > 1:
        a = mtp.roll_tensor(x, -1, 0, None, None)
        b = mg.roll_tensor(x, -1, 0, None, None)
        cu.assert_same(a[0], b[0], "rolled dim 0")
    cu.count("megatron.roll_tensor")


# ---- TransformerEngine ------------------------------------------------------------------------------------

@SETTINGS
@given(packed())
def test_thd_get_partitioned_indices(case):
    cp, cuq = case
    total = int(cuq[-1])
    for r in range(cp):
        cu.assert_same(cu.port_thd_get_partitioned_indices(cuq, total, cp, r),
                       te.thd_get_partitioned_indices(cuq, total, cp, r), "indices")
        cu.count("te.thd_get_partitioned_indices (port)")


@SETTINGS
@given(packed(mult=False), st.integers(1, 8), st.sampled_from([torch.int32, torch.int64]))
def test_te_padding_helpers(case, factor, dtype):
    ref = cu.te_functions()
    _, cuq = case
    cuq = cuq.to(dtype)
    total = int(cuq[-1])
    g = torch.Generator().manual_seed(total)
    ids = torch.randint(1, 50, (total,), generator=g)
    labels = torch.randint(0, 50, (1, total), generator=g)
    for pad_tok, pad_lab in ((0, -100), (7, -1)):
        a = ref.pad_thd_sequences_for_cp(ids, labels, cuq, factor, pad_tok, pad_lab)
        b = te.pad_thd_sequences_for_cp(ids, labels, cuq, factor, pad_tok, pad_lab)
        for k in range(3):
            cu.assert_same(a[k], b[k], f"pad_thd_sequences_for_cp[{k}]")
        cu.count("te.pad_thd_sequences_for_cp")
    for pdt in (torch.long, torch.int32):
        cu.assert_same(ref.generate_positional_ids_for_cp(cuq, factor, pdt), te.generate_positional_ids_for_cp(cuq, factor, pdt),
                       "generate_positional_ids_for_cp")
        cu.count("te.generate_positional_ids_for_cp")


@SETTINGS
@given(packed(), st.booleans(), st.booleans())
def test_te_cp_rank_helpers(case, first, second):
    ref = cu.te_functions()
    cp, cu_padded = case
    slots = cu_padded.diff()
    g = torch.Generator().manual_seed(int(cu_padded[-1]))
    lens = torch.stack([torch.randint(0, int(s) + 1, (1,), generator=g)[0] for s in slots]).to(torch.int32)
    cu_real = torch.zeros_like(cu_padded)
    cu_real[1:] = torch.cumsum(lens, 0)
    total = int(cu_padded[-1])
    ids = torch.randint(1, 50, (1, total), generator=g)
    labels = torch.randint(0, 50, (total,), generator=g)
    pos = torch.randint(0, 50, (total, 2), generator=g)
    for r in range(cp):
        cu.assert_same(ref.get_cu_seqlens_on_cp_rank(cu_real, cu_padded // cp, cp, r, first, second),
                       te.get_cu_seqlens_on_cp_rank(cu_real, cu_padded // cp, cp, r, first, second),
                       "get_cu_seqlens_on_cp_rank")
        cu.count("te.get_cu_seqlens_on_cp_rank")
        grp = cu.FakeGroup(cp, r)
        with cu.fake_group_queries():
            a = ref.get_batch_on_this_cp_rank(cu_padded, ids, labels, pos, grp)
            b = te.get_batch_on_this_cp_rank(cu_padded, ids, labels, pos, grp)
        for k in range(3):
            cu.assert_same(a[k], b[k], f"get_batch_on_this_cp_rank[{k}]")
        cu.count("te.get_batch_on_this_cp_rank")


# ---- documented differences and bad input ----------------------------------------------------------------

def test_te_positions_continue_through_padding():
    """TransformerEngine continues positions through each sequence's padding; maskpack writes 0 there."""
    ref = cu.te_functions()
    cuq = torch.tensor([0, 3, 8], dtype=torch.int32)
    a = ref.generate_positional_ids_for_cp(cuq, 4)
    assert a.tolist() == te.generate_positional_ids_for_cp(cuq, 4).tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7]
    native = maskpack.Layout.from_cu_seqlens(cuq).pad_to_multiple(4).position_ids()
    assert native.tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 4, 0, 0, 0]


def test_bad_input():
    cuq = torch.tensor([0, 6, 12], dtype=torch.int32)
    with pytest.raises(maskpack.Error) as e:  # TE floors the chunk size: tokens silently dropped
        te.get_batch_on_this_cp_rank(cuq, torch.zeros(1, 12), torch.zeros(12), torch.zeros(12), None, cp=2, cp_rank=0)
    assert e.value.argument == "cu_seqlens_padded"
    with pytest.raises(maskpack.Error) as e:  # indices past the last sequence
        te.thd_get_partitioned_indices(torch.tensor([0, 8], dtype=torch.int32), 16, 2, 0)
    assert e.value.argument == "total_tokens"
    with pytest.raises(maskpack.Error) as e:
        te.pad_thd_sequences_for_cp(torch.zeros(5), torch.zeros(5), cuq, 4)
    assert e.value.argument == "input_ids"
    with pytest.raises(maskpack.Error) as e:  # Megatron's view() fails without naming the key
        mg.get_batch_on_this_cp_rank({"tokens": torch.zeros(1, 6)}, cp=2, cp_rank=0)
    assert e.value.argument == "tokens"
    with pytest.raises(maskpack.Error) as e:  # Megatron's torch.chunk would cut uneven chunks
        mg.undo_attention_load_balancing(torch.zeros(6), 2)
    assert e.value.argument == "input_"
    with pytest.raises(maskpack.Error) as e:
        mg.get_batch_on_this_cp_rank({"tokens": torch.zeros(1, 8)})
    assert e.value.argument == "cp" and "cp=" in str(e.value)
