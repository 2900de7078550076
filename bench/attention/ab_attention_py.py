"""ab_attention_py.py: maskpack.attention (forward and backward, torch tensors) of two installed
builds of the package, paired in one process: BEFORE_DIR holds a copy of the before-package renamed
``maskpack_before`` (its modules import each other relatively, so it loads beside ``maskpack``);
the calls alternate iteration by iteration, which goes first alternating.

    PYTHONPATH=<after install>:<BEFORE_DIR> python bench/attention/ab_attention_py.py [threads] [iters]
        [docs tokens H D] [--after-projection] [--after-elementwise]

-> the medians of both and of the per-iteration ratio before / after (f32, packed, causal).
--after-projection times each call right after a torch projection (x @ w, as a layer runs before
its attention), --after-elementwise right after SiLU over 4 MB (ATen's own OpenMP loop, as norms and
gates run): torch's OpenMP threads are then still spinning, as in a training step."""
import statistics
import sys
import time

import torch

import maskpack
import maskpack_before

after_projection = "--after-projection" in sys.argv
after_elementwise = "--after-elementwise" in sys.argv
for flag in ("--after-projection", "--after-elementwise"):
    if flag in sys.argv:
        sys.argv.remove(flag)
threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 200
docs, tokens, H, D = (int(x) for x in sys.argv[3:7]) if len(sys.argv) > 6 else (4, 64, 8, 128)
torch.manual_seed(0)
T = docs * tokens
q, k, v, dout = (torch.randn(T, H, D) for _ in range(4))
px, pw = torch.randn(max(T, 256), 1024), torch.randn(1024, 1024)  # the projection (--after-projection)
pe = torch.randn(1 << 20)  # an element-wise op's input (--after-elementwise: SiLU over 4 MB)


def before_call():
    if after_projection:
        px @ pw
    if after_elementwise:
        torch.nn.functional.silu(pe)


mods = (maskpack_before, maskpack)
lays = [m.Layout.from_lengths([tokens] * docs, placement="packed") for m in mods]
fwd = {0: [], 1: []}
bwd = {0: [], 1: []}
for it in range(-5, iters):
    for side in range(2):
        w = side if it % 2 == 0 else 1 - side
        m, lay = mods[w], lays[w]
        before_call()
        t0 = time.perf_counter()
        out, lse = m.attention(q, k, v, lay, threads=threads)
        t1 = time.perf_counter()
        before_call()
        t1b = time.perf_counter()
        m.attention_backward(dout, q, k, v, out, lse, lay, threads=threads)
        t2 = time.perf_counter()
        if it >= 0:
            fwd[w].append(t1 - t0)
            bwd[w].append(t2 - t1b)
med = statistics.median
rf = med(b / a for b, a in zip(fwd[0], fwd[1]))
rb = med(b / a for b, a in zip(bwd[0], bwd[1]))
print(f"python {docs} x {tokens} tokens, H {H}, D {D}, causal, threads {threads}"
      f"{', each right after a torch projection' if after_projection else ''}"
      f"{', each right after an element-wise torch op' if after_elementwise else ''}: forward before "
      f"{med(fwd[0]) * 1e6:.0f} us, after {med(fwd[1]) * 1e6:.0f} us, paired ratio {rf:.3f}; backward before "
      f"{med(bwd[0]) * 1e6:.0f} us, after {med(bwd[1]) * 1e6:.0f} us, ratio {rb:.3f}")
