"""The twins that communicate, across 2 and 4 gloo processes, against the upstream functions running in the
same processes over the same group: verl 0.9.1's postprocess functions (grad="own" equals verl's gradient
bit for bit; grad="sum", maskpack.cp_all_gather, gives exactly cp times it when every rank computes the same
loss: the documented difference) and megatron-core 0.16.1's roll_tensor under CP (its point-to-point
exchange against the twin's all-gather; values, sums and gradients)."""

from __future__ import annotations

import os
import sys
import tempfile
import types

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import compat_upstream as cu

HERE = os.path.dirname(os.path.abspath(__file__))


def mg_split(x, cu, cp, rank):
    """The rank's zigzag part of each sequence of cu along the last dimension (maskpack's shard)."""
    import maskpack

    idx = torch.as_tensor(maskpack.Layout.from_cu_seqlens(cu.to(torch.int64)).cp_shard_indices(cp, rank, align=None))
    return x.index_select(-1, idx)


def _worker(rank, world, init_file, out_dir):
    sys.path.insert(0, HERE)
    import compat_upstream as cu
    from maskpack.compat import verl as tw

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        up = cu.verl_mcore_util()
        g = torch.Generator().manual_seed(11)
        mask = torch.zeros(3, 13, dtype=torch.bool)
        mask[0, :13] = True
        mask[1, 9:] = True   # left-padded, 4 tokens (shorter than 2*cp at cp = 4)
        mask[2, :1] = True   # one token
        hidden = torch.randn(3, 13, 5, generator=g, dtype=torch.float64)
        w = torch.randn(3, 13, 5, generator=g, dtype=torch.float64)  # the same loss on every rank
        res = {}
        for fp8 in (False, True):
            x, params = tw.preprocess_packed_seqs(hidden, mask, True, fp8, tp=1, cp=world, cp_rank=rank)
            xa = x.clone().requires_grad_(True)
            with cu.patched(up, mpu=cu.FakeParallelState(1, world, rank, dist.group.WORLD)):
                oa = up.postprocess_packed_seqs(xa, params, mask, 3, 13)
            (oa * w).sum().backward()
            for grad in ("own", "sum"):
                xb = x.clone().requires_grad_(True)
                ob = tw.postprocess_packed_seqs(xb, params, mask, 3, 13, grad=grad, cp=world, cp_rank=rank,
                                                group=dist.group.WORLD)
                (ob * w).sum().backward()
                res[(fp8, grad)] = (oa.detach(), ob.detach(), xa.grad, xb.grad)
            # the engine pair, nested tensors
            lens = [13, 4, 1]
            nested = torch.nested.as_nested_tensor([hidden[0], hidden[1, 9:], hidden[2, :1]], layout=torch.jagged)
            ids = torch.nested.as_nested_tensor([torch.arange(n) for n in lens], layout=torch.jagged)
            xt, pt, _ = tw.preprocess_thd_engine(nested, True, False, fp8, tp=1, cp=world, cp_rank=rank)
            xa = xt.clone().requires_grad_(True)
            with cu.patched(up, mpu=cu.FakeParallelState(1, world, rank, dist.group.WORLD)):
                oa = up.postprocess_thd_engine(xa, pt, ids, 3)
            wv = torch.randn(oa.values().shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
            (oa.values() * wv).sum().backward()
            for grad in ("own", "sum"):
                xb = xt.clone().requires_grad_(True)
                ob = tw.postprocess_thd_engine(xb, pt, ids, 3, grad=grad, cp=world, cp_rank=rank,
                                               group=dist.group.WORLD)
                (ob.values() * wv).sum().backward()
                res[("thd", fp8, grad)] = (oa.values().detach(), ob.values().detach(), xa.grad, xb.grad)
            xs, ms, _ = tw.preprocess_bshd_engine(nested, True, False, fp8, tp=1, cp=world, cp_rank=rank, npu=False)
            xa = xs.clone().requires_grad_(True)
            with cu.patched(up, mpu=cu.FakeParallelState(1, world, rank, dist.group.WORLD), is_npu_available=False):
                oa = up.postprocess_bshd_engine(xa, ms)
            (oa.values() * wv).sum().backward()
            for grad in ("own", "sum"):
                xb = xs.clone().requires_grad_(True)
                ob = tw.postprocess_bshd_engine(xb, ms, grad=grad, cp=world, cp_rank=rank, group=dist.group.WORLD,
                                                npu=False)
                (ob.values() * wv).sum().backward()
                res[("bshd", fp8, grad)] = (oa.values().detach(), ob.values().detach(), xa.grad, xb.grad)
        # megatron-core's roll_tensor under CP: packed (cu_seqlens_q over the whole padded batch) and not
        from maskpack.compat import megatron as mg

        mtp = cu.megatron_module("megatron.core.transformer.multi_token_prediction")
        cu_q = torch.tensor([0, 4 * world, 10 * world], dtype=torch.int32)  # (an empty sequence crashes Megatron)
        full = torch.randn(2, 10 * world, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        psp = types.SimpleNamespace(cu_seqlens_q=cu_q)
        for key, (whole, p) in {"roll packed": (full, psp), "roll": (full, None)}.items():
            cuts = cu_q if p is not None else torch.tensor([0, whole.shape[-1]])
            part = mg_split(whole, cuts, world, rank)
            xa = part.clone().requires_grad_(True)
            xb = part.clone().requires_grad_(True)
            with cu.patched(torch.cuda, current_device=lambda: "cpu"):
                ra, sa = mtp.roll_tensor(xa, -1, -1, dist.group.WORLD, p)
            rb, sb = mg.roll_tensor(xb, -1, -1, dist.group.WORLD, p)
            wv = torch.randn(ra.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
            (ra * wv).sum().backward()
            (rb * wv).sum().backward()
            res[(key, "own")] = (torch.cat([ra.detach().flatten(), sa.detach().view(1)]),
                                 torch.cat([rb.detach().flatten(), sb.detach().view(1)]), xa.grad, xb.grad)
        torch.save(res, os.path.join(out_dir, f"r{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_postprocess_gradients_across_processes(world):
    cu.require_upstream("verl")
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_worker, args=(world, os.path.join(d, "init"), d), nprocs=world, join=True,
                           start_method="spawn")
        n = 0
        for r in range(world):
            res = torch.load(os.path.join(d, f"r{r}.pt"))
            for key, (oa, ob, ga, gb) in res.items():
                assert torch.equal(oa, ob), key
                if key[-1] == "own":
                    assert torch.equal(ga, gb), key            # verl's own-part gradient, bit for bit
                else:
                    assert torch.equal(gb, world * ga), key    # every rank's gradient summed: cp times verl's
                n += 1
    cu.count(f"verl.postprocess_* and megatron.roll_tensor under CP (gloo, {world} ranks)", n)
    cu.write_counts()


def _rearrange_worker(rank, world, init_file, out_dir):
    """Each rank a batch of its own; the micro-batch count is agreed over the group by verl and by the twin."""
    sys.path.insert(0, HERE)
    import compat_upstream as cu
    from maskpack.compat import verl as tw

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        up, _ = cu.verl_seqlen_balancing()
        g = torch.Generator().manual_seed(rank)
        n_rows = 8
        lens = torch.randint(1, 9 + 8 * rank, (n_rows,), generator=g)   # rank r's rows longer than rank r - 1's
        mask = torch.arange(32).expand(n_rows, 32) < lens[:, None]
        batch = {"attention_mask": mask, "input_ids": torch.arange(n_rows * 32).view(n_rows, 32)}
        res = {}
        for balance in (False, True):
            from tensordict import TensorDict

            _, a_idx = up(TensorDict(dict(batch), batch_size=n_rows), 40, dist.group.WORLD,
                          use_dynamic_bsz_balance=balance)
            _, b_idx = tw.rearrange_micro_batches(dict(batch), 40, dist.group.WORLD, use_dynamic_bsz_balance=balance)
            _, alone = tw.rearrange_micro_batches(dict(batch), 40, use_dynamic_bsz_balance=balance)
            res[balance] = (len(a_idx), len(b_idx), [sum(int(lens[i]) for i in q) for q in b_idx], len(alone))
        torch.save(res, os.path.join(out_dir, f"m{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_rearrange_micro_batches_agree_over_dp(world):
    cu.require_upstream("verl")
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_rearrange_worker, args=(world, os.path.join(d, "init"), d), nprocs=world, join=True,
                           start_method="spawn")
        res = [torch.load(os.path.join(d, f"m{r}.pt")) for r in range(world)]
    for balance in (False, True):
        counts = {r[balance][1] for r in res}
        assert len(counts) == 1, counts                       # one count on every rank
        assert {r[balance][0] for r in res} == {res[0][balance][0]}
        for r in res:
            assert r[balance][1] <= r[balance][0]              # never more micro-batches than verl
            assert all(t <= 40 for t in r[balance][2])
        assert res[0][balance][3] < res[0][balance][1]          # rank 0 alone would take fewer: the sync mattered
    cu.count(f"verl.rearrange_micro_batches (dp_group, gloo, {world} ranks)", 2 * world)
    cu.write_counts()
