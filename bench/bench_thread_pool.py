"""bench_thread_pool.py: maskpack's calls inside a training-like step, on torch's OpenMP pool (the
default once torch is imported) against a team of maskpack's own threads (MASKPACK_THREAD_POOL=own).

Each call is timed right after a torch operator, as in a layer: an element-wise one (SiLU over 4 MB,
ATen's own OpenMP loop, as norms, gates and activations run) and a projection (x @ w). torch's idle
OpenMP threads are then still spinning. Both pools live in one process and alternate pair by pair
(which goes first alternating); the figure is the median of the per-pair ratios own / openmp. As a control, the same calls back to back with no torch operator between
them: in blocks (50 ms of idleness so the other pool's threads stop spinning, 3 untimed calls, the
median of 10), the blocks alternating, the figure the median of the per-round ratios.

    python bench/bench_thread_pool.py [--pairs 30] [--threads 2]
"""
import argparse
import os
import statistics
import time

import torch

import maskpack


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def case_attention(docs, tokens, H=8, D=128):
    g = torch.Generator().manual_seed(0)
    T = docs * tokens
    lay = maskpack.Layout.from_lengths([tokens] * docs, placement="packed")
    q, k, v, do = (torch.randn(T, H, D, generator=g) for _ in range(4))
    state = {}

    def forward(threads):
        state["out"], state["lse"] = maskpack.attention(q, k, v, lay, threads=threads)

    def backward(threads):
        maskpack.attention_backward(do, q, k, v, state["out"], state["lse"], lay, threads=threads)

    forward(2)
    return f"attention {docs} x {tokens} tokens (H {H}, D {D})", T, [("forward", forward), ("backward", backward)]


def case_gdn(docs, tokens, H=8, HV=16, K=128, V=128):
    g = torch.Generator().manual_seed(1)
    T = docs * tokens
    lay = maskpack.Layout.from_lengths([tokens] * docs, placement="packed")
    q, k = (torch.randn(T, H, K, generator=g) for _ in range(2))
    v = torch.randn(T, HV, V, generator=g)
    gate, beta = -torch.rand(T, HV, generator=g), torch.rand(T, HV, generator=g)

    def forward(threads):
        maskpack.gated_delta_rule(q, k, v, gate, beta, lay, threads=threads)

    return f"gated delta rule {docs} x {tokens} tokens (H {H}, HV {HV}, K = V = {K})", T, [("forward", forward)]


def case_move(docs, tokens, C=2048):
    g = torch.Generator().manual_seed(2)
    lay = maskpack.Layout.from_lengths([tokens - 3 * i for i in range(docs)], placement="right")
    x = torch.randn(lay.n_rows, lay.q_width, C, generator=g)

    def pack(threads):
        lay.pack(x, threads=threads)

    return f"pack [{lay.n_rows}, {lay.q_width}, {C}] f32", lay.n_rows * lay.q_width, [("pack", pack)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cases", default="attention:4x64,attention:8x512,gdn:4x64,gdn:4x512,move:8x512",
                    help="comma-separated KIND:DOCSxTOKENS, KIND one of attention, gdn, move")
    import bench_shapes  # the defaults are bench/shapes.json's arguments for this program

    bench_shapes.apply(ap, 'bench_thread_pool')
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, maskpack threads={a.threads}; "
          f"load average at the start: {load()}")
    kinds = {"attention": case_attention, "gdn": case_gdn, "move": case_move}
    cases = []
    for item in a.cases.split(","):
        try:
            kind, shape = item.split(":")
            docs, tokens = (int(x) for x in shape.split("x"))
        except ValueError:
            ap.error(f"--cases: {item!r} is not KIND:DOCSxTOKENS")
        if kind not in kinds or docs < 1 or tokens < 4 * docs:
            ap.error(f"--cases: {item!r}: KIND one of {', '.join(kinds)}, DOCS >= 1, TOKENS >= 4 DOCS")
        cases.append((kinds[kind], docs, tokens))
    for case, docs, tokens in cases:
        name, T, calls = case(docs, tokens)
        x, w = torch.randn(max(T, 256), 1024), torch.randn(1024, 1024)
        e = torch.randn(1 << 20)
        for label, fn in calls:
            for what, before in (("an element-wise op", lambda: torch.nn.functional.silu(e)),
                                 ("a projection", lambda: x @ w)):
                times = {"own": [], "openmp": []}
                ratios = []
                for p in range(-2, a.pairs):
                    pair = {}
                    for kind in (("own", "openmp") if p % 2 == 0 else ("openmp", "own")):
                        os.environ["MASKPACK_THREAD_POOL"] = kind
                        before()
                        t0 = time.perf_counter()
                        fn(a.threads)
                        pair[kind] = time.perf_counter() - t0
                    if p >= 0:
                        for kind in pair:
                            times[kind].append(pair[kind])
                        ratios.append(pair["own"] / pair["openmp"])
                m = {k: statistics.median(v) * 1e6 for k, v in times.items()}
                print(f"{name}, {label} right after {what}: torch's OpenMP pool {m['openmp']:9.0f} us, "
                      f"maskpack's own threads {m['own']:9.0f} us: {statistics.median(ratios):.2f}x "
                      f"(median of {a.pairs} pairs)")
            times = {"own": [], "openmp": []}
            ratios = []
            rounds = max(3, a.pairs // 5)
            for r in range(rounds):
                block = {}
                for kind in (("own", "openmp") if r % 2 == 0 else ("openmp", "own")):
                    os.environ["MASKPACK_THREAD_POOL"] = kind
                    time.sleep(0.05)
                    for _ in range(3):
                        fn(a.threads)
                    ts = []
                    for _ in range(10):
                        t0 = time.perf_counter()
                        fn(a.threads)
                        ts.append(time.perf_counter() - t0)
                    block[kind] = statistics.median(ts)
                    times[kind].append(block[kind])
                ratios.append(block["own"] / block["openmp"])
            m = {k: statistics.median(v) * 1e6 for k, v in times.items()}
            print(f"{name}, {label} back to back (control): torch's OpenMP pool {m['openmp']:9.0f} us, "
                  f"maskpack's own threads {m['own']:9.0f} us: {statistics.median(ratios):.2f}x "
                  f"(median of {rounds} rounds)")
    os.environ.pop("MASKPACK_THREAD_POOL", None)
    print(f"load average at the end: {load()}")


if __name__ == "__main__":
    main()
