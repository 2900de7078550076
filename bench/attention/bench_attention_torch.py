"""Torch baselines for bench_attention (run by it, or alone): torch 2.x CPU attention timings.

Prints one line per measurement, "name median_seconds", for the shapes bench_attention.c uses. Runs
torch on the same number of threads as our kernels (torch.set_num_threads). Usage:
    .venv/bin/python bench/attention/bench_attention_torch.py [--threads 2] [--reps 5] [--quick]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def timeit(fn, reps):
    fn()  # warm-up (and first-touch of the buffers)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


# 16 documents of 112..912 tokens summing to 8192 (the same list as bench_attention.c)
DOC_DELTAS = [-300, 300, -200, 200, -100, 100, 250, -250, 0, 0, 400, -400, -150, 150, 50, -50]


def doc_lengths():
    return [512 + d for d in DOC_DELTAS]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="smaller repetition counts")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    reps = 2 if a.quick else a.reps
    S, D, H = 2048, 128, 8
    q, k, v = (torch.randn(1, H, S, D) for _ in range(3))
    print("torch_threads", torch.get_num_threads(), flush=True)
    with torch.no_grad():
        t = timeit(lambda: F.scaled_dot_product_attention(q, k, v), reps)
        print("sdpa_fwd_nomask", t, flush=True)
        t = timeit(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps)
        print("sdpa_fwd_causal", t, flush=True)
        qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
        t = timeit(lambda: F.scaled_dot_product_attention(qb, kb, vb), reps)
        print("sdpa_fwd_nomask_bf16", t, flush=True)

    # forward + backward, fp32, no mask
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    dout = torch.randn(1, H, S, D)

    def fwd_bwd():
        o = F.scaled_dot_product_attention(qg, kg, vg)
        o.backward(dout)
        qg.grad = kg.grad = vg.grad = None

    t = timeit(fwd_bwd, reps)
    print("sdpa_fwd_bwd_nomask", t, flush=True)

    # 16 documents packed into 8192 tokens, causal inside each: the dense block-diagonal mask
    T, n_docs = 8192, 16
    lens = doc_lengths()
    assert sum(lens) == T and len(lens) == n_docs
    seg = torch.repeat_interleave(torch.arange(n_docs), torch.tensor(lens))
    pos = torch.arange(T)
    mask = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])
    qp, kp, vp = (torch.randn(1, H, T, D) for _ in range(3))
    with torch.no_grad():
        t = timeit(lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask[None, None]), max(1, reps // 2))
        print("sdpa_fwd_packed16_dense_mask", t, flush=True)


if __name__ == "__main__":
    main()
