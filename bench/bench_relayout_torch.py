"""bench_relayout_torch.py: pack, unpack and CP shard through maskpack against the same moves written
with torch indexing (index_select / index_put_) and against a plain copy of the same bytes, all in one
run, 2 threads each, for an L2-sized and a DRAM-sized per-token tensor (bench/shapes.json's table
"relayout", the one bench_relayout.c is built with). Prints medians and ratios.

    .venv/bin/python bench/bench_relayout_torch.py [--cases LABEL:BxSxC[,LABEL:BxSxC...]]
"""

import argparse
import os
import statistics
import time

import numpy as np
import torch

import maskpack

import bench_shapes  # the shapes' defaults: bench/shapes.json (bench/ is this script's folder)

torch.set_num_threads(2)
REPS = 15


def load() -> str:
    try:
        return "load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "load average unknown"


# Both libraries keep their worker threads spinning for a while after a call (torch's OpenMP team for
# milliseconds), and on 2 cores a spinning team of one library takes the core the other's team needs.
# Each block of repetitions therefore starts after an idle pause, so it measures that operation alone;
# the interleaved line below measures the two called in alternation, as in a training step.
IDLE_S = 0.05


def reps_for(B, S, C):
    """Repetitions behind a median: many for a move that fits in L2 (microseconds each, noisy), fewer for
    one through DRAM (a padded tensor of 16 MiB or more; the 101 and 15 of the two cases before the shapes
    moved to shapes.json)."""
    return 101 if B * S * C * 2 < 1 << 24 else 15


def cases(text):
    """An argparse type: "LABEL:BxSxC[,LABEL:BxSxC...]" -> [(label, B, S, C), ...], each dimension >= 1."""
    out = []
    for item in text.split(","):
        label, _, dims = item.partition(":")
        parts = dims.split("x")
        if not label or len(parts) != 3 or not all(p.isdigit() and int(p) >= 1 for p in parts):
            raise argparse.ArgumentTypeError(f"expected LABEL:BxSxC[,LABEL:BxSxC...] with B, S, C >= 1, got {text!r}")
        out.append((label, *map(int, parts)))
    return out


def median_time(fn, reps=None):
    reps = reps or REPS
    time.sleep(IDLE_S)
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        a = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - a)
    return statistics.median(ts)


def case(label, B, S, C, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(S // 2, S + 1, size=B)
    mask = torch.as_tensor(np.arange(S)[None, :] < lengths[:, None])
    lay = maskpack.Layout.from_mask2d(mask, convention="keep")
    packed_lay = lay.packed_of()
    shard_lay = packed_lay.cp_shard(2, 0)
    x = torch.randn(B, S, C, dtype=torch.bfloat16)
    T = int(lengths.sum())
    idx = torch.as_tensor(np.asarray(lay.valid_indices()))
    gidx = torch.as_tensor(np.asarray(packed_lay.cp_shard_indices(2, 0)))  # into the aligned packed stream
    aligned = packed_lay.pad_to_multiple(maskpack.cp_multiple(2))
    # the aligned stream position of every real token, for the torch version of "padded -> shard"
    pos_in_aligned = torch.as_tensor(np.asarray(maskpack.relayout(np.arange(T, dtype=np.int64), packed_lay, aligned,
                                                                  pad_value=-1)))
    flat = x.reshape(B * S, C)
    packed = torch.empty(T, C, dtype=x.dtype)
    padded_out = torch.empty(B, S, C, dtype=x.dtype)
    shard_out = torch.empty(shard_lay.q_width, C, dtype=x.dtype)
    src_of_shard = pos_in_aligned[gidx].clamp(min=0)  # shard token -> packed token (pads read token 0)
    shard_valid = (pos_in_aligned[gidx] >= 0).unsqueeze(1)
    packed_ref = flat.index_select(0, idx)

    def copy_bytes(n_tokens):
        dst = torch.empty(n_tokens, C, dtype=x.dtype)
        src = flat[:n_tokens]
        return lambda: dst.copy_(src)

    ops = [
        ("pack   (padded -> packed)", T,
         lambda: lay.pack(x, out=packed),
         lambda: torch.index_select(flat, 0, idx, out=packed)),
        ("unpack (packed -> padded)", B * S,
         lambda: lay.unpack(packed_ref, out=padded_out),
         lambda: padded_out.view(B * S, C).zero_().index_put_((idx,), packed_ref)),
        ("shard  (padded -> CP rank 0/2 of packed)", shard_lay.q_width,
         lambda: maskpack.relayout(x, lay, shard_lay, out=shard_out),
         lambda: torch.mul(torch.index_select(packed_ref, 0, src_of_shard), shard_valid, out=shard_out)),
    ]
    print(f"{label}: [{B} x {S}] x {C} bf16 ({B * S * C * 2 / 1e6:.1f} MB padded, {T} real tokens), 2 threads")
    for name, n_tok, ours, theirs in ops:
        nbytes = n_tok * C * 2
        t_copy = median_time(copy_bytes(n_tok))
        t_ours = median_time(ours)
        t_torch = median_time(theirs)
        print(f"  {name:44s} maskpack {nbytes / t_ours / 1e9:6.2f} GB/s  copy {nbytes / t_copy / 1e9:6.2f} GB/s "
              f"({t_copy / t_ours:.2f}x, target >= 0.8x)  torch indexing {nbytes / t_torch / 1e9:6.2f} GB/s "
              f"-> {t_torch / t_ours:.2f}x faster (target >= 1.5x)")
    # pack and torch's index_select called in alternation (each call right after the other library's)
    pack_ours, pack_torch = ops[0][2], ops[0][3]
    time.sleep(IDLE_S)
    t_o, t_t = [], []
    for _ in range(REPS):
        a = time.perf_counter()
        pack_ours()
        b = time.perf_counter()
        pack_torch()
        t_o.append(b - a)
        t_t.append(time.perf_counter() - b)
    m_o, m_t = statistics.median(t_o), statistics.median(t_t)
    print(f"  {'pack, alternating with torch call by call':44s} maskpack {T * C * 2 / m_o / 1e9:6.2f} GB/s  "
          f"torch indexing {T * C * 2 / m_t / 1e9:6.2f} GB/s -> {m_t / m_o:.2f}x faster")
    # the results agree
    assert torch.equal(lay.pack(x), packed_ref)


def main():
    """Every case of --cases, in order."""
    global REPS
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=cases, help="LABEL:BxSxC,...: padded [B x S] x C bf16 tensors")
    bench_shapes.apply(ap, 'bench_relayout_torch', table=True)
    a = ap.parse_args()
    print(f"maskpack {maskpack.__version__} relayout vs torch {torch.__version__} (medians; {load()})")
    for label, B, S, C in a.cases:
        REPS = reps_for(B, S, C)
        case(label, B, S, C)
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
