"""torch.autograd.gradcheck of every differentiable context-parallel call, across 2 real processes (gloo).

The C algorithms behind the ring attention and the sequence-parallel Gated DeltaNet and conv compute
in float32, so a float64 gradcheck cannot reach them; the other tests compare their gradients with
the single-process ones, which are gradchecked. Here gradcheck itself runs on them in float32, with a
step and tolerances float32 rounding allows, on small inputs; the collectives (cp_all_gather, the
Ulysses all-to-all, cp_loss), which move any dtype, in float64 with gradcheck's own tolerances.

The function every rank checks is the whole-batch one: replicated whole inputs -> this rank's shards
(their gradients all-reduced over the group, so each rank's analytical gradient is the whole one) ->
the CP call -> cp_all_gather back to the whole output (its gradient scaled by 1/cp: every rank
backpropagates the same output gradient, and the gather's reduce-scatter sums them). Every rank
perturbs the same element at the same moment, so the collectives of the numerical and the analytical
passes pair up across the ranks; replicated outputs (final states) are used alike on every rank, as
their contract asks.
"""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import maskpack

LENGTHS = [7, 3, 10]


class _SumGrad(torch.autograd.Function):
    """Identity; the gradient is summed over the group (a replicated input each rank uses in part)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ScaleGrad(torch.autograd.Function):
    """Identity; the gradient scaled."""

    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.s, None


def _cases(world):
    """name -> (function of the whole inputs, the whole inputs, whether every Jacobian entry is
    checked). Each function runs the CP call on this rank's shards and returns whole outputs."""
    group = dist.group.WORLD
    rank = dist.get_rank()
    packed = maskpack.Layout.from_lengths(LENGTHS, placement="packed")
    windowed = maskpack.Layout.from_lengths(LENGTHS, placement="packed", window=(4, 0))
    padded = maskpack.Layout.from_lengths(LENGTHS, placement="right")
    g0 = torch.Generator().manual_seed(40)
    T = sum(LENGTHS)

    def rnd(*shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, generator=g0, dtype=dtype) * scale).requires_grad_()

    def mine(x, lay, scheme="zigzag"):
        return lay.shard(_SumGrad.apply(x, group), world, rank, scheme=scheme)

    def whole(part, lay, scheme="zigzag"):
        return maskpack.cp_all_gather(_ScaleGrad.apply(part, 1.0 / world), lay, group, scheme=scheme)

    def attention(lay, algo, **kw):
        def f(q, k, v):
            o, _ = maskpack.attention(mine(q, lay), mine(k, lay), mine(v, lay), lay, group=group, cp_algorithm=algo,
                                      threads=1, **kw)
            return whole(o, lay)
        return f

    def gdn(method):
        def f(q, k, v, g, beta, h0):
            o, ht = maskpack.gated_delta_rule(mine(q, packed), mine(k, packed), mine(v, packed), mine(g, packed),
                                              mine(beta, packed), packed, initial_state=_SumGrad.apply(h0, group),
                                              group=group, cp_method=method, threads=1)
            return whole(o, packed), ht
        return f

    def conv(method):
        def f(x, w, prefix):
            y, st = maskpack.causal_conv1d(mine(x, packed), _SumGrad.apply(w, group), packed,
                                           prefix=_SumGrad.apply(prefix, group), group=group, cp_method=method,
                                           threads=1)
            return whole(y, packed), st
        return f

    def ulysses(x):
        part = mine(x, packed, "ulysses")  # [T/cp, H, D] -> every token of H/cp heads, squared, and back
        heads = maskpack.ulysses_all_to_all(part, group, scatter_dim=1, gather_dim=0)
        back = maskpack.ulysses_all_to_all(heads * heads, group, scatter_dim=0, gather_dim=1)
        return whole(back, packed, "ulysses")

    def gather(x):
        return whole(mine(x, packed) ** 2, packed)

    def loss(per_token, weights):
        return maskpack.cp_loss(mine(per_token, packed), mine(weights, packed), group)

    def qkv(lay, hq=2, hk=1, d=4):
        lead = (lay.n_rows, lay.q_width) if not lay.packed else (T,)
        return [rnd(*lead, hq, d), rnd(*lead, hk, d), rnd(*lead, hk, d)]

    def rule_inputs(h, hv, k=4, v=4):
        g = (-0.2 - 0.3 * torch.rand(T, hv, generator=g0)).requires_grad_()
        beta = (0.2 + 0.6 * torch.rand(T, hv, generator=g0)).requires_grad_()
        return [rnd(T, h, k), rnd(T, h, k), rnd(T, hv, v), g, beta, rnd(len(LENGTHS), hv, k, v, scale=0.1)]

    # the C algorithms (the ring, the sequence-parallel rule and conv): every Jacobian entry (a dropped
    # term of their backward can be a few percent of one entry, which fast mode's random projection
    # misses); the Python compositions of the single-process float32 kernels with exact moves: fast mode
    return {
        "ring attention, causal, GQA": (attention(packed, "ring"), qkv(packed), True),
        "ring attention, sliding window, softcap": (attention(windowed, "ring", softcap=3.0), qkv(windowed), True),
        "sequence-parallel Gated DeltaNet": (gdn("sequence"), rule_inputs(1, 1), True),
        "sequence-parallel conv": (conv("sequence"), [rnd(T, 3), rnd(3, 4, scale=0.5), rnd(len(LENGTHS), 3, 3)], True),
        "all-gather attention, padded rows": (attention(padded, "all_gather"), qkv(padded), False),
        "head-parallel Gated DeltaNet": (gdn("head"), rule_inputs(2, 2), False),
        "channel-parallel conv": (conv("head"), [rnd(T, 4), rnd(4, 4, scale=0.5), rnd(len(LENGTHS), 4, 3)], False),
        # the collectives are torch moves of any dtype: float64, every entry, gradcheck's own tolerances
        "cp_all_gather (float64)": (gather, [rnd(T, 3, dtype=torch.float64)], True),
        "Ulysses all-to-all, both ways (float64)": (ulysses, [rnd(T, 2, 3, dtype=torch.float64)], True),
        "cp_loss (float64)": (loss, [rnd(T, dtype=torch.float64),
                                     torch.rand(T, generator=g0, dtype=torch.float64).requires_grad_()], True),
    }


def _worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        res = {}
        for name, (f, inputs, full) in _cases(world).items():
            try:
                if inputs[0].dtype == torch.float64:
                    ok = torch.autograd.gradcheck(f, inputs)
                else:
                    ok = torch.autograd.gradcheck(f, inputs, eps=1e-2, atol=5e-3, rtol=5e-3, fast_mode=not full)
                res[name] = ("ok" if ok else "false", "")
            except Exception as e:  # noqa: BLE001 - reported by the test with the case's name
                res[name] = ("failed", f"{type(e).__name__}: {e}"[:3000])
        torch.save(res, os.path.join(out_dir, f"gc{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_every_cp_call_passes_gradcheck_across_two_processes():
    world = 2
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        mp.start_processes(_worker, args=(world, init, d), nprocs=world, join=True, start_method="spawn")
        for r in range(world):
            res = torch.load(os.path.join(d, f"gc{r}.pt"))
            assert len(res) == 10
            bad = {k: v for k, v in res.items() if v[0] != "ok"}
            assert not bad, f"rank {r}: " + "\n".join(f"{k}: {v[1]}" for k, v in bad.items())
