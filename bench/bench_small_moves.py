"""bench_small_moves.py: small moves and derived outputs on the calling thread against the default team
(torch's OpenMP pool once torch is imported), on an idle machine and with one core kept busy.

A parallel region is only as fast as its slowest thread: with a core taken by another process, the
region's end waits for a thread the scheduler has not run yet (a time slice: milliseconds), where the
move alone takes microseconds. maskpack therefore keeps a move under a size threshold on the caller's
thread whatever the pool; this bench measures both sides of that choice per size, so the threshold can be
read off: a move below it must stay within 2x of its idle time when contended.

Timed calls (paired: the modes alternate call by call, which goes first alternating; median of --reps):
    shard_ids    layout.shard of a 16k-token packed row's int64 ids (cp 2): 64 KB
    shard_h<H>   layout.shard of [T, H] float32 hidden states (T = 16k): H in --hidden
    unpack_h<H>  layout.unpack of [T, H] float32 into a right-padded [B, S, H] (8 sequences)
    bundle_cp2   prepare_batch of one 32k-token packed row at cp 2 (rank 0) and every field read
Modes: "caller" = threads=1 (no team), "team" = the default team (threads=None).
Contended: a background process spinning on one core (started and ended by this bench, by its pid).

    python bench/bench_small_moves.py [--reps 30] [--hidden 8 64 512] [--no-contended]
    (MASKPACK_TEAM_MIN_BYTES=<bytes> moves the threshold, e.g. 0: every move on the team)

Measured on the device machine's CPU (16 cores, `taskset -c 0,1`: two of them; torch 2.11, OpenMP pool;
load 0.9-1.1 before the spinner), median of 25, ms:

    MASKPACK_TEAM_MIN_BYTES=0 (every move on the pool; what the threshold replaced)
    case              bytes  idle caller  idle team  cont caller  cont team
    shard_ids         65536      0.044      0.051      0.200      7.971
    shard_h64       2097152      0.267      0.163      0.475      7.968
    shard_h512     16777216      1.383      0.791      2.138      7.726
    shard_h2048    67108864      7.952      6.593     14.729     11.712
    bundle_cp2       393216      0.675      0.692      0.717     39.948
    default (64 MiB)
    shard_ids         65536      0.021      0.024      0.040      0.045
    shard_h8         262144      0.034      0.035      0.090      0.099
    shard_h512     16777216      1.077      1.098      1.283      1.266
    shard_h2048    67108864      4.412      2.401     10.223      9.531
    bundle_cp2       393216      0.373      0.391      0.419      0.479

Contended, the team column now follows the caller column below 64 MiB (the caller itself shares its core
with the spinner and torch's spinning OpenMP threads: up to 2.6x its idle time for the 30-90 us moves).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

import maskpack
from maskpack import _runtime


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def cases(hidden):
    gen = torch.Generator().manual_seed(0)
    T = 16384
    lengths = [2048] * 8
    lay = maskpack.Layout.from_lengths(lengths, placement="packed")
    pad = maskpack.Layout.from_lengths(lengths, placement="right")
    ids = torch.randint(0, 1000, (T,), generator=gen)
    out = {"shard_ids": (lambda th: lay.shard(ids, 2, 0, threads=th), ids.numel() * 8 // 2)}
    for H in hidden:
        x = torch.randn(T, H, generator=gen)
        out[f"shard_h{H}"] = (lambda th, x=x: lay.shard(x, 2, 0, threads=th), x.numel() * 4 // 2)
        out[f"unpack_h{H}"] = (lambda th, x=x: pad.unpack(x, threads=th), x.numel() * 4)
    T2 = 32768
    row = torch.randint(0, 1000, (1, T2), generator=gen)
    pos = torch.cat([torch.arange(n) for n in [4096] * 8])[None]

    def bundle(th):
        saved = _runtime.default_override
        _runtime.default_override = 1 if th == 1 else saved
        try:
            b = maskpack.prepare_batch({"input_ids": row, "position_ids": pos, "labels": row}, padding_free=True,
                                       cp=2, cp_rank=0)
            for name in ("input_ids", "labels", "shift_labels", "loss_weights", "position_ids", "cu_seqlens",
                         "last_token_index"):
                getattr(b, name)
        finally:
            _runtime.default_override = saved

    out["bundle_cp2"] = (bundle, row.numel() * 8 * 3 // 2)
    return out


def timed(fn, th) -> float:
    t = time.perf_counter()
    fn(th)
    return time.perf_counter() - t


def run(all_cases, reps):
    res = {}
    for name, (fn, nbytes) in all_cases.items():
        for th in (1, None):
            fn(th)  # warm: plans, caches, the team
        caller, team = [], []
        for i in range(reps):
            torch.randn(256, 256) @ torch.randn(256, 256)  # a torch operator just before, as in a step
            if i % 2:
                caller.append(timed(fn, 1))
                team.append(timed(fn, None))
            else:
                team.append(timed(fn, None))
                caller.append(timed(fn, 1))
        res[name] = (nbytes, statistics.median(caller) * 1e3, statistics.median(team) * 1e3)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--hidden", type=int, nargs="*", default=[8, 64, 512])
    ap.add_argument("--no-contended", action="store_true")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, "
          f"pool {_runtime.team_pool(2)}, "
          f"MASKPACK_TEAM_MIN_BYTES {os.environ.get('MASKPACK_TEAM_MIN_BYTES', '(default)')}")
    all_cases = cases(a.hidden)
    print(f"idle      load {load()}")
    idle = run(all_cases, a.reps)
    cont = None
    if not a.no_contended:
        spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.5)
            print(f"contended load {load()} (spinner pid {spin.pid})")
            cont = run(all_cases, a.reps)
        finally:
            spin.kill()
            spin.wait()
    print(f"{'case':12s} {'bytes':>10s} {'idle caller':>12s} {'idle team':>10s} {'cont caller':>12s} "
          f"{'cont team':>10s} {'cont/idle (default)':>20s}")
    for name, (nbytes, c, t) in idle.items():
        row = f"{name:12s} {nbytes:10d} {c:10.3f}ms {t:8.3f}ms"
        if cont:
            _, cc, ct = cont[name]
            row += f" {cc:10.3f}ms {ct:8.3f}ms {ct / t:19.2f}x"
        print(row)


if __name__ == "__main__":
    main()
