"""Run under mpirun by tests/python/test_mpi4py.py: ring attention and sequence-parallel Gated DeltaNet
with group= an mpi4py communicator, on every rank against the single-process result of the same seeded
inputs (computed on each rank). Exit status 0 when every check passed on this rank."""

import sys

import torch
from mpi4py import MPI

import maskpack


def main() -> int:
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    torch.set_num_threads(1)
    failures = []
    lay = maskpack.Layout.from_lengths([37, 5, 64, 20, 3], placement="packed")
    cut = lambda t: lay.shard(t, world, rank)  # noqa: E731
    g0 = torch.Generator().manual_seed(7)
    T = lay.n_tokens
    # ring attention, GQA, forward and backward
    q, do = torch.randn(T, 4, 16, generator=g0), torch.randn(T, 4, 16, generator=g0)
    k, v = torch.randn(T, 2, 16, generator=g0), torch.randn(T, 2, 16, generator=g0)
    ref = [x.clone().requires_grad_() for x in (q, k, v)]
    o = maskpack.attention_autograd(*ref, lay, threads=1)
    (o * do).sum().backward()
    mine = [cut(x).clone().requires_grad_() for x in (q, k, v)]
    om, lse = maskpack.attention(*mine, lay, group=comm, threads=1)
    (om * cut(do)).sum().backward()
    if not torch.allclose(om, cut(o.detach()), rtol=1e-5, atol=1e-6):
        failures.append("ring attention output")
    # lse [Hq, T_local]: the whole [Hq, T]'s rows of this rank's tokens; a pad slot of the shard sees no key: -inf
    lse_ref = maskpack.attention(q, k, v, lay, threads=1)[1]
    lse_mine = lay.shard(lse_ref.T.contiguous(), world, rank, pad_value=float("-inf")).T
    if lse.requires_grad or not torch.allclose(lse, lse_mine, rtol=1e-5, atol=1e-5):
        failures.append("ring attention lse")
    for name, a, b in zip("qkv", mine, ref):
        if not torch.allclose(a.grad, cut(b.grad), rtol=1e-4, atol=1e-5):
            failures.append(f"ring attention d{name}")
    # sequence-parallel GDN ("auto" with an mpi4py communicator), initial state included
    q, k = torch.randn(T, 3, 8, generator=g0), torch.randn(T, 3, 8, generator=g0)
    v, dv = torch.randn(T, 6, 4, generator=g0), torch.randn(T, 6, 4, generator=g0)
    g = -torch.nn.functional.softplus(torch.randn(T, 6, generator=g0)) * 0.3
    beta = torch.sigmoid(torch.randn(T, 6, generator=g0))
    h0 = torch.randn(5, 6, 8, 4, generator=g0) * 0.1
    ref = [x.clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
    o, ht = maskpack.gated_delta_rule(*ref[:5], lay, initial_state=ref[5])
    ((o * dv).sum() + ht.square().sum()).backward()
    mine = [cut(x).clone().requires_grad_() for x in (q, k, v, g, beta)]
    h0m = h0.clone().requires_grad_()
    om, htm = maskpack.gated_delta_rule(*mine, lay, initial_state=h0m, group=comm)
    ((om * cut(dv)).sum() + htm.square().sum()).backward()
    if not torch.allclose(om, cut(o.detach()), rtol=1e-4, atol=1e-5):
        failures.append("gdn output")
    if not torch.allclose(htm, ht.detach(), rtol=1e-4, atol=1e-5):
        failures.append("gdn final state")
    for name, a, b in zip(("q", "k", "v", "g", "beta"), mine, ref):
        if not torch.allclose(a.grad, cut(b.grad), rtol=1e-3, atol=1e-4):
            failures.append(f"gdn d{name}")
    gh0 = h0m.grad if h0m.grad is not None else torch.zeros_like(h0)
    total = torch.from_numpy(comm.allreduce(gh0.numpy()))
    if not torch.allclose(total, ref[5].grad, rtol=1e-3, atol=1e-4):
        failures.append("gdn d_initial_state summed over the ranks")
    # the sequence-parallel conv ("auto" with an mpi4py communicator): bitwise
    x, w, pre = torch.randn(T, 6, generator=g0), torch.randn(6, 4, generator=g0) * 0.5, torch.randn(5, 6, 3, generator=g0)
    y, st = maskpack.causal_conv1d(x, w, lay, prefix=pre)
    ym, stm = maskpack.causal_conv1d(cut(x), w, lay, prefix=pre, group=comm)
    if not (torch.equal(ym, cut(y)) and torch.equal(stm, st)):
        failures.append("conv output or state")
    # what runs over torch.distributed only is refused, naming the group, on every rank
    try:
        maskpack.gated_delta_rule(*[cut(x) for x in (q, k, v, g, beta)], lay, group=comm, cp_method="head")
        failures.append("head-parallel with mpi4py was not refused")
    except maskpack.Error as e:
        if e.argument != "group" or "torch.distributed group" not in str(e):
            failures.append(f"head-parallel refusal: {e}")
    for f in failures:
        print(f"rank {rank}: {f}", file=sys.stderr)
    bad = comm.allreduce(len(failures))
    if rank == 0:
        print(f"mpi4py_worker: {world} ranks, {'FAILED' if bad else 'all checks passed'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
