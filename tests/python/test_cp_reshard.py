"""maskpack.distributed.cp_reshard across 2 and 4 gloo processes: every pair of CP splits (per-sequence
zigzag, per-sequence contiguous, Ulysses / the whole-stream contiguous split, the whole-stream zigzag), packed layouts with
uneven sequences: the result on each rank is exactly what layout.shard gives under the new split (pads
0), and its gradient is the reverse move (checked against the shard of the whole gradient)."""

import itertools
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import maskpack
from maskpack.distributed import cp_reshard

LENGTHS = [7, 2, 12, 5, 9, 3]
SCHEMES = ["zigzag", "contiguous", "ulysses", "stream_zigzag"]


def _shard(lay, x, world, rank, scheme):
    """This rank's part of x [T, ...] under a split; the whole-stream zigzag written out here: the
    stream padded with zeros to a multiple of 2 * world, cut into 2 * world chunks, chunks rank and
    2 * world - 1 - rank."""
    if scheme != "stream_zigzag":
        return lay.shard(x, world, rank, scheme=scheme)
    T = x.shape[0]
    c = -(-T // (2 * world))
    padded = torch.cat([x, x.new_zeros((2 * world * c - T,) + tuple(x.shape[1:]))])
    chunks = padded.split(c)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]])


def _worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        lay = maskpack.Layout.from_lengths(LENGTHS, placement="packed")
        T = sum(LENGTHS)
        x = torch.randn(T, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        dy = torch.randn(T, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        bad = []
        for a, b in itertools.product(SCHEMES, SCHEMES):
            part = _shard(lay, x, world, rank, a).requires_grad_()
            y = cp_reshard(part, lay, dist.group.WORLD, scheme=a, to_scheme=b)
            want = _shard(lay, x, world, rank, b)
            g_out = _shard(lay, dy, world, rank, b)
            (g,) = torch.autograd.grad(y, part, g_out)
            g_want = _shard(lay, dy, world, rank, a)  # each token's gradient back on its holder
            if not torch.equal(y.detach(), want):
                bad.append(f"{a}->{b}: values")
            if not torch.equal(g, g_want):
                bad.append(f"{a}->{b}: gradient")
        try:  # a shard cut for another rank count
            cp_reshard(lay.shard(x, world + 1, 0, scheme="zigzag"), lay, dist.group.WORLD)
            bad.append("wrong shard accepted")
        except maskpack.Error as e:
            if e.argument != "group":  # a shard for world + 1 ranks: the group is the wrong size
                bad.append(f"wrong shard: argument {e.argument}")
        try:  # a tensor that is no shard at all
            cp_reshard(x[:1], lay, dist.group.WORLD)
            bad.append("no shard accepted")
        except maskpack.Error as e:
            if e.argument != "x":
                bad.append(f"no shard: argument {e.argument}")
        torch.save(bad, os.path.join(out_dir, f"r{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_reshard_every_pair_of_splits(world):
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        mp.start_processes(_worker, args=(world, init, d), nprocs=world, join=True, start_method="spawn")
        for r in range(world):
            assert torch.load(os.path.join(d, f"r{r}.pt")) == [], r
