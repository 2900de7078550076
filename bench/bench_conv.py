"""bench_conv.py: maskpack's causal conv1d (silu) on bf16 tensors against the same kernel on f32 tensors and
against torch's conv1d in bf16 (what transformers' torch path runs: a grouped F.conv1d over the padded
batch with W - 1 zeros in front, then silu), forward and forward + backward.

The three run in one process on the same values (documents of equal length, so the padded batch
torch takes has no pad of its own), paired call by call with the order rotating from pair to pair;
each figure is the median over the pairs of the per-pair time ratio (below 1: maskpack bf16 faster).
The load average is printed at the start and the end (a shared machine stretches both sides alike
only when they alternate, as here).

    python bench/bench_conv.py [--pairs 10] [--tokens 4096] [--segments 8] [--channels 2048] [--width 4] [--threads N]
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

import maskpack


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--segments", type=int, default=8)
    ap.add_argument("--channels", type=int, default=2048)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None, help="torch and maskpack threads (default torch's)")
    import bench_shapes  # the defaults are bench/shapes.json's arguments for this program

    bench_shapes.apply(ap, 'bench_conv')
    a = ap.parse_args()
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    n, C, W = a.segments, a.channels, a.width
    S = a.tokens // n
    lengths = [S] * n
    g = torch.Generator().manual_seed(0)
    x32 = torch.randn(n * S, C, generator=g)
    w32 = 0.5 * torch.randn(C, 1, W, generator=g)
    dy32 = torch.randn(n * S, C, generator=g)
    lay = maskpack.Layout.from_lengths(lengths, placement="packed")
    x16, w16, dy16 = x32.bfloat16(), w32.bfloat16(), dy32.bfloat16()
    xt = x16.view(n, S, C).transpose(1, 2).contiguous()  # torch's [B, C, S]
    dyt = dy16.view(n, S, C).transpose(1, 2).contiguous()

    def mp(x, w, dy, backward):
        def run():
            if not backward:
                with torch.no_grad():
                    return maskpack.causal_conv1d(x, w, lay, "silu")[0]
            xl, wl = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
            y = maskpack.causal_conv1d(xl, wl, lay, "silu")[0]
            y.backward(dy)
            return xl.grad
        return run

    def torch_conv(backward):
        def run():
            if not backward:
                with torch.no_grad():
                    return F.silu(F.conv1d(xt, w16, padding=W - 1, groups=C)[..., :S])
            xl, wl = xt.detach().requires_grad_(True), w16.detach().requires_grad_(True)
            y = F.silu(F.conv1d(xl, wl, padding=W - 1, groups=C)[..., :S])
            y.backward(dyt)
            return xl.grad
        return run

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; causal conv1d + silu, {n} documents x {S} "
          f"tokens, C {C}, W {W}; MASKPACK_ISA={os.environ.get('MASKPACK_ISA', 'auto')}")
    print(f"load average at the start: {load()}")
    # agreement first: the bf16 call is the f32 kernel's result rounded, and torch's bf16 conv is near it
    y16, y32 = mp(x16, w16, None, False)(), mp(x16.float(), w16.float(), None, False)()
    yt = torch_conv(False)().transpose(1, 2).reshape(n * S, C)
    same = torch.equal(y16.view(torch.int16), y32.bfloat16().view(torch.int16))
    dev = float((yt.float() - y32).abs().max())
    print(f"bf16 output == f32 kernel's output rounded to bf16: {'yes' if same else 'NO'}; "
          f"max |torch bf16 - f32 kernel| {dev:.2e}")
    for backward in (False, True):
        names = ["mp_bf16", "mp_f32", "torch_bf16"]
        runs = {"mp_bf16": mp(x16, w16, dy16, backward), "mp_f32": mp(x32, w32, dy32, backward),
                "torch_bf16": torch_conv(backward)}
        times = {k: [] for k in names}
        r_f32, r_torch = [], []
        for p in range(-1, a.pairs):  # pair -1 warms up
            order = names[p % 3:] + names[:p % 3] if p >= 0 else names
            t = {}
            for k in order:
                t0 = time.perf_counter()
                runs[k]()
                t[k] = time.perf_counter() - t0
            if p >= 0:
                for k in names:
                    times[k].append(t[k])
                r_f32.append(t["mp_bf16"] / t["mp_f32"])
                r_torch.append(t["mp_bf16"] / t["torch_bf16"])
        m = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        what = "fwd+bwd" if backward else "fwd    "
        print(f"conv {what} bf16: maskpack bf16 {m['mp_bf16']:.2f} ms, maskpack f32 {m['mp_f32']:.2f} ms, "
              f"torch conv1d bf16 {m['torch_bf16']:.2f} ms; bf16/f32 {statistics.median(r_f32):.2f}x, "
              f"bf16/torch {statistics.median(r_torch):.2f}x (median of {a.pairs} per-pair ratios)")
    print(f"load average at the end: {load()}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
