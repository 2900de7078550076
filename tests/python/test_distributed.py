"""Context-parallel collectives across 2 and 4 real processes (torch.distributed, gloo): cp_all_gather
and its reduce-scatter backward, Batch.to_padded(group=...), the Ulysses all-to-all both ways, and
cp_loss. Expected values come from a dense single-process computation of the same objective."""

import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import maskpack

LENGTHS = [7, 2, 12, 5]
H = 4


def _batch():
    S = max(LENGTHS)
    mask = (torch.arange(S)[None] < torch.tensor(LENGTHS)[:, None]).long()
    ids = (torch.arange(len(LENGTHS) * S).reshape(len(LENGTHS), S) + 1) * mask
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.where(mask.bool(), ids, -100)}


def _features(ids):
    g = torch.Generator().manual_seed(5)
    table = torch.randn(1000, H, dtype=torch.float64, generator=g)
    return table[ids]


def _weights():
    g = torch.Generator().manual_seed(6)
    return torch.randn(H, H, dtype=torch.float64, generator=g), torch.randn(len(LENGTHS), max(LENGTHS), H,
                                                                            dtype=torch.float64, generator=g)


def _reference():
    """Dense: per-token model on the padded batch; objective sum_r sum(Y * G_r) with G_r = (r+1) G, and
    the mean-loss objective through cp_loss."""
    batch = _batch()
    w0, G = _weights()
    w = w0.clone().requires_grad_()
    Y = torch.tanh(_features(batch["input_ids"]) @ w) * batch["attention_mask"][..., None]
    return batch, w0, G, Y, w


def _worker(rank, world, init_file, scheme, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        batch, w0, G, _, _ = _reference()
        b = maskpack.prepare_batch(batch, padding_free=True, cp=world, cp_rank=rank, cp_scheme=scheme)
        w = w0.clone().requires_grad_()
        y = torch.tanh(_features(b.input_ids) @ w)           # this rank's tokens [T_local, H]
        padded = b.to_padded(y, group=dist.group.WORLD)      # the whole batch, [B, S, H]
        obj = (padded * G * (rank + 1)).sum()                 # each rank its own objective
        obj.backward()
        gw = w.grad.clone()
        dist.all_reduce(gw)                                   # the gradient of sum_r obj_r
        torch.save({"padded": padded.detach(), "grad": gw}, os.path.join(out_dir, f"gather{rank}.pt"))
        # cp_loss: the exact mean over the whole batch, equal on every rank
        w.grad = None
        per_token = (torch.tanh(_features(b.input_ids) @ w) ** 2).sum(-1)
        loss = maskpack.cp_loss(per_token, b.loss_weights, dist.group.WORLD)
        loss.backward()
        gl = w.grad.clone()
        dist.all_reduce(gl)
        torch.save({"loss": loss.detach(), "grad": gl}, os.path.join(out_dir, f"loss{rank}.pt"))
        # Ulysses: [T_local, heads, D] sequence-split -> [T, heads/world, D] head-split and back
        heads = 4 * world
        xloc = torch.randn(b.input_ids.shape[0], heads, 3, dtype=torch.float64,
                           generator=torch.Generator().manual_seed(100 + rank)).requires_grad_()
        hs = maskpack.ulysses_all_to_all(xloc, dist.group.WORLD, scatter_dim=1, gather_dim=0)
        back = maskpack.ulysses_all_to_all(hs, dist.group.WORLD, scatter_dim=0, gather_dim=1)
        assert torch.equal(back, xloc)
        (hs * (rank + 1)).sum().backward()
        torch.save({"x": xloc.detach(), "hs": hs.detach(), "gx": xloc.grad}, os.path.join(out_dir, f"uly{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world,scheme", [(2, "zigzag"), (4, "zigzag"), (2, "ulysses"), (4, "contiguous")])
def test_cp_collectives_across_processes(world, scheme):
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        mp.start_processes(_worker, args=(world, init, scheme, d), nprocs=world, join=True, start_method="spawn")
        batch, w0, G, Y, w = _reference()
        mask = batch["attention_mask"].bool()
        # the gather: every rank holds the whole padded batch (pads 0)
        (Y * G * sum(r + 1 for r in range(world))).sum().backward()
        for r in range(world):
            got = torch.load(os.path.join(d, f"gather{r}.pt"))
            torch.testing.assert_close(got["padded"], Y.detach(), rtol=0, atol=1e-15)
            torch.testing.assert_close(got["grad"], w.grad, rtol=1e-12, atol=1e-14)
        # cp_loss: the token-mean over the whole batch (labels shifted: every token but each sequence's last)
        w.grad = None
        per_token = (torch.tanh(_features(batch["input_ids"]) @ w) ** 2).sum(-1)
        lab = mask.clone()
        for k, n in enumerate(LENGTHS):
            lab[k, n - 1] = False
        ref = per_token[lab].mean()
        ref.backward()
        for r in range(world):  # the bundle's weights are float32 (1/n rounded once): 6e-8 relative
            got = torch.load(os.path.join(d, f"loss{r}.pt"))
            torch.testing.assert_close(got["loss"], ref.detach(), rtol=1.2e-7, atol=0)
            torch.testing.assert_close(got["grad"], w.grad, rtol=1.2e-7, atol=1e-12)
        # Ulysses: rank r holds heads [r*4, r*4+4) of every token, sequence pieces in rank order
        xs = [torch.load(os.path.join(d, f"uly{r}.pt")) for r in range(world)]
        full = torch.cat([u["x"] for u in xs], dim=0)  # [T, heads, D]
        for r, u in enumerate(xs):
            assert torch.equal(u["hs"], full[:, 4 * r:4 * r + 4])
            # d/dx of sum_r' (r'+1) * sum(hs_r'): head block h of every token belongs to rank h // 4
            want = torch.cat([torch.full((u["x"].shape[0], 4, 3), float(q + 1), dtype=torch.float64)
                              for q in range(world)], dim=1)
            assert torch.equal(u["gx"], want)


def test_collectives_need_an_initialised_group():
    lay = maskpack.Layout.from_lengths([4, 4], placement="packed")
    with pytest.raises(maskpack.Error) as e:
        maskpack.cp_all_gather(torch.zeros(4, 2), lay)
    assert e.value.argument == "group"
    with pytest.raises(TypeError):
        maskpack.cp_all_gather(np.zeros((4, 2)), lay)
