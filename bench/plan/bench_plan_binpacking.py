"""bench_plan_binpacking.py: the `binpacking` package (ms-swift's packer) beside maskpack.plan on the
input bench_plan.c uses.

The lengths are generated bit for bit as bench_plan.c does (splitmix64 uniforms, Box-Muller, lognormal
with median 600 and sigma 1.0, floored, clipped to [16, 8192]); both programs print the same checksum.
binpacking.to_constant_volume is quadratic in pure Python (about 4 minutes for 10^5 lengths here);
--n makes the input smaller, --binpacking-n runs binpacking on a prefix only.

usage: .venv/bin/python bench/plan/bench_plan_binpacking.py [--n N] [--seed S] [--binpacking-n M] [--reps R]
"""

import argparse
import math
import os
import sys
import statistics
import time

import binpacking
import numpy as np

import maskpack

MASK64 = (1 << 64) - 1


def splitmix(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def sft_lengths(n, seed, median=600.0, sigma=1.0, lo=16, hi=8192):
    s = seed
    two_pi = 6.283185307179586
    mu = math.log(median)
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        s, a = splitmix(s)
        s, b = splitmix(s)
        u1 = 1.0 - (a >> 11) * (1.0 / 9007199254740992.0)
        u2 = (b >> 11) * (1.0 / 9007199254740992.0)
        z = math.sqrt(-2.0 * math.log(u1)) * math.cos(two_pi * u2)
        x = math.floor(math.exp(mu + sigma * z))
        out[i] = lo if x < lo else hi if x > hi else int(x)
    return out


def checksum(v):
    h = 1469598103934665603
    for x in v.tolist():
        h ^= x & MASK64
        h = (h * 1099511628211) & MASK64
    return h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--binpacking-n", type=int, default=None)
    ap.add_argument("--reps", type=int, default=11)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: bench_shapes
    import bench_shapes  # the defaults are bench/shapes.json's arguments for this program

    bench_shapes.apply(ap, 'bench_plan_binpacking')
    args = ap.parse_args()
    cap = 8192
    lengths = sft_lengths(args.n, args.seed)
    total = int(lengths.sum())
    print(f"input: {args.n} lengths, lognormal(median 600, sigma 1.0) clipped to [16, {cap}], seed {args.seed}")
    print(f"       sum {total} tokens, checksum {checksum(lengths):016x} (compare with bench_plan)")
    print(f"       lower bound ceil(sum / capacity) = {-(-total // cap)} rows")

    # maskpack through the Python binding (conversion + plan; median of reps)
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        p = maskpack.plan(lengths, cap)
        times.append(time.perf_counter() - t0)
    rep = p.report()
    print(f"\nmaskpack.plan (best-fit-decreasing)       {1e3 * statistics.median(times):10.3f} ms  "
          f"rows {rep['n_packed_rows']:6d}  fill {100 * rep['fill']:.4f}%")
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        q = maskpack.plan(lengths, cap, dp=64, objective="attention")
        times.append(time.perf_counter() - t0)
    r2 = q.report()
    print(f"maskpack.plan + balance over 64 ranks     {1e3 * statistics.median(times):10.3f} ms  "
          f"imbalance {100 * r2['imbalance']:.5f}% (attention cost)")

    m = args.binpacking_n or args.n
    sub = lengths[:m].tolist()
    t0 = time.perf_counter()
    bins = binpacking.to_constant_volume(sub, cap)
    dt = time.perf_counter() - t0
    fill = sum(sub) / (cap * len(bins))
    label = "binpacking.to_constant_volume" + ("" if m == args.n else f" (first {m})")
    print(f"{label:<42}{1e3 * dt:10.1f} ms  rows {len(bins):6d}  fill {100 * fill:.4f}%")
    if m != args.n:
        ours = maskpack.plan(lengths[:m], cap).report()
        print(f"{'maskpack.plan on the same prefix':<42}{'':>13}  rows {ours['n_packed_rows']:6d}  "
              f"fill {100 * ours['fill']:.4f}%")


if __name__ == "__main__":
    main()
