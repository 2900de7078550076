"""Context-parallel collectives across 2 and 4 real processes (torch.distributed, gloo): cp_all_gather
and its reduce-scatter backward, Batch.to_padded(group=...), the Ulysses all-to-all both ways, and
cp_loss. Expected values come from a dense single-process computation of the same objective."""

import os
import tempfile
import time

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
        dist.barrier()  # nobody tears the group down while a peer still talks to it (gloo aborts then)
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


# ---- Gated DeltaNet and conv1d across ranks (head-parallel) ------------------------------------------

GDN_LENGTHS = [37, 5, 70, 16]  # sequences split across ranks at every cp (zigzag halves of each)


def _gdn_inputs(H=4, HV=8, K=16, V=8, C=8):
    g0 = torch.Generator().manual_seed(11)
    T = sum(GDN_LENGTHS)
    q, k = (torch.randn(T, H, K, generator=g0) for _ in range(2))
    v = torch.randn(T, HV, V, generator=g0)
    g = -torch.nn.functional.softplus(torch.randn(T, HV, generator=g0)) * 0.3
    beta = torch.sigmoid(torch.randn(T, HV, generator=g0))
    h0 = torch.randn(len(GDN_LENGTHS), HV, K, V, generator=g0) * 0.1
    x = torch.randn(T, C, generator=g0)
    w = torch.randn(C, 4, generator=g0) * 0.5
    do = torch.randn(T, HV, V, generator=g0)
    dy = torch.randn(T, C, generator=g0)
    return [q, k, v, g, beta, h0, x, w], do, dy


MANY_LENGTHS = [3 + (7 * i) % 11 for i in range(80)]


def _many_inputs():
    g0 = torch.Generator().manual_seed(12)
    T = sum(MANY_LENGTHS)
    q, k = (torch.randn(T, 4, 16, generator=g0) for _ in range(2))
    v = torch.randn(T, 8, 8, generator=g0)
    g = -torch.nn.functional.softplus(torch.randn(T, 8, generator=g0)) * 0.3
    return q, k, v, g, torch.sigmoid(torch.randn(T, 8, generator=g0))


def _gdn_layer():
    torch.manual_seed(21)
    return maskpack.GatedDeltaNet(32, 4, 8, 8, 8, projections="qwen3_next")


def _hf_layer():
    """transformers' own Qwen3-Next GDN layer (heads divide by 2 and 4), seeded."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    cfg = Qwen3NextConfig(hidden_size=32, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=8,
                          linear_value_head_dim=8, linear_conv_kernel_dim=4, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=32,
                          vocab_size=32, rms_norm_eps=1e-6, layer_types=["linear_attention"])
    torch.manual_seed(22)
    layer = Qwen3NextGatedDeltaNet(cfg, layer_idx=0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape) * 0.2)
        layer.norm.weight.add_(1.0)
    return layer


def _layer_input(seed=6):
    return torch.randn(sum(GDN_LENGTHS), 32, generator=torch.Generator().manual_seed(seed))


def _gdn_objective(o, ht, y, st, do, dy):
    return (o * do).sum() + ht.square().sum() + (y * dy).sum() + st.sum()


def _gdn_worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        lay = maskpack.Layout.from_lengths(GDN_LENGTHS, placement="packed")
        xs, do, dy = _gdn_inputs()
        q, k, v, g, beta, h0, x, w = xs
        cut = lambda t: lay.shard(t, world, rank)  # noqa: E731  this rank's zigzag shard
        leaves = [cut(t).clone().requires_grad_() for t in (q, k, v, g, beta)]
        h0l, xl, wl = h0.clone().requires_grad_(), cut(x).clone().requires_grad_(), w.clone().requires_grad_()
        o, ht = maskpack.gated_delta_rule(*leaves, lay, initial_state=h0l, group=dist.group.WORLD)
        y, st = maskpack.causal_conv1d(xl, wl, lay, group=dist.group.WORLD)
        # each rank's share of the single-process objective: its tokens' terms, and the replicated
        # states' terms on every rank alike (their gradient reaches each rank's own heads)
        share = (o * cut(do)).sum() + (y * cut(dy)).sum() + ht.square().sum() + st.sum()
        share.backward()
        grads = [t.grad for t in leaves] + [xl.grad]
        gh0, gw = h0l.grad.clone(), wl.grad.clone()
        dist.all_reduce(gh0)  # parameters and replicated inputs: the CP group sums (as Megatron does)
        dist.all_reduce(gw)
        torch.save({"o": o.detach(), "ht": ht.detach(), "y": y.detach(), "st": st.detach(), "grads": grads,
                    "gh0": gh0, "gw": gw}, os.path.join(out_dir, f"gdn{rank}.pt"))
        # without autograd: every rank writes its tokens straight into the head group owners' shared
        # memory (one write per byte); on a group kept on gloo: the general exchange. Both bitwise.
        nog = {}
        plain = dist.new_group(list(range(world)))  # first used with the path off: kept on gloo
        many = maskpack.Layout.from_lengths(MANY_LENGTHS, placement="packed")  # > 64 runs per rank: index_copy_
        gaps = lay.pad_to_multiple(8)  # rows of the whole that no rank holds
        for name, grp, lay_, ins in (("shm", dist.group.WORLD, lay, (q, k, v, g, beta)),
                                     ("gloo", plain, lay, (q, k, v, g, beta)),
                                     ("many", dist.group.WORLD, many, _many_inputs()),
                                     ("gaps", dist.group.WORLD, gaps,
                                      [maskpack.relayout(t, lay, gaps) for t in (q, k, v, g, beta)])):
            if grp is plain:
                os.environ["MASKPACK_CP_SHM"] = "0"
            with torch.no_grad():
                nog[name] = maskpack.gated_delta_rule(*(lay_.shard(t, world, rank) for t in ins), lay_,
                                                      initial_state=h0 if lay_ is lay else None, group=grp)
            os.environ.pop("MASKPACK_CP_SHM", None)
            from maskpack import _shm
            nog[name + " shm"] = _shm.in_use(grp)
            if name == "many":  # what the last call left in this rank's segment: NaN (no peer writes now)
                _shm.segments(grp, rank, world, 1)[rank].view(torch.float32).fill_(float("nan"))
                dist.barrier()
        torch.save(nog, os.path.join(out_dir, f"nograd{rank}.pt"))
        # the whole Qwen3-Next layer with group=: this rank's hidden states in, this rank's out back
        layer = _gdn_layer()
        hid = _layer_input()
        hl = cut(hid).clone().requires_grad_()
        out = layer(hl, lay, group=dist.group.WORLD)
        (out * cut(_layer_input(7))).sum().backward()
        pgrads = [p.grad.clone() for p in layer.parameters()]
        for gp in pgrads:
            dist.all_reduce(gp)
        torch.save({"out": out.detach(), "dh": hl.grad, "pgrads": pgrads}, os.path.join(out_dir, f"layer{rank}.pt"))
        # transformers' own layer, patched with group=: the whole batch through the call's kwargs
        hf_layer = _hf_layer()
        assert maskpack.patch_linear_attention(hf_layer, group=dist.group.WORLD) == 1
        hh = cut(_layer_input(8)).clone().requires_grad_()
        hf_out = hf_layer(hh[None], maskpack_layout=lay)
        (hf_out[0] * cut(_layer_input(9))).sum().backward()
        cu = torch.as_tensor(lay.cu_seqlens())  # the whole batch's offsets, as ring-attention trainers pass them
        with torch.no_grad():
            hf_out_cu = hf_layer(hh[None].detach(), cu_seq_lens_q=cu)
        errs_hf = None
        try:
            hf_layer(hh[None].detach())  # neither the layout nor the offsets: refused
        except maskpack.Error as e:
            errs_hf = (e.argument, str(e))
        torch.save({"out": hf_out.detach(), "out_cu": hf_out_cu, "dh": hh.grad, "err": errs_hf},
                   os.path.join(out_dir, f"hf{rank}.pt"))
        errs = {}
        # heads that do not divide: an error naming both numbers, on every rank alike
        try:
            lq = cut(q)
            maskpack.gated_delta_rule(lq, lq, cut(v)[:, :3], cut(g)[:, :3], cut(beta)[:, :3], lay, group=dist.group.WORLD,
                                      cp_method="head")
        except maskpack.Error as e:
            errs["heads"] = (str(e), e.argument)
        # only rank 0 passes a shard of the wrong length: it raises its own error, every other rank
        # one naming rank 0, and nobody waits in a collective
        try:
            bad = [cut(t)[:-1] if rank == 0 else cut(t) for t in (q, k, v, g, beta)]
            maskpack.gated_delta_rule(*bad, lay, group=dist.group.WORLD)
        except maskpack.Error as e:
            errs["shard"] = (str(e), e.argument)
        # autograd records on rank 0 only: the ranks would take different exchanges; every rank raises
        try:
            maskpack.gated_delta_rule(*(cut(t).clone().requires_grad_(rank == 0) for t in (q, k, v, g, beta)), lay,
                                      group=dist.group.WORLD)
        except maskpack.Error as e:
            errs["records"] = (str(e), e.argument)
        # a device tensor for maskpack's CPU kernels (gloo would move it; the kernel cannot read it)
        try:
            maskpack.gated_delta_rule(cut(q), cut(k).to("meta"), cut(v), cut(g), cut(beta), lay, group=dist.group.WORLD,
                                      cp_method="head")
        except maskpack.Error as e:
            errs["kernel"] = (str(e), e.argument)
        # another rank holds another batch: every rank raises
        other = maskpack.Layout.from_lengths(GDN_LENGTHS[:-1] + [GDN_LENGTHS[-1] + (rank == world - 1) * 4],
                                             placement="packed")
        try:
            maskpack.cp_all_gather(other.shard(torch.zeros(other.n_tokens, 2), world, rank), other, dist.group.WORLD)
        except maskpack.Error as e:
            errs["layout"] = (str(e), e.argument)
        torch.save(errs, os.path.join(out_dir, f"err{rank}.pt"))
        dist.barrier()  # nobody tears the group down while a peer still talks to it
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_gdn_and_conv_head_parallel_equal_the_single_process_run(world):
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        mp.start_processes(_gdn_worker, args=(world, init, d), nprocs=world, join=True, start_method="spawn")
        torch.set_num_threads(1)
        lay = maskpack.Layout.from_lengths(GDN_LENGTHS, placement="packed")
        xs, do, dy = _gdn_inputs()
        leaves = [t.clone().requires_grad_() for t in xs]
        q, k, v, g, beta, h0, x, w = leaves
        o, ht = maskpack.gated_delta_rule(q, k, v, g, beta, lay, initial_state=h0)
        y, st = maskpack.causal_conv1d(x, w, lay)
        _gdn_objective(o, ht, y, st, do, dy).backward()
        cut = lambda t, r: lay.shard(t, world, r)  # noqa: E731
        for r in range(world):
            got = torch.load(os.path.join(d, f"gdn{r}.pt"))
            # the kernel ran unchanged on whole sequences: bitwise
            assert torch.equal(got["o"], cut(o.detach(), r)) and torch.equal(got["ht"], ht.detach())
            assert torch.equal(got["y"], cut(y.detach(), r)) and torch.equal(got["st"], st.detach())
            for gr, leaf in zip(got["grads"], [q, k, v, g, beta, x]):
                torch.testing.assert_close(gr, cut(leaf.grad, r), rtol=0, atol=0)
            # summed over ranks: the same values, added in another order
            torch.testing.assert_close(got["gh0"], h0.grad, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(got["gw"], w.grad, rtol=1e-6, atol=1e-6)
            nog = torch.load(os.path.join(d, f"nograd{r}.pt"))
            assert nog["shm shm"] is True and nog["gloo shm"] is False and nog["many shm"] is True
            for name in ("shm", "gloo"):  # either exchange, the same kernel on the same inputs: bitwise
                assert torch.equal(nog[name][0], cut(o.detach(), r)) and torch.equal(nog[name][1], ht.detach())
            many = maskpack.Layout.from_lengths(MANY_LENGTHS, placement="packed")
            with torch.no_grad():
                o_m, ht_m = maskpack.gated_delta_rule(*_many_inputs(), many)
            assert torch.equal(nog["many"][0], many.shard(o_m, world, r)) and torch.equal(nog["many"][1], ht_m)
            gaps = lay.pad_to_multiple(8)
            with torch.no_grad():
                o_g, ht_g = maskpack.gated_delta_rule(*(maskpack.relayout(t.detach(), lay, gaps) for t in leaves[:5]),
                                                      gaps)
            assert torch.equal(nog["gaps"][0], gaps.shard(o_g, world, r)) and torch.equal(nog["gaps"][1], ht_g)
        # the layer: its projections are GEMMs over this rank's rows only, so equal within rounding
        layer = _gdn_layer()
        hid = _layer_input().requires_grad_()
        out = layer(hid, lay)
        (out * _layer_input(7)).sum().backward()
        for r in range(world):
            got = torch.load(os.path.join(d, f"layer{r}.pt"))
            torch.testing.assert_close(got["out"], cut(out.detach(), r), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got["dh"], cut(hid.grad, r), rtol=1e-5, atol=1e-6)
            for gp, p in zip(got["pgrads"], layer.parameters()):
                torch.testing.assert_close(gp, p.grad, rtol=1e-4, atol=1e-5)
        hf_layer = _hf_layer()
        assert maskpack.patch_linear_attention(hf_layer) == 1
        hh = _layer_input(8).requires_grad_()
        ref = hf_layer(hh[None], cu_seq_lens_q=torch.as_tensor(lay.cu_seqlens()))[0]
        (ref * _layer_input(9)).sum().backward()
        for r in range(world):
            got = torch.load(os.path.join(d, f"hf{r}.pt"))
            torch.testing.assert_close(got["out"][0], cut(ref.detach(), r), rtol=1e-5, atol=1e-6)
            assert torch.equal(got["out_cu"], got["out"])
            torch.testing.assert_close(got["dh"], cut(hh.grad, r), rtol=1e-5, atol=1e-6)
            assert got["err"][0] == "group" and "maskpack_layout=" in got["err"][1]
        for r in range(world):
            errs = torch.load(os.path.join(d, f"err{r}.pt"))
            msg, arg = errs["heads"]
            assert arg == "v" and f"3 heads do not divide by the {world} ranks" in msg
            msg, arg = errs["records"]
            assert arg == "group" and "rank 1 disagrees with rank 0 about the autograd recording" in msg, msg
            msg, arg = errs["kernel"]
            assert arg == "k" and "kernels run on the CPU, this tensor is on meta" in msg, msg
            msg, arg = errs["shard"]
            if r == 0:
                assert arg == "q" and "expected this rank's shard (rank 0" in msg
            else:
                assert arg == "group" and "rank 0 refused its arguments" in msg
            msg, arg = errs["layout"]  # each rank's part fits its own layout; the fingerprints do not agree
            assert arg == "layout" and f"rank {world - 1} disagrees with rank 0 about the layout" in msg, msg


# ---- attention across ranks (K/V all-gathered) -------------------------------------------------------


def _attn_cases():
    """(layout, rule kwargs of attention): packed causal documents with GQA, a sliding window with a
    softcap, and a padded batch."""
    packed = maskpack.Layout.from_lengths(GDN_LENGTHS, placement="packed")
    windowed = maskpack.Layout.from_lengths(GDN_LENGTHS, placement="packed", window=(9, 0))
    padded = maskpack.Layout.from_lengths(GDN_LENGTHS, placement="right")
    return [(packed, {}), (windowed, {"softcap": 5.0}), (padded, {})]


def _attn_tensors(lay, seed):
    g0 = torch.Generator().manual_seed(seed)
    lead = (lay.n_rows, lay.q_width) if not lay.packed else (lay.n_rows * lay.q_width,)
    q = torch.randn(*lead, 4, 16, generator=g0)
    k, v = (torch.randn(*lead, 2, 16, generator=g0) for _ in range(2))  # GQA: 4 query heads over 2
    do = torch.randn(*lead, 4, 16, generator=g0)
    return q, k, v, do


def _attn_worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        res = []
        for i, (lay, kw) in enumerate(_attn_cases()):
            q, k, v, do = _attn_tensors(lay, 30 + i)
            per = {}
            for algo in ("all_gather", "ring", "auto"):
                leaves = [lay.shard(x, world, rank).clone().requires_grad_() for x in (q, k, v)]
                o, lse = maskpack.attention(*leaves, lay, group=dist.group.WORLD, threads=1, cp_algorithm=algo, **kw)
                lse_grad = lse.requires_grad
                (o * lay.shard(do, world, rank)).sum().backward()
                with torch.no_grad():  # the call autograd does not record (the all-gather's plain kernel call)
                    o_ng, lse_ng = maskpack.attention(*(x.detach() for x in leaves), lay, group=dist.group.WORLD,
                                                      threads=1, cp_algorithm=algo, **kw)
                per[algo] = {"o": o.detach(), "lse": lse, "lse_grad": lse_grad, "grads": [x.grad for x in leaves],
                             "o_ng": o_ng, "lse_ng": lse_ng}
            res.append(per)
        torch.save(res, os.path.join(out_dir, f"attn{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _lse_rows(lay, lse, world, rank):
    """The rows of the whole batch's lse ([Hq, T] packed, [B, Hq, S] padded) that rank's shard holds, in
    its token order: the shard of lse with the heads moved behind the tokens, moved back. The shard's
    pad slots (a sequence cut into 2 cp equal pieces) are query rows that see no key: lse -inf."""
    return lay.shard(lse.movedim(-2, -1).contiguous(), world, rank, pad_value=float("-inf")).movedim(-1, -2)


@pytest.mark.parametrize("world", [2, 4])
def test_attention_across_ranks_equals_the_single_process_run(world):
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        mp.start_processes(_attn_worker, args=(world, init, d), nprocs=world, join=True, start_method="spawn")
        torch.set_num_threads(1)
        got = [torch.load(os.path.join(d, f"attn{r}.pt")) for r in range(world)]
        for i, (lay, kw) in enumerate(_attn_cases()):
            q, k, v, do = _attn_tensors(lay, 30 + i)
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            o, lse = maskpack.attention(*leaves, lay, threads=1, **kw)
            (o * do).sum().backward()
            for r in range(world):
                ag, ring = got[r][i]["all_gather"], got[r][i]["ring"]
                # (out, lse) from either algorithm: lse float32, this rank's rows of the whole lse in its
                # token order, not differentiable; without autograd recording the same values
                mine = _lse_rows(lay, lse, world, r)
                for algo in ("all_gather", "ring", "auto"):
                    res = got[r][i][algo]
                    assert res["lse"].dtype == torch.float32 and res["lse"].shape == mine.shape, (i, r, algo)
                    assert res["lse_grad"] is False and not res["lse_ng"].requires_grad, (i, r, algo)
                    assert torch.equal(res["o_ng"], res["o"]) and torch.equal(res["lse_ng"], res["lse"]), (i, r, algo)
                assert torch.equal(ag["lse"], mine), (i, r)  # the same kernel call: bitwise
                torch.testing.assert_close(ring["lse"], mine, rtol=1e-5, atol=1e-5)
                assert torch.equal(got[r][i]["auto"]["lse"], ring["lse"]), (i, r)
                # all-gather: the same kernel over the same keys at the same positions: the output bitwise
                assert torch.equal(ag["o"], lay.shard(o.detach(), world, r)), (i, r)
                # dq bitwise; dk, dv summed over the ranks' contributions: within float32 rounding
                assert torch.equal(ag["grads"][0], lay.shard(leaves[0].grad, world, r)), (i, r)
                for gr, leaf in zip(ag["grads"][1:], leaves[1:]):
                    torch.testing.assert_close(gr, lay.shard(leaf.grad, world, r), rtol=1e-5, atol=1e-6)
                # the ring: partial outputs merged by log-sum-exp, gradients summed over steps and ranks
                torch.testing.assert_close(ring["o"], lay.shard(o.detach(), world, r), rtol=1e-5, atol=1e-6)
                for gr, leaf in zip(ring["grads"], leaves):
                    torch.testing.assert_close(gr, lay.shard(leaf.grad, world, r), rtol=1e-4, atol=1e-5)
                # CPU float32 with a windowed or causal rule: "auto" is the ring
                assert torch.equal(got[r][i]["auto"]["o"], ring["o"]), (i, r)


SP_LENGTHS = [37, 5, 64, 20, 3]  # at 4 ranks the 3- and 5-token sequences leave pieces shorter than the conv


def _sp_inputs(H=3, HV=6, K=8, V=4, C=6):
    """Heads that divide by neither 2 nor 4 (so "auto" takes the sequence-parallel way), an initial
    state, a conv of width 4 with a prefix."""
    g0 = torch.Generator().manual_seed(5)
    T = sum(SP_LENGTHS)
    q, k = (torch.randn(T, H, K, generator=g0) for _ in range(2))
    v = torch.randn(T, HV, V, generator=g0)
    g = -torch.nn.functional.softplus(torch.randn(T, HV, generator=g0)) * 0.3
    beta = torch.sigmoid(torch.randn(T, HV, generator=g0))
    h0 = torch.randn(len(SP_LENGTHS), HV, K, V, generator=g0) * 0.1
    x = torch.randn(T, C, generator=g0)
    w = torch.randn(C, 4, generator=g0) * 0.5
    pre = torch.randn(len(SP_LENGTHS), C, 3, generator=g0)
    do, dy = torch.randn(T, HV, V, generator=g0), torch.randn(T, C, generator=g0)
    return [q, k, v, g, beta, h0, x, w, pre], do, dy


def _sp_hidden(seed):
    return torch.randn(sum(SP_LENGTHS), 32, generator=torch.Generator().manual_seed(seed))


def _summed(t):
    """A replicated input's gradient summed over the group (zeros where this rank never used it)."""
    g = t.grad.clone() if t.grad is not None else torch.zeros_like(t)
    dist.all_reduce(g)
    return g


def _sp_worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        lay = maskpack.Layout.from_lengths(SP_LENGTHS, placement="packed")
        xs, do, dy = _sp_inputs()
        cut = lambda t: lay.shard(t, world, rank)  # noqa: E731
        leaves = [cut(t).clone().requires_grad_() for t in xs[:5]]
        h0, w, pre = (xs[i].clone().requires_grad_() for i in (5, 7, 8))
        xl = cut(xs[6]).clone().requires_grad_()
        o, ht = maskpack.gated_delta_rule(*leaves, lay, initial_state=h0, group=dist.group.WORLD)  # auto
        y, st = maskpack.causal_conv1d(xl, w, lay, prefix=pre, group=dist.group.WORLD, cp_method="sequence")
        ((o * cut(do)).sum() + ht.square().sum() + (y * cut(dy)).sum() + st.sum()).backward()
        res = {"o": o.detach(), "ht": ht.detach(), "y": y.detach(), "st": st.detach(),
               "grads": [t.grad for t in leaves] + [xl.grad], "gh0": _summed(h0), "gw": _summed(w),
               "gpre": _summed(pre)}
        # the whole layer, sequence-parallel although its heads divide
        layer = _gdn_layer()
        hl = cut(_sp_hidden(6)).clone().requires_grad_()
        out = layer(hl, lay, group=dist.group.WORLD, cp_method="sequence")
        (out * cut(_sp_hidden(7))).sum().backward()
        res["layer"] = (out.detach(), hl.grad, [_summed(p) for p in layer.parameters()])
        errs = {}
        try:
            maskpack.gated_delta_rule(*[cut(t) for t in xs[:5]], lay, group=dist.group.WORLD, cp_method="ring")
        except maskpack.Error as e:
            errs["method"] = (e.argument, str(e))
        padded = maskpack.Layout.from_lengths(SP_LENGTHS, placement="right")
        try:
            maskpack.gated_delta_rule(*[cut(t) for t in xs[:5]], padded, group=dist.group.WORLD, cp_method="sequence")
        except maskpack.Error as e:
            errs["padded"] = (getattr(e, "argument", None), str(e))
        try:  # a tensor the group's backend cannot move (gloo moves CPU and CUDA tensors): named, on every rank
            maskpack.cp_all_gather(torch.empty(cut(xs[6]).shape, device="meta"), lay, dist.group.WORLD)
        except maskpack.Error as e:
            errs["device"] = (e.argument, str(e))
        for how in ("sequence",):  # maskpack's own kernels read host memory: refused by name
            try:
                maskpack.gated_delta_rule(*[cut(t) for t in xs[:2]], cut(xs[2]).to("meta"), *[cut(t) for t in xs[3:5]],
                                          lay, group=dist.group.WORLD, cp_method=how)
            except maskpack.Error as e:
                errs["kernel " + how] = (e.argument, str(e), e.status)
        res["errs"] = errs
        torch.save(res, os.path.join(out_dir, f"sp{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_gdn_and_conv_sequence_parallel_equal_the_single_process_run(world):
    """The sequence-parallel way: every output and gradient equals the single-process run on the whole
    batch (GDN within the rounding of composing the state transitions, the conv bitwise), with an
    initial state, a conv prefix and pieces shorter than the conv."""
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        mp.start_processes(_sp_worker, args=(world, init, d), nprocs=world, join=True, start_method="spawn")
        torch.set_num_threads(1)
        lay = maskpack.Layout.from_lengths(SP_LENGTHS, placement="packed")
        xs, do, dy = _sp_inputs()
        leaves = [t.clone().requires_grad_() for t in xs]
        q, k, v, g, beta, h0, x, w, pre = leaves
        o, ht = maskpack.gated_delta_rule(q, k, v, g, beta, lay, initial_state=h0)
        y, st = maskpack.causal_conv1d(x, w, lay, prefix=pre)
        ((o * do).sum() + ht.square().sum() + (y * dy).sum() + st.sum()).backward()
        layer = _gdn_layer()
        hid = _sp_hidden(6).requires_grad_()
        out = layer(hid, lay)
        (out * _sp_hidden(7)).sum().backward()
        close = dict(rtol=1e-4, atol=1e-5)
        for r in range(world):
            got = torch.load(os.path.join(d, f"sp{r}.pt"))
            cut = lambda t: lay.shard(t, world, r)  # noqa: E731
            torch.testing.assert_close(got["o"], cut(o.detach()), **close)
            torch.testing.assert_close(got["ht"], ht.detach(), **close)
            assert torch.equal(got["y"], cut(y.detach())) and torch.equal(got["st"], st.detach())
            for gr, leaf in zip(got["grads"], [q, k, v, g, beta, x]):
                torch.testing.assert_close(gr, cut(leaf.grad), **close)
            for name, leaf in (("gh0", h0), ("gw", w), ("gpre", pre)):
                torch.testing.assert_close(got[name], leaf.grad, **close)
            lo, ldh, lgrads = got["layer"]
            torch.testing.assert_close(lo, cut(out.detach()), **close)
            torch.testing.assert_close(ldh, cut(hid.grad), **close)
            for gp, p in zip(lgrads, layer.parameters()):
                torch.testing.assert_close(gp, p.grad, rtol=1e-3, atol=1e-4)
            arg, msg = got["errs"]["method"]
            assert arg == "cp_method" and "expected one of auto, head, sequence" in msg
            arg, msg = got["errs"]["padded"]
            assert arg == "layout" and "takes a packed (THD) layout" in msg
            arg, msg = got["errs"]["device"]
            assert arg == "part" and "gloo backend moves cpu and cuda tensors, this one is on meta" in msg, msg
            for how in ("sequence",):
                arg, msg, code = got["errs"]["kernel " + how]
                assert arg == "v" and "kernels run on the CPU, this tensor is on meta" in msg, msg
                assert code == "MASKPACK_ERR_UNSUPPORTED"


def _shm_worker(rank, world, init_file, out_dir):
    from maskpack import _shm

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        res = {}
        for size in (4, 64, 1024):  # the segments grow with the blocks
            x = torch.arange(size * world * 6, dtype=torch.float32).reshape(size * world, 2, 3) + 1000 * rank
            res[size] = maskpack.ulysses_all_to_all(x.repeat(1, world, 1), dist.group.WORLD, 1, 0)
        res["shm"] = _shm.in_use(dist.group.WORLD)
        os.environ["MASKPACK_CP_SHM"] = "0"  # a group first used with the path off keeps gloo's own exchange
        plain = dist.new_group(list(range(world)))
        x = torch.arange(1024 * world * 6, dtype=torch.float32).reshape(1024 * world, 2, 3).repeat(1, world, 1)
        res["plain"] = maskpack.ulysses_all_to_all(x + 1000 * rank, plain, 1, 0)
        res["plain_shm"] = _shm.in_use(plain)
        torch.save(res, os.path.join(out_dir, f"shm{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_all_to_all_through_shared_memory_equals_the_group_exchange(world):
    """On one host the CPU all-to-all runs through shared memory; its result equals the exchange the
    group does itself (the expected blocks are written out here), segments grow with the blocks, and
    MASKPACK_CP_SHM=0 keeps a group on gloo."""
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        mp.start_processes(_shm_worker, args=(world, init, d), nprocs=world, join=True, start_method="spawn")
        got = [torch.load(os.path.join(d, f"shm{r}.pt")) for r in range(world)]
        for r in range(world):
            assert got[r]["shm"] is True and got[r]["plain_shm"] is False
            for size in (4, 64, 1024):
                xs = [(torch.arange(size * world * 6, dtype=torch.float32).reshape(size * world, 2, 3) + 1000 * s)
                      .repeat(1, world, 1) for s in range(world)]
                # rank r receives head group r (of `world` groups of 2 heads) of every rank, in rank order
                want = torch.cat([x[:, 2 * r:2 * r + 2] for x in xs], dim=0)
                assert torch.equal(got[r][size], want), (r, size)
            xs = [(torch.arange(1024 * world * 6, dtype=torch.float32).reshape(1024 * world, 2, 3).repeat(1, world, 1)
                   + 1000 * s) for s in range(world)]
            assert torch.equal(got[r]["plain"], torch.cat([x[:, 2 * r:2 * r + 2] for x in xs], dim=0))


def _deserter_worker(rank, world, init_file, out_dir):
    import datetime

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=5))
    dist.barrier()  # both ranks are connected: an exit during rank 0's set-up would fail its init instead
    if rank == 1:
        os._exit(0)  # dies without a word: never makes the call, never tears the group down
    lay = maskpack.Layout.from_lengths([8, 4], placement="packed")
    t0 = time.monotonic()
    try:
        maskpack.cp_all_gather(lay.shard(torch.zeros(12, 2), world, rank), lay, dist.group.WORLD)
        result = ("returned", "")
    except maskpack.Error as e:
        result = (e.status, str(e))
    except Exception as e:  # recorded, so the test says what came instead
        result = (type(e).__name__, str(e))
    torch.save({"result": result, "seconds": time.monotonic() - t0}, os.path.join(out_dir, "deserter.pt"))
    os._exit(0)


def _ring_deserter_worker(rank, world, init_file, out_dir):
    import datetime

    from maskpack import distributed as mpd

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=5))
    if rank == 1:  # agrees to the call, then dies before the ring's first exchange
        mpd._RingAttention.apply = staticmethod(lambda *a: os._exit(0))
    lay = maskpack.Layout.from_lengths([64, 32], placement="packed")
    q = lay.shard(torch.randn(96, 2, 8), world, rank)
    t0 = time.monotonic()
    try:
        maskpack.attention(q, q, q, lay, group=dist.group.WORLD, cp_algorithm="ring")
        result = ("returned", "")
    except maskpack.Error as e:
        result = (e.status, str(e))
    except Exception as e:  # recorded, so the test says what came instead
        result = (type(e).__name__, str(e))
    torch.save({"result": result, "seconds": time.monotonic() - t0}, os.path.join(out_dir, "ring_deserter.pt"))
    os._exit(0)


def test_a_rank_that_dies_inside_the_ring_makes_the_others_fail_not_hang():
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        ctx = mp.start_processes(_ring_deserter_worker, args=(2, init, d), nprocs=2, join=False, start_method="spawn")
        deadline = time.monotonic() + 120
        while not ctx.join(timeout=5) and time.monotonic() < deadline:
            pass
        got = torch.load(os.path.join(d, "ring_deserter.pt"))
        status, msg = got["result"]
        assert status == "MASKPACK_ERR_COMM" and "ring attention's exchange failed on rank 0" in msg, got
        assert got["seconds"] < 60


def test_a_rank_that_dies_makes_the_others_fail_not_hang():
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        ctx = mp.start_processes(_deserter_worker, args=(2, init, d), nprocs=2, join=False, start_method="spawn")
        deadline = time.monotonic() + 120
        while not ctx.join(timeout=5) and time.monotonic() < deadline:  # join returns as each process ends
            pass
        got = torch.load(os.path.join(d, "deserter.pt"))
        status, msg = got["result"]
        assert status == "MASKPACK_ERR_COMM" and "agreement exchange failed on rank 0" in msg
        assert got["seconds"] < 60  # the group's timeout, not forever


def test_cp_device_check_script_runs_on_the_cpu():
    """tools/device/check_cp_cuda.py (run where a GPU is lent) runs the same collectives over gloo on the
    CPU with --device cpu: it must pass here, so the prepared script is known to work."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, os.path.join(root, "tools", "device", "check_cp_cuda.py"), "--device", "cpu"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all checks passed" in r.stdout and "DIFFERENT" not in r.stdout
    assert r.stdout.count(" equal") == 2 * (6 + 2 + 1)  # every row of both ranks was compared


def _refusal_worker(rank, world, init_file, out_dir):
    """A refused CP call leaves nothing holding the group: once destroyed, it is freed at once (a
    reference cycle through the refused argument's exception kept it alive to interpreter exit,
    where gloo aborted the process)."""
    import gc
    import weakref

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    gc.disable()  # only reference counts free the group below
    try:
        grp = dist.new_group(list(range(world)))
        lay = maskpack.Layout.from_lengths([8, 4], placement="packed")
        q = lay.shard(torch.randn(12, 2, 8), world, rank)
        names = []
        for call in (lambda: maskpack.attention(q.to("meta"), q, q, lay, group=grp),
                     lambda: maskpack.cp_all_gather(q[:-1] if rank == 0 else q, lay, grp),
                     lambda: maskpack.gated_delta_rule(q, q, q, q[..., 0], q[..., 0], lay, group=grp, cp_method="ring")):
            try:
                call()
                names.append(None)
            except maskpack.Error as e:
                names.append(e.argument)
        ref = weakref.ref(grp)
        dist.destroy_process_group(grp)
        del grp
        alive = ref() is not None
        torch.save({"names": names, "alive": alive}, os.path.join(out_dir, f"refusal{rank}.pt"))
        dist.barrier()
    finally:
        gc.enable()
        dist.destroy_process_group()


def test_a_refused_call_leaves_nothing_holding_the_group():
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_refusal_worker, args=(2, os.path.join(d, "init"), d), nprocs=2, join=True,
                           start_method="spawn")
        for r in range(2):
            got = torch.load(os.path.join(d, f"refusal{r}.pt"))
            assert got["names"][0] == "q" and got["names"][2] == "cp_method", got["names"]
            assert got["names"][1] == ("part" if r == 0 else "group"), got["names"]
            assert not got["alive"], "the process group outlived destroy_process_group (held by a refused call)"
