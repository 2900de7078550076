"""bench_moves_autograd.py: the moves of a training step (pack and unpack of a bf16 padded batch) on
both engines, with and without autograd recording, and their backward, against the torch indexing a
user would write for the same move (flash-attn's index_select / index_put_) and a memcpy of the same
bytes. Pairs alternate (ours, baseline) in one process; each figure is the median of the per-pair
ratios. Targets (issue 17): torch engine within 1.2x of torch indexing; C engine >= 1.5x torch
indexing and >= 0.8x memcpy, recording or not; backward within 1.2x of the forward.

    .venv/bin/python bench/bench_moves_autograd.py [--pairs N]"""

import argparse
import ctypes
import os
import statistics
import time

import numpy as np
import torch

import maskpack

torch.set_num_threads(2)


def load() -> str:
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def timed(fn) -> float:
    a = time.perf_counter()
    fn()
    return time.perf_counter() - a


def pairs(ours, base, n):
    """Alternates ours and the baseline n times (after one warm-up of each): per-pair ratios
    base/ours (> 1: ours faster) and both sides' medians."""
    ours(), base()
    to, tb = [], []
    for _ in range(n):
        to.append(timed(ours))
        tb.append(timed(base))
    ratios = [b / o for o, b in zip(to, tb)]
    return statistics.median(ratios), statistics.median(to), statistics.median(tb)


def line(name, r, to, tb, target=None, met=None):
    verdict = "" if target is None else f"   target {target}: {'met' if met else 'NOT met'}"
    print(f"  {name:<46s} ours {to * 1e3:8.3f} ms  base {tb * 1e3:8.3f} ms  speed ratio {r:5.2f}x{verdict}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--S", type=int, default=2048)
    ap.add_argument("--H", type=int, default=1024)
    import bench_shapes  # the defaults are bench/shapes.json's arguments for this program

    bench_shapes.apply(ap, 'bench_moves_autograd')
    a = ap.parse_args()
    B, S, H = a.B, a.S, a.H
    rng = np.random.default_rng(0)
    lengths = rng.integers(S // 2, S + 1, size=B)
    mask = torch.as_tensor(np.arange(S)[None, :] < lengths[:, None])
    lay = maskpack.Layout.from_mask2d(mask)
    T = int(lengths.sum())
    x = torch.randn(B, S, H, dtype=torch.bfloat16)
    packed = lay.pack(x)
    idx = torch.as_tensor(np.asarray(lay.valid_indices()))
    flat = x.reshape(B * S, H)
    nbytes = T * H * 2
    src = torch.empty(T, H, dtype=torch.bfloat16)
    dst = torch.empty(T, H, dtype=torch.bfloat16)
    src.copy_(packed)
    print(f"bench_moves_autograd: bf16 [{B}, {S}, {H}] padded, {T} real tokens ({T / (B * S):.0%}), "
          f"{nbytes / 2**20:.1f} MiB moved per pack; {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{args_pairs(a.pairs)}; {load()}")

    def torch_pack():
        return flat.index_select(0, idx)

    def torch_unpack():
        out = torch.zeros(B * S, H, dtype=x.dtype)
        out[idx] = packed
        return out.view(B, S, H)

    def memcpy():
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)

    print("forward, autograd off")
    r, to, tb = pairs(lambda: lay.pack(x, engine="torch"), torch_pack, a.pairs)
    line("pack, torch engine vs torch index_select", r, to, tb, ">= 1/1.2 = 0.83x", r >= 1 / 1.2)
    r, to, tb = pairs(lambda: lay.unpack(packed, engine="torch"), torch_unpack, a.pairs)
    line("unpack, torch engine vs torch index_put_", r, to, tb, ">= 0.83x", r >= 1 / 1.2)
    r, to, tb = pairs(lambda: lay.pack(x), torch_pack, a.pairs)
    line("pack, C engine vs torch index_select", r, to, tb, ">= 1.5x", r >= 1.5)
    r, to, tb = pairs(lambda: lay.unpack(packed), torch_unpack, a.pairs)
    line("unpack, C engine vs torch index_put_", r, to, tb, ">= 1.5x", r >= 1.5)
    r, to, tb = pairs(lambda: lay.pack(x), memcpy, a.pairs)
    line("pack, C engine vs memcpy of the packed bytes", r, to, tb, ">= 0.8x", r >= 0.8)

    print("forward, autograd recording (input requires grad)")
    xg = x.detach().requires_grad_()
    pg = packed.detach().requires_grad_()
    flat_g = xg.reshape(B * S, H)
    r, to, tb = pairs(lambda: lay.pack(xg), lambda: flat_g.index_select(0, idx), a.pairs)
    line("pack, C engine vs torch index_select", r, to, tb, ">= 1.5x", r >= 1.5)
    r, to, tb = pairs(lambda: lay.pack(xg), memcpy, a.pairs)
    line("pack, C engine vs memcpy", r, to, tb, ">= 0.8x", r >= 0.8)

    def torch_unpack_g():
        out = torch.zeros(B * S, H, dtype=x.dtype)
        return out.index_put((idx,), pg)

    r, to, tb = pairs(lambda: lay.unpack(pg), torch_unpack_g, a.pairs)
    line("unpack, C engine vs torch index_put", r, to, tb, ">= 1.5x", r >= 1.5)

    print("backward against forward (ratio forward / backward: >= 1/1.2 = 0.83 met)")
    g_packed = torch.randn(T, H, dtype=torch.bfloat16)
    g_padded = torch.randn(B, S, H, dtype=torch.bfloat16)
    for eng in ("c", "torch"):
        y = lay.pack(xg, engine=eng)
        r, to, tb = pairs(lambda: torch.autograd.grad(y, xg, g_packed, retain_graph=True),
                          lambda: lay.pack(x, engine=eng), a.pairs)
        line(f"pack backward vs pack forward ({eng})", r, to, tb, ">= 0.83", r >= 1 / 1.2)
        y = lay.unpack(pg, engine=eng)
        r, to, tb = pairs(lambda: torch.autograd.grad(y, pg, g_padded, retain_graph=True),
                          lambda: lay.unpack(packed, engine=eng), a.pairs)
        line(f"unpack backward vs unpack forward ({eng})", r, to, tb, ">= 0.83", r >= 1 / 1.2)
    print(f"  {load()}")
    print("  on an accelerator: not measurable here (no GPU); tools/device/check_moves_cuda.py measures it")


def args_pairs(n):
    return f"{n} alternating pairs, median of per-pair ratios"


if __name__ == "__main__":
    main()
