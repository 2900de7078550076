"""Torch baselines for bench_attention: torch 2.x CPU attention on the shapes bench_attention.c uses.

Two modes, both on the same number of threads as our kernels (torch.set_num_threads):
- alone: prints one line per measurement, "name median_seconds", after --reps runs of each;
- --serve: bench_attention.c starts it as a co-process and asks for one run at a time, so its own
  runs and torch's alternate rep by rep and a busy moment of the shared machine hits both sides.
  Protocol (one line each way): it prints "ready"; for each line "name" it reads, it runs that
  measurement once (the first request of a name is preceded by one untimed warm-up run) and prints
  "name seconds"; an unknown name gets "name nan"; end of input ends it.
    .venv/bin/python bench/attention/bench_attention_torch.py [--threads 2] [--reps 5] [--quick] [--serve]
"""

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# 16 documents of 112..912 tokens summing to 8192 (the same list as bench_attention.c)
DOC_DELTAS = [-300, 300, -200, 200, -100, 100, 250, -250, 0, 0, 400, -400, -150, 150, 50, -50]


def doc_lengths():
    return [512 + d for d in DOC_DELTAS]


def measurements():
    """name -> a function running that measurement once (inputs built here, outside the timing)."""
    torch.manual_seed(0)
    S, D, H = 2048, 128, 8
    q, k, v = (torch.randn(1, H, S, D) for _ in range(3))
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    dout = torch.randn(1, H, S, D)

    def no_grad(fn):
        def run():
            with torch.no_grad():
                fn()

        return run

    def fwd_bwd():
        o = F.scaled_dot_product_attention(qg, kg, vg)
        o.backward(dout)
        qg.grad = kg.grad = vg.grad = None

    # 16 documents packed into 8192 tokens, causal inside each: the dense block-diagonal mask
    T, n_docs = 8192, 16
    lens = doc_lengths()
    assert sum(lens) == T and len(lens) == n_docs
    seg = torch.repeat_interleave(torch.arange(n_docs), torch.tensor(lens))
    pos = torch.arange(T)
    mask = ((seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None]))[None, None]
    qp, kp, vp = (torch.randn(1, H, T, D) for _ in range(3))

    return {
        "sdpa_fwd_nomask": no_grad(lambda: F.scaled_dot_product_attention(q, k, v)),
        "sdpa_fwd_causal": no_grad(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        "sdpa_fwd_nomask_bf16": no_grad(lambda: F.scaled_dot_product_attention(qb, kb, vb)),
        "sdpa_fwd_bwd_nomask": fwd_bwd,
        "sdpa_fwd_packed16_dense_mask": no_grad(lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)),
    }


def once(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def serve(runs):
    warmed = set()
    print("ready", flush=True)
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        fn = runs.get(name)
        if fn is None:
            print(name, "nan", flush=True)
            continue
        if name not in warmed:
            fn()  # warm-up (and first touch of the buffers), untimed
            warmed.add(name)
        print(name, once(fn), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="smaller repetition counts")
    ap.add_argument("--serve", action="store_true", help="answer one-run requests on stdin (see above)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    runs = measurements()
    if a.serve:
        serve(runs)
        return
    reps = 2 if a.quick else a.reps
    print("torch_threads", torch.get_num_threads(), flush=True)
    for name, fn in runs.items():
        n = max(1, reps // 2) if "packed16" in name else reps  # ~2 s per run
        fn()
        print(name, statistics.median(once(fn) for _ in range(n)), flush=True)


if __name__ == "__main__":
    main()
