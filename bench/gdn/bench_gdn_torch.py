"""bench_gdn_torch.py: maskpack's gated delta rule against transformers' torch fallback, same run.

T = 4096 tokens in 8 segments of 512, H = 16 key heads, HV = 32 value heads, K = V = 128 (bench/shapes.json's
table "gdn", the one bench_gdn.c is built with; each an option), float32 or bfloat16 (--dtype: every input in it,
as a bf16 model hands them over), 2 threads (torch.set_num_threads and maskpack's n_threads). transformers' torch_chunk_gated_delta_rule
takes no cu_seqlens, so it runs the 8 equal segments as a batch [8, 512, ...]: the same work, the
same result. Forward: maskpack.gated_delta_rule (L2 norm in the kernel) vs torch_chunk_gated_delta_rule
(use_qk_l2norm_in_kernel=True, output_final_state=True). Backward: maskpack's C backward (through
its autograd Function) vs torch autograd through the fallback, both for loss = sum(o * dO) + sum(S * dS).
Targets: forward >= 10x, backward >= 5x (in either dtype: transformers' fallback widens bf16 to
float32 itself; maskpack runs what gdn_isa(dtype) names, or --isa). Prints medians, the machine's load and the speedups. The
two sides alternate run by run (the machine is shared: a busy moment then hits both), and the
median of the per-pair ratios is printed next to the ratio of the medians.

    .venv/bin/python bench/gdn/bench_gdn_torch.py [--runs 7] [--threads 2] [--dtype float32|bfloat16] [--isa ISA]
                                                  [--tokens T] [--segments N]
                                                  [--heads H] [--value-heads HV] [--key-dim K] [--value-dim V]
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: bench_shapes
import bench_shapes  # noqa: E402  (the shapes' defaults: bench/shapes.json)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)  # medians of a shared, noisy machine need a few runs
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="of every input")
    ap.add_argument("--isa", default=None, help="maskpack's kernel family (default: what AUTO runs)")
    ap.add_argument("--tokens", type=bench_shapes.integer(1, 1 << 20), help="T, in --segments equal segments")
    ap.add_argument("--segments", type=bench_shapes.integer(1, 4096))
    ap.add_argument("--heads", type=bench_shapes.integer(1, 256), help="H, key heads")
    ap.add_argument("--value-heads", type=bench_shapes.integer(1, 256), help="HV, a multiple of H")
    ap.add_argument("--key-dim", type=bench_shapes.integer(1, 1024))
    ap.add_argument("--value-dim", type=bench_shapes.integer(1, 1024))
    bench_shapes.apply(ap, 'bench_gdn_torch', table=True)
    args = ap.parse_args()
    # equal segments (the fallback runs them as a batch), and whole groups of value heads
    if args.tokens % args.segments:
        ap.error(f"argument --segments: {args.tokens} tokens do not split into {args.segments} equal segments")
    if args.value_heads % args.heads:
        ap.error(f"argument --value-heads: {args.value_heads} is not a multiple of --heads {args.heads}")
    torch.set_num_threads(args.threads)

    import maskpack
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    NSEG, H, HV, K, V = args.segments, args.heads, args.value_heads, args.key_dim, args.value_dim
    L = args.tokens // NSEG
    T = NSEG * L
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(NSEG, L, H, K, generator=gen)
    k = torch.randn(NSEG, L, H, K, generator=gen)
    v = torch.randn(NSEG, L, HV, V, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(NSEG, L, HV, generator=gen)) * 0.5
    beta = torch.sigmoid(torch.randn(NSEG, L, HV, generator=gen))
    dO = torch.randn(NSEG, L, HV, V, generator=gen)
    dS = torch.randn(NSEG, HV, K, V, generator=gen)
    dt = getattr(torch, args.dtype)
    q, k, v, g, beta, dO, dS = (x.to(dt) for x in (q, k, v, g, beta, dO, dS))
    layout = maskpack.Layout.from_lengths([L] * NSEG, placement="packed")
    flat = [x.reshape(T, *x.shape[2:]) for x in (q, k, v, g, beta)]
    dO_flat = dO.reshape(T, HV, V)

    def load():
        try:
            return os.getloadavg()
        except OSError:
            return (float("nan"),) * 3

    print(f"bench_gdn_torch: T {T} in {NSEG} segments, H {H}, HV {HV}, K {K}, V {V}, threads {args.threads}, "
          f"{args.dtype}, isa {args.isa or maskpack.gdn_isa(args.dtype)}, load average before {load()[0]:.2f} {load()[1]:.2f} {load()[2]:.2f}")

    def timed(fn, runs):
        ts = []
        out = None
        for _ in range(runs):
            t0 = time.perf_counter()
            out = fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts), out

    def paired(fn_ours, fn_hf, runs):
        """Alternates the two (ours first) so both see the same moments of a shared machine; returns
        the medians, the median of the per-pair ratios hf / ours and the last outputs."""
        to, th, ratios = [], [], []
        out_o = out_h = None
        for _ in range(runs):
            t0 = time.perf_counter()
            out_o = fn_ours()
            t1 = time.perf_counter()
            out_h = fn_hf()
            t2 = time.perf_counter()
            to.append(t1 - t0)
            th.append(t2 - t1)
            ratios.append((t2 - t1) / (t1 - t0))
        spread["fwd"] = (min(to), max(to), min(th), max(th), min(ratios), max(ratios))
        return statistics.median(to), statistics.median(th), statistics.median(ratios), out_o, out_h

    spread = {}

    def print_spread(key):
        """The range of the runs behind a line: on a shared machine the two sides do not slow down
        alike (the fallback's many allocations and small ops swing more than our compute-bound
        kernel), so the ratio moves with the machine's phase; the range shows by how much."""
        a0, a1, b0, b1, r0, r1 = spread[key]
        print(f"          range over the runs: maskpack {a0 * 1e3:.1f}-{a1 * 1e3:.1f} ms, transformers "
              f"{b0 * 1e3:.1f}-{b1 * 1e3:.1f} ms, per-pair speedup {r0:.1f}-{r1:.1f}x")

    # ---- forward ---------------------------------------------------------------------------
    with torch.no_grad():
        ours_fwd = lambda: maskpack.gated_delta_rule(*flat, layout, threads=args.threads, isa=args.isa)
        hf_fwd = lambda: torch_chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
                                                      use_qk_l2norm_in_kernel=True)
        timed(ours_fwd, 2)  # warm-up
        t_ours, t_hf, fwd_pair, (o_ours, s_ours), (o_hf, s_hf) = paired(ours_fwd, hf_fwd, args.runs)
    o_ours, o_hf, s_ours, s_hf = (x.float() for x in (o_ours, o_hf, s_ours, s_hf))
    err = ((o_ours.reshape(o_hf.shape) - o_hf).abs().max() / o_hf.abs().max()).item()
    err_s = ((s_ours - s_hf).abs().max() / s_hf.abs().max()).item()
    fwd = t_hf / t_ours
    print(f"forward : maskpack {t_ours * 1e3:9.1f} ms   transformers {t_hf * 1e3:9.1f} ms   speedup {fwd:6.1f}x "
          f"(median of paired runs {fwd_pair:.1f}x; target >= 10x: {'met' if fwd >= 10 else 'NOT met'})   "
          f"max rel diff o {err:.1e}, state {err_s:.1e}")
    print_spread("fwd")

    # ---- backward --------------------------------------------------------------------------
    def ours_bwd():
        leaves = [x.clone().requires_grad_(True) for x in flat]
        o, s = maskpack.gated_delta_rule(*leaves, layout, threads=args.threads, isa=args.isa)
        loss = (o * dO_flat).sum() + (s * dS).sum()
        t0 = time.perf_counter()
        loss.backward()
        return time.perf_counter() - t0, [x.grad for x in leaves]

    def hf_bwd():
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta)]
        o, s = torch_chunk_gated_delta_rule(*leaves, output_final_state=True, use_qk_l2norm_in_kernel=True)
        loss = (o * dO).sum() + (s * dS).sum()
        t0 = time.perf_counter()
        loss.backward()
        return time.perf_counter() - t0, [x.grad for x in leaves]

    tb_ours, tb_hf, tb_ratio = [], [], []
    gr_ours = gr_hf = None
    ours_bwd()  # warm-up
    for _ in range(args.runs):  # alternated, as for the forward
        t, gr_ours = ours_bwd()
        tb_ours.append(t)
        t2, gr_hf = hf_bwd()
        tb_hf.append(t2)
        tb_ratio.append(t2 / t)
    tb_o, tb_h = statistics.median(tb_ours), statistics.median(tb_hf)
    spread["bwd"] = (min(tb_ours), max(tb_ours), min(tb_hf), max(tb_hf), min(tb_ratio), max(tb_ratio))
    gerr = max(((a.float().reshape(b.shape) - b.float()).abs().max() / b.float().abs().max()).item()
               for a, b in zip(gr_ours, gr_hf))
    bwd = tb_h / tb_o
    print(f"backward: maskpack {tb_o * 1e3:9.1f} ms   transformers {tb_h * 1e3:9.1f} ms   speedup {bwd:6.1f}x "
          f"(median of paired runs {statistics.median(tb_ratio):.1f}x; target >= 5x: {'met' if bwd >= 5 else 'NOT met'})"
          f"   max rel diff of the gradients {gerr:.1e}")
    print_spread("bwd")
    print(f"load average after {load()[0]:.2f} {load()[1]:.2f} {load()[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
