"""bench_cp_agree.py: what the agreement every CP call starts with costs on a small, latency-bound call.

2 gloo processes, 1 thread each, ring attention (maskpack.attention(..., group=), cp_algorithm="ring") of
a packed batch of 2 x 256 tokens (H = 4, D = 64, float32: bench/shapes.json's table "cp_agree", each an
option), forward and forward + backward; beside it the
agreement exchange alone (maskpack.distributed._agree with the ring's settings) and, for scale, one
bare gloo all-gather of a 16-word record. Calls alternate in rounds inside the same two processes and
the median of each is printed (microseconds per call). Issue 32 allows no path slower than before by
more than 2 %: run this before and after a change (a quiet machine; two ranks on two cores).

    PYTHONPATH=python .venv/bin/python bench/bench_cp_agree.py [--calls 200] [--rounds 7]
                                   [--lengths 256,256] [--heads 4] [--head-dim 64]
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import maskpack

import bench_shapes  # the shapes' defaults: bench/shapes.json (bench/ is this script's folder)


def _worker(rank, world, init, args, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        lay = maskpack.Layout.from_lengths(args.lengths, placement="packed")
        g0 = torch.Generator().manual_seed(0)
        shape = (sum(args.lengths), args.heads, args.head_dim)
        q, k, v, do = (lay.shard(torch.randn(*shape, generator=g0), world, rank) for _ in range(4))
        grp = dist.group.WORLD

        def fwd():
            with torch.no_grad():
                maskpack.attention(q, k, v, lay, group=grp, cp_algorithm="ring", threads=1)

        leaves = [x.clone().requires_grad_() for x in (q, k, v)]

        def fwd_bwd():
            o, _ = maskpack.attention(*leaves, lay, group=grp, cp_algorithm="ring", threads=1)
            (o * do).sum().backward()

        from maskpack import distributed as mpd

        if hasattr(mpd, "_cp_settings"):  # the fixed-size record (issue 32)
            def agree():
                hd = "[heads, head dim]"
                mpd._agree(grp, lay, "attention", mpd._cp_settings("zigzag", 1, "verl")
                           + [("algorithm", "algorithm", "choice", "ring", ("ring", "all_gather"))]
                           + mpd._tensor_settings(lay, ("q", q, hd), ("k", k, hd), ("v", v, hd))
                           + [("scale", "scale", "real", None), ("softcap", "softcap", "real", 0.0)], None)
        else:  # before: a record of the call's own length
            def agree():
                mpd._agree(grp, lay, ("attention", "zigzag", 1, "verl", tuple(k.shape[1:]), tuple(v.shape[1:]),
                                      str(k.dtype), True), None)

        def variant_agree(fn):
            hd = "[heads, head dim]"
            fn(grp, lay, "attention", mpd._cp_settings("zigzag", 1, "verl")
               + [("algorithm", "algorithm", "choice", "ring", ("ring", "all_gather"))]
               + mpd._tensor_settings(lay, ("q", q, hd), ("k", k, hd), ("v", v, hd))
               + [("scale", "scale", "real", None), ("softcap", "softcap", "real", 0.0)], None)

        rec = torch.zeros(16, dtype=torch.int64)

        def bare():
            dist.all_gather([torch.empty_like(rec) for _ in range(world)], rec, group=grp)

        cases = {"ring forward": fwd, "ring forward+backward": fwd_bwd, "agreement alone": agree,
                 "bare gloo all-gather (16 words)": bare}
        res = {name: [] for name in cases}
        if args.before:  # the same calls with the agreement of another distributed.py (e.g. git show
            # HEAD:python/maskpack/distributed.py), paired call by call with this one's: the ratio
            # of each pair's times, whose median is robust to a busy machine
            import importlib.util

            spec = importlib.util.spec_from_file_location("maskpack._distributed_before", args.before)
            old = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(old)
            new_agree = mpd._agree

            def old_agree(group, layout, call, settings, local):  # the record the old code sent for this call
                vals = tuple(st[3] for st in settings)
                return old._agree(group, layout, (call,) + vals[:4] + tuple(str(v) for v in vals[4:]), local)

            for name, f in (("ring forward", fwd), ("ring forward+backward", fwd_bwd), ("agreement alone", agree)):
                for _ in range(5):
                    f()
                pairs = []
                for i in range(args.calls * args.rounds):
                    times = []
                    for variant in ((old_agree, new_agree) if i % 2 else (new_agree, old_agree)):
                        mpd._agree = variant
                        dist.barrier()
                        t0 = time.perf_counter()
                        f() if name != "agreement alone" else variant_agree(variant)
                        times.append(time.perf_counter() - t0)
                    t_new, t_old = (times[1], times[0]) if i % 2 else (times[0], times[1])
                    pairs.append((t_old * 1e6, t_new * 1e6))
                mpd._agree = new_agree
                res[name + " (before, after) pairs"] = pairs
        else:
            for f in cases.values():  # warm: segments, caches, the extension
                for _ in range(10):
                    f()
            for _ in range(args.rounds):
                for name, f in cases.items():
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        f()
                    res[name].append((time.perf_counter() - t0) / args.calls * 1e6)
        if rank == 0:
            torch.save(res, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--before", default=None, help="another distributed.py whose agreement to pair against")
    ap.add_argument("--lengths", type=bench_shapes.integers(1, 1 << 20), help="the packed sequences' lengths, L,L,...")
    ap.add_argument("--heads", type=bench_shapes.integer(1, 256))
    ap.add_argument("--head-dim", type=bench_shapes.integer(1, 1024))
    bench_shapes.apply(ap, 'bench_cp_agree', table=True)
    args = ap.parse_args()
    print(f"bench_cp_agree: 2 gloo ranks, 1 thread each; packed lengths {','.join(map(str, args.lengths))}, "
          f"H {args.heads}, D {args.head_dim}, float32", flush=True)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "res.pt")
        mp.start_processes(_worker, args=(2, os.path.join(d, "init"), args, out), nprocs=2, join=True,
                           start_method="spawn")
        res = torch.load(out)
    for name, ts in res.items():
        if not ts:
            continue
        if name.endswith("pairs"):
            old = statistics.median(p[0] for p in ts)
            new = statistics.median(p[1] for p in ts)
            ratio = statistics.median(p[1] / p[0] for p in ts)
            print(f"{name:44s} before {old:8.1f} us, after {new:8.1f} us, median after/before {ratio:.3f} "
                  f"({len(ts)} pairs)")
            continue
        print(f"{name:34s} median {statistics.median(ts):9.1f} us/call  (rounds: "
              f"{', '.join(f'{t:.0f}' for t in ts)})")


if __name__ == "__main__":
    main()
