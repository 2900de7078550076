"""Ranks that make different context-parallel calls, or the same call with different settings, get a
maskpack.Error on every rank naming the setting, both values and the first rank that differs from rank 0
(issue 32): never a SIGABRT from inside gloo (payloads of different sizes) or a hang. 2 and 4 real gloo
processes; the group's timeout and the harness's deadline turn a hang into a failure."""

import datetime
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import maskpack

LENGTHS = [37, 5, 64, 20, 3]


def _cases(world):
    """name -> (call of every rank but `odd`, call of rank `odd`, odd); each call takes (rank, world)."""
    lay = maskpack.Layout.from_lengths(LENGTHS, placement="packed")
    T = lay.n_tokens
    g0 = torch.Generator().manual_seed(3)
    x2 = torch.randn(T, 2, generator=g0)
    qkv = torch.randn(T, 2, 8, generator=g0)
    q1 = torch.randn(T, 1, 8, generator=g0)
    gq, gv = torch.randn(T, 1, 4, generator=g0), torch.randn(T, 3, 4, generator=g0)
    gg = -torch.rand(T, 3, generator=g0) * 0.3
    gb = torch.rand(T, 3, generator=g0)
    cx, cw = torch.randn(T, 4, generator=g0), torch.randn(4, 4, generator=g0) * 0.5
    W = dist.group.WORLD
    cut = lambda t, r: lay.shard(t, world, r)  # noqa: E731

    def ring(r, n, k=qkv):
        return maskpack.attention(cut(qkv, r), cut(k, r), cut(k, r), lay, group=W, cp_algorithm="ring", threads=1)[0]

    def gather(r, n, part=x2, scheme="zigzag"):
        return maskpack.cp_all_gather(lay.shard(part, n, r, scheme=scheme), lay, W, scheme=scheme)

    def gdn(r, n, v=gv, g=gg, beta=gb):
        return maskpack.gated_delta_rule(cut(gq, r), cut(gq, r), cut(v, r), cut(g, r), cut(beta, r), lay, group=W,
                                         cp_method="sequence")

    def gdn_heads(r, n, g=gg):  # head-parallel: the all-to-all moves g before the kernel reads it
        return maskpack.gated_delta_rule(cut(gq, r).repeat(1, n, 1), cut(gq, r).repeat(1, n, 1),
                                         cut(gv, r).repeat(1, n, 1), cut(g, r).repeat(1, n),
                                         cut(gb, r).repeat(1, n), lay, group=W, cp_method="head")

    def conv(r, n, method="sequence"):
        return maskpack.causal_conv1d(cut(cx, r), cw, lay, group=W, cp_method=method)

    last = world - 1
    return {
        # rank 0 in the ring, every other rank in the sequence-parallel GDN
        "ring vs gdn": (lambda r, n: gdn(r, n), ring, 0),
        "gather vs ring": (ring, gather, last),  # records of different lengths before: gloo aborted
        "gdn vs conv": (lambda r, n: gdn(r, n), lambda r, n: conv(r, n), last),
        "conv head vs sequence": (lambda r, n: conv(r, n), lambda r, n: conv(r, n, "head"), last),
        "dtype": (gather, lambda r, n: gather(r, n, part=x2.double()), last),
        "payload": (gather, lambda r, n: gather(r, n, part=torch.randn(T, 3)), last),
        "scheme": (gather, lambda r, n: gather(r, n, scheme="contiguous"), last),
        "key heads": (ring, lambda r, n: ring(r, n, k=q1), last),
        # a growing gate on one rank: refused before any exchange, on every rank alike (it used to be
        # refused after the all-to-all, on that rank alone, while the others waited in the next one)
        "growing gate, head-parallel": (gdn_heads, lambda r, n: gdn_heads(r, n, g=-gg), last),
        "value heads": (lambda r, n: gdn(r, n),
                        lambda r, n: gdn(r, n, v=gv[:, :2].contiguous(), g=gg[:, :2].contiguous(),
                                         beta=gb[:, :2].contiguous()), last),
    }


# (argument, substrings of the message) every rank must see; {r}: the rank that differs, {L}: the last rank
WANT = {
    "ring vs gdn": ("group", ["rank 1 disagrees with rank 0 about the collective call: gated_delta_rule_sp on rank 1, "
                              "attention on rank 0"]),
    "gather vs ring": ("group", ["rank {L} disagrees with rank 0 about the collective call: cp_all_gather on rank {L}, "
                                 "attention on rank 0"]),
    "gdn vs conv": ("group", ["about the collective call: causal_conv1d_sp on rank {L}, gated_delta_rule_sp on rank 0"]),
    "conv head vs sequence": ("group", ["about the collective call: causal_conv1d on rank {L}, causal_conv1d_sp on "
                                       "rank 0"]),
    "dtype": ("part", ["rank {L} disagrees with rank 0 about the part dtype: torch.float64 on rank {L}, "
                       "torch.float32 on rank 0"]),
    "payload": ("part", ["about the part per-token shape: [3] on rank {L}, [2] on rank 0"]),
    "scheme": ("scheme", ["about the CP scheme: 'contiguous' on rank {L}, 'zigzag' on rank 0"]),
    "key heads": ("k", ["about the k per-token shape [heads, head dim]: [1, 8] on rank {L}, [2, 8] on rank 0"]),
    "value heads": ("v", ["about the v per-token shape [heads, head dim]: [2, 4] on rank {L}, [3, 4] on rank 0"]),
}


def _worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    try:
        torch.set_num_threads(1)
        got = {}
        for name, (common, odd_call, odd) in _cases(world).items():
            try:
                (odd_call if rank == odd else common)(rank, world)
                got[name] = ("returned",)
            except maskpack.Error as e:
                got[name] = ("Error", e.status, e.argument, e.index, str(e))
            except Exception as e:  # recorded, so the test says what came instead
                got[name] = (type(e).__name__, str(e))
            torch.save(got, os.path.join(out_dir, f"agree{rank}.pt"))  # what was reached, should a later case hang
        # the group is still sound: a call every rank makes alike goes through
        lay = maskpack.Layout.from_lengths(LENGTHS, placement="packed")
        x = torch.arange(lay.n_tokens * 2, dtype=torch.float32).reshape(-1, 2)
        whole = maskpack.cp_all_gather(lay.shard(x, world, rank), lay, dist.group.WORLD)
        got["after"] = bool(torch.equal(whole, x))
        torch.save(got, os.path.join(out_dir, f"agree{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_in_different_calls_or_settings_all_raise_naming_both_values(world):
    with tempfile.TemporaryDirectory() as d:
        ctx = mp.start_processes(_worker, args=(world, os.path.join(d, "init"), d), nprocs=world, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + 300
        try:
            while not ctx.join(timeout=5):
                assert time.monotonic() < deadline, "the ranks hung"
        finally:
            for p in ctx.processes:  # a hung or crashed peer: end what is left (these processes are ours)
                if p.is_alive():
                    p.kill()
        last = world - 1
        for r in range(world):
            got = torch.load(os.path.join(d, f"agree{r}.pt"))
            res = got.get("growing gate, head-parallel")
            assert res is not None and res[0] == "Error", (r, res)
            if r == last:  # the rank whose gate grows names it, the first offending token and head
                assert res[1] == "MASKPACK_ERR_VALUE" and res[2] == "g" and "g[" in res[4], (r, res)
            else:  # every other rank stops with it, naming that rank
                assert res[2] == "group" and res[3] == (last,), (r, res)
                assert f"rank {last} refused its arguments" in res[4], (r, res)
            for name, (arg, subs) in WANT.items():
                res = got.get(name)
                assert res is not None and res[0] == "Error", (r, name, res)
                _, status, argument, index, msg = res
                assert argument == arg, (r, name, res)
                assert status == "MASKPACK_ERR_INVALID_ARGUMENT", (r, name, res)
                for sub in subs:
                    assert sub.format(L=last) in msg, (r, name, msg)
                first = 1 if name == "ring vs gdn" else last
                assert index == (first,), (r, name, res)
                # the same error on every rank
                other = torch.load(os.path.join(d, f"agree{(r + 1) % world}.pt"))[name]
                assert other[4] == msg, (r, name, other, msg)
            assert got["after"] is True
