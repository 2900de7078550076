"""maskpack.compat.swift against ms-swift 4.6.0's own functions and maskpack.compat.mcore_bridge against
mcore-bridge 1.6.5's, each extracted unmodified from build/upstream (their packages' imports need the
whole framework stack) with parallel_state, is_torch_npu_available and the all-gather faked per case."""

from __future__ import annotations

import types
from typing import Any, Dict, Optional

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import maskpack
from maskpack.compat import mcore_bridge as mb, swift as sw

import compat_upstream as cu

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module")
def up():
    cu.require_upstream("swift")
    from megatron.core.packed_seq_params import PackedSeqParams

    mamba = cu.megatron_module("megatron.core.ssm.mamba_context_parallel")
    npu = {"on": False}
    ns_mb = {"torch": torch, "Optional": Optional, "mpu": None}
    split = cu.extract("mcore_bridge/utils/megatron_utils.py", "split_cp_inputs", ns_mb)
    ns_q = {"torch": torch, "Optional": Optional, "is_torch_npu_available": lambda: npu["on"]}
    resolve = cu.extract("mcore_bridge/model/gpts/qwen3_next.py", "resolve_gdn_attention_mask", ns_q)
    ns_t = {"torch": torch}
    hf_params = cu.extract("swift/utils/transformers_utils.py", "get_packed_seq_params", ns_t)
    ns_u = {"torch": torch, "_get_packed_seq_params": hf_params, "PackedSeqParams": PackedSeqParams,
            "is_torch_npu_available": lambda: npu["on"], "mpu": None,
            "_undo_attention_load_balancing": mamba._undo_attention_load_balancing}
    mg_params = cu.extract("swift/megatron/utils/utils.py", "get_packed_seq_params", ns_u)
    padding_to = cu.extract("swift/megatron/utils/utils.py", "get_padding_to", ns_u)
    recon_dim = cu.extract("swift/megatron/utils/utils.py", "reconstruct_tensor_cp", ns_u)
    ns_l = {"torch": torch, "Dict": Dict, "Any": Any, "mpu": None, "split_cp_inputs": split,
            "is_torch_npu_available": lambda: npu["on"]}
    cp_rank_fn = cu.extract("swift/megatron/utils/megatron_lm_utils.py", "get_batch_on_this_cp_rank", ns_l)
    ns_tr = {"torch": torch, "mpu": None}
    prep = cu.extract("swift/megatron/trainers/utils.py", "_prepare_npu_generated_attention_mask", ns_tr)
    recon = cu.extract("swift/megatron/trainers/utils.py", "reconstruct_tensor_cp", ns_tr)
    ns_tu = {"torch": torch}
    last_valid = cu.extract("swift/utils/torch_utils.py", "get_last_valid_indices", ns_tu)
    ns_b = {"torch": torch, "reconstruct_tensor_cp": recon_dim, "get_last_valid_indices": last_valid}
    last_tokens = cu.extract("swift/megatron/trainers/base.py", "get_last_tokens", ns_b, cls="BaseMegatronTrainer")

    def set_ps(ps):
        for ns in (ns_mb, ns_u, ns_l, ns_tr):
            ns["mpu"] = ps

    with cu.patched(mamba, tex=cu.FakeTex, is_te_min_version=lambda v: True):
        yield types.SimpleNamespace(npu=npu, set_ps=set_ps, split=split, resolve=resolve, hf_params=hf_params,
                                    mg_params=mg_params, padding_to=padding_to, cp_rank=cp_rank_fn, prep=prep,
                                    recon=recon, last_tokens=last_tokens)
    cu.write_counts()


@st.composite
def cu_divisible(draw, cp, max_seqs=4, max_chunks=3, allow_empty=True):
    n = draw(st.integers(1, max_seqs))
    lens = [2 * cp * draw(st.integers(0 if allow_empty else 1, max_chunks)) for _ in range(n)]
    if sum(lens) == 0:
        lens[0] = 2 * cp
    c = [0]
    for x in lens:
        c.append(c[-1] + x)
    return torch.tensor(c, dtype=torch.int32)


# ---- mcore-bridge ----------------------------------------------------------------------------------------

@SETTINGS
@given(st.data(), st.integers(1, 8), st.booleans(), st.sampled_from(["zigzag", "contiguous"]), st.integers(0, 2))
def test_split_cp_inputs(up, data, cp, packed, mode, dim):
    cuq = data.draw(cu_divisible(cp)) if packed else None
    n = int(cuq[-1]) if packed else 2 * cp * data.draw(st.integers(1, 3))
    shape = [2, 3, 2]
    shape[dim] = n
    x = torch.randn(shape, generator=torch.Generator().manual_seed(n))
    for r in range(cp):
        up.set_ps(cu.FakeParallelState(1, cp, r))
        a = up.split(x, cuq, dim - 3 if dim else dim, mode)
        b = mb.split_cp_inputs(x, cuq, dim - 3 if dim else dim, mode, cp=cp, cp_rank=r)
        cu.assert_same(a, b, "split_cp_inputs")
        cu.count("mcore_bridge.split_cp_inputs")


def _mask4d(data, b, s, min_len=0):
    rows = []
    for _ in range(b):
        n = data.draw(st.integers(min_len, s))
        rows.append((s - n, n) if data.draw(st.booleans()) else (0, n))
    lay = maskpack.Layout.from_segments([(i, st_, n) for i, (st_, n) in enumerate(rows)], b, s)
    return torch.as_tensor(lay.mask4d("masked")), torch.as_tensor(lay.mask2d())


@SETTINGS
@given(st.data(), st.integers(1, 4), st.integers(1, 12), st.booleans(), st.booleans(), st.booleans())
def test_resolve_gdn_attention_mask(up, data, b, s, npu, with_2d, random_mask):
    m4, m2 = _mask4d(data, b, s)
    if random_mask:
        m4 = torch.rand(b, 1, s, s, generator=torch.Generator().manual_seed(b * s)) > 0.7
    kwargs = {"attention_mask": m4}
    if with_2d:
        kwargs["attention_mask_2d"] = m2.long()
    up.npu["on"] = npu
    cu.assert_same(up.resolve(kwargs), mb.resolve_gdn_attention_mask(kwargs, npu=npu), "mask")
    cu.assert_same(up.resolve({}), mb.resolve_gdn_attention_mask({}, npu=npu), "none")
    cu.count("mcore_bridge.resolve_gdn_attention_mask")


# ---- ms-swift --------------------------------------------------------------------------------------------

@st.composite
def packed_positions(draw):
    lens = draw(st.lists(st.integers(1, 9), min_size=1, max_size=5))
    cp = draw(st.integers(1, 4))
    filler = draw(st.integers(0, 3))  # ms-swift's CP tail filler: arange(2 cp) repeated
    pos = [torch.arange(n) for n in lens] + [torch.arange(2 * cp)] * filler
    return torch.cat(pos).unsqueeze(0), lens, cp, filler


@SETTINGS
@given(packed_positions(), st.booleans(), st.sampled_from(["zigzag", "contiguous"]))
def test_get_packed_seq_params(up, case, npu, mode):
    pos, lens, cp, filler = case
    a = up.hf_params(pos)
    b = sw.get_packed_seq_params(pos)
    assert a.keys() == b.keys()
    for k in a:
        cu.assert_same(a[k], b[k], k)
    cu.count("swift.get_packed_seq_params")
    args = types.SimpleNamespace(cp_partition_mode=mode)
    up.npu["on"] = npu
    pa = up.mg_params(args, pos)
    pb = sw.get_megatron_packed_seq_params(args, pos, npu=npu)
    cu.assert_params(pa, pb, "params")
    assert hasattr(pa, "cp_partition_mode") == hasattr(pb, "cp_partition_mode")
    cu.count("swift.get_megatron_packed_seq_params")
    assert a["cu_seq_lens_q"].numel() - 1 == len(lens) + filler  # the filler counts as sequences, as in ms-swift


def test_get_padding_to(up):
    n = 0
    for tp in (1, 2, 4):
        for sp in (False, True):
            for cp in (1, 2, 4, 8):
                for recipe in (None, "delayed", "blockwise", "mxfp8"):
                    for fp8 in (None, "e4m3"):
                        for fp4 in (None, "nvfp4"):
                            for backend in ("flash", "fused", "auto"):
                                args = types.SimpleNamespace(tensor_model_parallel_size=tp, sequence_parallel=sp,
                                                             context_parallel_size=cp, fp8_recipe=recipe,
                                                             fp8_format=fp8, fp4_format=fp4, attention_backend=backend)
                                assert up.padding_to(args) == sw.get_padding_to(args), vars(args)
                                n += 1
    cu.count("swift.get_padding_to", n)


@SETTINGS
@given(st.data(), st.integers(1, 8), st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from(["causal_lm", "seq_cls"]), st.sampled_from(["zigzag", "contiguous"]))
def test_get_batch_on_this_cp_rank(up, data, cp, packed, npu, multimodal, task, mode):
    if packed:
        cuq = data.draw(cu_divisible(cp, allow_empty=False))
        b, n = 1, int(cuq[-1])
        psp = types.SimpleNamespace(cu_seqlens_q=cuq)
    else:
        b, n = data.draw(st.integers(1, 3)), 2 * cp * data.draw(st.integers(1, 3))
        psp = None
    g = torch.Generator().manual_seed(n * 7 + b)
    batch = {"input_ids": torch.randint(0, 99, (b, n), generator=g), "labels": torch.randint(0, 99, (b, n), generator=g),
             "position_ids": torch.randint(0, 99, (b, n), generator=g), "loss_scale": torch.rand(b, n, generator=g),
             "attention_mask_2d": torch.rand(b, n, generator=g) > 0.2, "other": torch.arange(3)}
    if psp is not None:
        batch["packed_seq_params"] = psp
    if not packed:
        batch["attention_mask"] = torch.rand(b, 1, n, n, generator=g) > 0.5
    args = types.SimpleNamespace(is_multimodal=multimodal, task_type=task, cp_partition_mode=mode)
    up.npu["on"] = npu
    for r in range(cp):
        up.set_ps(cu.FakeParallelState(1, cp, r))
        a = up.cp_rank(args, dict(batch))
        bb = sw.get_batch_on_this_cp_rank(args, dict(batch), cp=cp, cp_rank=r, npu=npu)
        assert a.keys() == bb.keys()
        for k in a:
            if k == "attention_mask_2d" and cp > 1:
                # ms-swift leaves the 2D keep mask whole under CP; the twin splits it with the tokens
                cu.assert_same(a[k], batch[k], "upstream leaves attention_mask_2d unsplit")
                cu.assert_same(bb[k], mb.split_cp_inputs(batch[k], psp.cu_seqlens_q if packed else None, -1, mode,
                                                         cp=cp, cp_rank=r), "attention_mask_2d split")
                continue
            if k == "packed_seq_params":
                assert a[k] is bb[k]
                continue
            cu.assert_same(a[k], bb[k], k)
        cu.count("swift.get_batch_on_this_cp_rank")


@SETTINGS
@given(st.data(), st.booleans(), st.booleans())
def test_prepare_npu_attention_mask(up, data, keep, with_2d):
    m4, m2 = _mask4d(data, data.draw(st.integers(1, 3)), data.draw(st.integers(1, 9)))
    batch = {"attention_mask": m4, "input_ids": torch.zeros(3)}
    if with_2d:
        batch["attention_mask_2d"] = m2
    a, b = dict(batch), dict(batch)
    assert up.prep(a, keep_attention_mask_2d=keep) is None
    assert sw.prepare_npu_attention_mask(b, keep) is None
    assert a.keys() == b.keys()
    for k in a:
        cu.assert_same(a[k], b[k], k)
    cu.count("swift.prepare_npu_attention_mask")


@SETTINGS
@given(st.data(), st.integers(1, 4), st.booleans(), st.sampled_from(["zigzag", "contiguous"]))
def test_reconstruct_tensor_cp(up, data, cp, packed, mode):
    if packed:
        cuq = data.draw(cu_divisible(cp))
        n = int(cuq[-1])
        k = data.draw(st.integers(0, cuq.numel() - 1))
        psp = types.SimpleNamespace(cu_seqlens_q=cuq)
        full = torch.randn(1, n, generator=torch.Generator().manual_seed(n))
        parts = [mb.split_cp_inputs(full, cuq if mode == "zigzag" else None, 1, mode, cp=cp, cp_rank=r)
                 for r in range(cp)]
    else:
        b, n = data.draw(st.integers(1, 3)), 2 * cp * data.draw(st.integers(1, 3))
        k, psp = b, None
        full = torch.randn(b, n, generator=torch.Generator().manual_seed(n))
        parts = [mb.split_cp_inputs(full, None, 1, "zigzag", cp=cp, cp_rank=r) for r in range(cp)]
        mode = "zigzag"
    for r in range(cp):
        up.set_ps(cu.FakeParallelState(1, cp, r))
        xa = parts[r].clone().requires_grad_(True)
        xb = parts[r].clone().requires_grad_(True)
        with cu.fake_all_gather(parts):
            a = up.recon(cp, xa, psp, k, mode)
            bb = sw.reconstruct_tensor_cp(cp, xb, psp, k, mode, cp_rank=r)
        cu.assert_same(a, bb, "reconstruct_tensor_cp")
        w = torch.randn(a.shape)
        (a * w).sum().backward()
        (bb * w).sum().backward()
        cu.assert_same(xa.grad, xb.grad, "grad")
        cu.count("swift.reconstruct_tensor_cp")


@SETTINGS
@given(st.data(), st.integers(1, 4), st.booleans(), st.booleans())
def test_get_last_tokens(up, data, cp, packed, mask4d):
    if packed:
        cuq = data.draw(cu_divisible(cp, allow_empty=False))
        n = int(cuq[-1])
        lens = cuq.diff()
        seq_lens = torch.stack([torch.randint(1, int(s) + 1, (1,), generator=torch.Generator().manual_seed(int(s)))[0]
                                for s in lens])
        k = data.draw(st.integers(1, lens.numel()))
        psp = types.SimpleNamespace(cu_seqlens_q=cuq, cu_seqlens_q_padded=cuq, seq_lens=seq_lens[:k])
        full = torch.randn(1, n, 3, generator=torch.Generator().manual_seed(n))
        mask = None
        parts = [mb.split_cp_inputs(full, cuq, 1, cp=cp, cp_rank=r) for r in range(cp)]
    else:
        b, n = data.draw(st.integers(1, 3)), 2 * cp * data.draw(st.integers(1, 3))
        m4, m2 = _mask4d(data, b, n, min_len=1)
        mask = m4 if mask4d else m2
        psp = None
        full = torch.randn(b, n, 3, generator=torch.Generator().manual_seed(n))
        parts = [mb.split_cp_inputs(full, None, 1, cp=cp, cp_rank=r) for r in range(cp)]
    args = types.SimpleNamespace(context_parallel_size=cp, cp_partition_mode="zigzag")
    for r in range(cp):
        up.set_ps(cu.FakeParallelState(1, cp, r))
        with cu.fake_all_gather(parts):
            a = up.last_tokens(types.SimpleNamespace(args=args), parts[r], psp, mask)
            bb = sw.get_last_tokens(args, parts[r], psp, mask, cp_rank=r)
        cu.assert_same(a, bb, "get_last_tokens")
        cu.count("swift.get_last_tokens")


def test_bad_input():
    with pytest.raises(maskpack.Error) as e:  # ms-swift's cu_seqlens would start at 2
        sw.get_packed_seq_params(torch.tensor([[1, 2, 0, 1]]))
    assert e.value.argument == "position_ids"
    with pytest.raises(maskpack.Error) as e:  # mcore-bridge's view() fails
        mb.split_cp_inputs(torch.zeros(1, 6), torch.tensor([0, 6]), -1, cp=2, cp_rank=0)
    assert e.value.argument == "cu_seqlens"
    with pytest.raises(maskpack.Error) as e:  # tokens past cu_seqlens[-1] would be dropped
        mb.split_cp_inputs(torch.zeros(1, 12), torch.tensor([0, 8]), -1, cp=2, cp_rank=0)
    assert e.value.argument == "cu_seqlens"
    with pytest.raises(maskpack.Error) as e:
        mb.split_cp_inputs(torch.zeros(1, 8), None, -1)
    assert e.value.argument == "cp" and "cp=" in str(e.value)
    with pytest.raises(maskpack.Error) as e:  # ~ on an integer mask is not a logical not
        mb.resolve_gdn_attention_mask({"attention_mask": torch.ones(1, 1, 2, 2, dtype=torch.int64)}, npu=False)
    assert e.value.argument == "attention_mask"
    args = types.SimpleNamespace(context_parallel_size=1, cp_partition_mode="zigzag")
    with pytest.raises(maskpack.Error) as e:  # ms-swift would return the row's last column, a pad
        sw.get_last_tokens(args, torch.zeros(2, 3, 4), None, torch.tensor([[1, 1, 0], [0, 0, 0]]))
    assert e.value.argument == "attention_mask" and e.value.index == (1,)
