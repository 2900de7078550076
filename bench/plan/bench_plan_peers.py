"""bench_plan_peers.py: maskpack.plan beside the planners users run, measured in the same run.

Peers, each transcribed here from its published algorithm (no code copied; numpy and the `binpacking`
package only):
  verl-KK    verl's `_balance_batch` + `rearrange_micro_batches`: Karmarkar-Karp (largest differencing,
             balanced to equal sequence counts when dp divides the batch, as verl requires) on
             24576*L + L^2 (attention) or L (tokens) over dp ranks; then each rank's sequences into
             micro-batches (rows) of at most `capacity` tokens by Karmarkar-Karp on L, the count
             ceil(tokens / capacity) taken as the largest over ranks (verl syncs it across dp) and raised
             by one until no row is over capacity (verl's version does not check; a row over capacity
             would not run)
  NeMo-FFD   NeMo-RL's first-fit-decreasing packer over the whole batch; the rows are dealt to ranks
             round-robin in packing order, empty rows added so every rank has as many
  swift-bp   ms-swift's packing: `binpacking.to_constant_volume` on windows of 1000 sequences, rows
             dealt round-robin as above
  maskpack   maskpack.plan(lengths, capacity, dp, objective) and its `.rows`
Per case and planner: per-rank imbalance (max / mean - 1) of tokens and of the attention objective
(24576*L + L^2), each from a run balancing that objective (peers without an objective: one run), the
fill over every row every rank runs (empty rows included), and the time (median of repeats; the
slow peers once; maskpack's time is plan() and its rows, the peers' their own algorithm and row
lists). Every plan is checked: each sequence once, no row over capacity, equal rows per rank.

The machine may be shared: the load average is printed before and after; figures are only comparable
inside one run.

usage: PYTHONPATH=.pyinst python bench/plan/bench_plan_peers.py [--sizes 1000,10000] [--dps 8,64]
       [--dists lognormal,chat,uniform] [--full]   (--full adds 100000 sequences for every peer:
       binpacking and the Python KK then take minutes)
"""

import argparse
import heapq
import math
import os
import sys
import statistics
import time

import binpacking
import numpy as np

import maskpack

CAP = 8192
A = 24576.0


# ---- inputs ---------------------------------------------------------------------------------------------


def lengths_for(dist, n, seed=1):
    rng = np.random.default_rng(seed)
    if dist == "lognormal":  # SFT-like: median 600, sigma 1
        x = rng.lognormal(math.log(600), 1.0, n)
    elif dist == "chat":  # mostly short turns, some long documents, a few near the capacity
        kind = rng.random(n)
        x = np.where(kind < 0.70, rng.lognormal(math.log(300), 0.8, n),
                     np.where(kind < 0.95, rng.lognormal(math.log(1500), 0.6, n), rng.uniform(4096, CAP, n)))
    elif dist == "uniform":
        x = rng.uniform(16, CAP, n)
    else:
        raise ValueError(dist)
    return np.clip(x.astype(np.int64), 16, CAP)


def cost_of(lengths, objective):
    L = lengths.astype(np.float64)
    return A * L + L * L if objective == "attention" else L


# ---- peers --------------------------------------------------------------------------------------------


def kk(costs, k, equal_size):
    """Largest differencing method: states of k partial sums; the two states with the largest spread
    are merged, heaviest part of one with the lightest of the other. -> part index per item."""
    n = len(costs)
    heap = []
    tick = 0
    if equal_size:
        order = np.argsort(costs, kind="stable").tolist()
        for g in range(0, n, k):
            ids = order[g:g + k]
            parts = sorted(([costs[i], [i]] for i in ids), key=lambda p: -p[0])
            heapq.heappush(heap, (-(parts[0][0] - parts[-1][0]), tick, parts))
            tick += 1
    else:
        for i in range(n):
            parts = [[costs[i], [i]]] + [[0.0, []] for _ in range(k - 1)]
            heapq.heappush(heap, (-costs[i], tick, parts))
            tick += 1
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = []
        for j in range(k):
            x, y = a[j], b[k - 1 - j]
            big, small = (x[1], y[1]) if len(x[1]) >= len(y[1]) else (y[1], x[1])
            big.extend(small)  # the larger member list grows in place: O(n log n) copying in all
            merged.append([x[0] + y[0], big])
        merged.sort(key=lambda p: -p[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tick, merged))
        tick += 1
    out = np.empty(n, dtype=np.int64)
    for j, (_, ids) in enumerate(heap[0][2]):
        out[ids] = j
    return out


def verl_plan(lengths, dp, objective):
    costs = cost_of(lengths, objective).tolist()
    rank = kk(costs, dp, equal_size=len(lengths) % dp == 0)
    members = [np.flatnonzero(rank == q) for q in range(dp)]
    n_mb = max(1, max(-(-int(lengths[m].sum()) // CAP) for m in members))
    while True:
        rows, ok = [], True
        for m in members:
            k = min(n_mb, max(1, len(m)))
            part = kk(lengths[m].astype(np.float64).tolist(), k, equal_size=False) if len(m) else np.zeros(0, int)
            rank_rows = [m[part == j] for j in range(k)] + [m[:0]] * (n_mb - k)
            if any(int(lengths[r].sum()) > CAP for r in rank_rows):
                ok = False
                break
            rows.append(rank_rows)
        if ok:
            return rows
        n_mb += 1


def deal_round_robin(row_list, dp):
    per = max(1, -(-len(row_list) // dp))
    empty = np.zeros(0, dtype=np.int64)
    row_list = row_list + [empty] * (per * dp - len(row_list))
    return [[row_list[t * dp + q] for t in range(per)] for q in range(dp)]


def nemo_ffd_plan(lengths, dp):
    order = np.argsort(-lengths, kind="stable")
    free = np.empty(len(lengths), dtype=np.int64)
    nb = 0
    bins = []
    for i in order.tolist():
        s = lengths[i]
        hit = np.flatnonzero(free[:nb] >= s)
        if len(hit):
            b = int(hit[0])
        else:
            b = nb
            free[nb] = CAP
            nb += 1
            bins.append([])
        free[b] -= s
        bins[b].append(i)
    return deal_round_robin([np.array(b, dtype=np.int64) for b in bins], dp)


def swift_plan(lengths, dp, window=1000):
    rows = []
    for start in range(0, len(lengths), window):
        items = {start + i: int(v) for i, v in enumerate(lengths[start:start + window])}
        for b in binpacking.to_constant_volume(items, CAP):
            rows.append(np.array(sorted(b.keys()), dtype=np.int64))
    return deal_round_robin(rows, dp)


def maskpack_rows(lengths, dp, objective):
    """What maskpack hands over (timed): the plan and its rows as CSR arrays."""
    p = maskpack.plan(lengths, CAP, dp=dp, objective=objective)
    return p.n_rows // dp, p.rows


def maskpack_ranks(planned, dp):
    """The same rows per rank, as the checks and figures below take them (not timed)."""
    per, rows = planned
    off, seqs = rows.offsets, rows.sequences
    return [[seqs[off[q * per + t]:off[q * per + t + 1]] for t in range(per)] for q in range(dp)]


# ---- measuring ------------------------------------------------------------------------------------------


def check(ranks, lengths):
    per = {len(r) for r in ranks}
    assert len(per) == 1, "unequal rows per rank"
    seen = np.zeros(len(lengths), dtype=np.int64)
    for r in ranks:
        for row in r:
            assert int(lengths[row].sum()) <= CAP, "row over capacity"
            np.add.at(seen, row, 1)
    assert (seen == 1).all(), "a sequence not placed exactly once"


def figures(ranks, lengths):
    tok = np.array([sum(float(lengths[row].sum()) for row in r) for r in ranks])
    att = np.array([sum(float(cost_of(lengths[row], "attention").sum()) for row in r) for r in ranks])
    imb = lambda v: float(v.max() / v.mean() - 1) if v.mean() > 0 else 0.0  # noqa: E731
    fill = float(lengths.sum()) / (CAP * len(ranks) * len(ranks[0]))
    return imb(tok), imb(att), fill


def timed(fn, reps):
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--dps", default="8,64")
    ap.add_argument("--dists", default="lognormal,chat,uniform")
    ap.add_argument("--full", action="store_true", help="add 100000 sequences for every peer (minutes)")
    ap.add_argument("--peers", default="verl-KK,NeMo-FFD,swift-bp",
                    help="peers to run (verl-KK at 1e5 sequences takes minutes per run in Python)")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: bench_shapes
    import bench_shapes  # the defaults are bench/shapes.json's arguments for this program

    bench_shapes.apply(ap, 'bench_plan_peers')
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.full and 100000 not in sizes:
        sizes.append(100000)
    dps = [int(x) for x in args.dps.split(",")]
    peers = set(args.peers.split(","))
    print(f"load average before: {os.getloadavg()}  (cores: {os.cpu_count()}; a shared machine inflates times)")
    print(f"capacity {CAP}; attention objective 24576*L + L^2; imbalance = max/mean - 1 over ranks; "
          f"fill over every row every rank runs")
    hdr = f"{'dist':9} {'n':>6} {'dp':>3}  {'planner':9} {'imb tok %':>10} {'imb att %':>10} {'fill %':>8} {'time ms':>10}"
    print(hdr)
    print("-" * len(hdr))
    verdict = []
    for dist in args.dists.split(","):
        for n in sizes:
            lengths = lengths_for(dist, n)
            for dp in dps:
                res = {}
                # maskpack: one run per objective, each timed with its rows
                reps = 7
                rt, t_tok = timed(lambda: maskpack_rows(lengths, dp, "tokens"), reps)
                ra, t_att = timed(lambda: maskpack_rows(lengths, dp, "attention"), reps)
                rt, ra = maskpack_ranks(rt, dp), maskpack_ranks(ra, dp)
                check(rt, lengths)
                check(ra, lengths)
                res["maskpack"] = (figures(rt, lengths)[0], figures(ra, lengths)[1], figures(rt, lengths)[2],
                                   max(t_tok, t_att))
                slow = n >= 100000
                if "verl-KK" in peers:
                    rt, t_tok = timed(lambda: verl_plan(lengths, dp, "tokens"), 1)
                    ra, t_att = timed(lambda: verl_plan(lengths, dp, "attention"), 1)
                    check(rt, lengths)
                    check(ra, lengths)
                    res["verl-KK"] = (figures(rt, lengths)[0], figures(ra, lengths)[1], figures(rt, lengths)[2],
                                      max(t_tok, t_att))
                if "NeMo-FFD" in peers:
                    r, t = timed(lambda: nemo_ffd_plan(lengths, dp), 1 if slow else 3)
                    check(r, lengths)
                    res["NeMo-FFD"] = figures(r, lengths) + (t,)
                if "swift-bp" in peers:
                    r, t = timed(lambda: swift_plan(lengths, dp), 1)
                    check(r, lengths)
                    res["swift-bp"] = figures(r, lengths) + (t,)
                for name, (it, ia, f, t) in res.items():
                    print(f"{dist:9} {n:6d} {dp:3d}  {name:9} {100 * it:10.4f} {100 * ia:10.4f} {100 * f:8.3f} "
                          f"{1e3 * t:10.2f}")
                m, k, ffd = res["maskpack"], res.get("verl-KK"), res.get("NeMo-FFD")
                ok_bal = None if k is None else m[0] <= k[0] + 0.005 and m[1] <= k[1] + 0.005
                ok_fill = None if ffd is None else m[2] >= ffd[2] - 1e-12
                ok_time = all(m[3] < v[3] for key, v in res.items() if key != "maskpack")
                verdict.append((dist, n, dp, ok_bal, ok_fill, ok_time))
    # plan() + rows at 1e5 sequences (the < 30 ms target), maskpack only
    lengths = lengths_for("lognormal", 100000)
    for dp in dps:
        for obj in ("tokens", "attention"):
            _, t = timed(lambda: maskpack_rows(lengths, dp, obj), 9)
            cpu = []
            for _ in range(9):  # this process's CPU time: what other load on a shared machine leaves out
                c0 = time.process_time()
                maskpack_rows(lengths, dp, obj)
                cpu.append(time.process_time() - c0)
            print(f"maskpack plan()+rows, lognormal 1e5 sequences, dp {dp}, {obj}: {1e3 * t:.2f} ms wall, "
                  f"{1e3 * statistics.median(cpu):.2f} ms CPU (medians of 9)")
    print("\nper case: balance within 0.5 pp of verl-KK (both objectives) / fill >= NeMo-FFD / fastest")
    for dist, n, dp, b, f, t in verdict:
        word = lambda v: "-" if v is None else "ok" if v else "MISS"  # noqa: E731  ('-': that peer not run)
        print(f"  {dist:9} {n:6d} dp {dp:3d}: {word(b):4} {word(f):4} {word(t)}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
