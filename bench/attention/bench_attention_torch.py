"""Torch baselines for bench_attention: torch 2.x CPU attention on the shapes bench_attention.c uses.

The shapes (--seq S tokens of one sequence, --heads H of --head-dim D, the --docs lengths packed for the
dense-mask measurement) default to bench/shapes.json's table "attention", the one bench_attention.c is
built with; in --serve mode bench_attention.c passes its own shape options, so both sides measure one.

Two modes, both on the same number of threads as our kernels (torch.set_num_threads):
- alone: prints one line per measurement, "name median_seconds", after --reps runs of each;
- --serve: bench_attention.c starts it as a co-process and asks for one run at a time, so its own
  runs and torch's alternate rep by rep and a busy moment of the shared machine hits both sides.
  Protocol (one line each way): it prints "ready"; for each line "name" it reads, it runs that
  measurement once (the first request of a name is preceded by one untimed warm-up run) and prints
  "name seconds"; an unknown name gets "name nan"; end of input ends it.
    .venv/bin/python bench/attention/bench_attention_torch.py [--threads 2] [--reps 5] [--quick] [--serve]
                                                              [--seq S] [--heads H] [--head-dim D] [--docs L,L,...]
Alone, it first prints the shape: "shape S=2048 H=8 D=128 docs=212,812,...".
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: bench_shapes
import bench_shapes  # noqa: E402  (the shapes' defaults: bench/shapes.json)


def packed_name(docs):
    """The dense-mask measurement's name, by the number of documents (bench_attention.c asks for it so)."""
    return f"sdpa_fwd_packed{len(docs)}_dense_mask"


def measurements(S, H, D, docs):
    """name -> a function running that measurement once (inputs built here, outside the timing)."""
    torch.manual_seed(0)
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

    # bf16 training: forward + backward on bf16 leaves (what a bf16 model's attention does)
    qh, kh, vh = (x.bfloat16().requires_grad_(True) for x in (q, k, v))
    douth = dout.bfloat16()

    def fwd_bwd_bf16(causal):
        def run():
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
            o.backward(douth)
            qh.grad = kh.grad = vh.grad = None

        return run

    # the documents packed into one stream, causal inside each: the dense block-diagonal mask
    T, n_docs = sum(docs), len(docs)
    seg = torch.repeat_interleave(torch.arange(n_docs), torch.tensor(docs))
    pos = torch.arange(T)
    mask = ((seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None]))[None, None]
    qp, kp, vp = (torch.randn(1, H, T, D) for _ in range(3))

    return {
        "sdpa_fwd_nomask": no_grad(lambda: F.scaled_dot_product_attention(q, k, v)),
        "sdpa_fwd_causal": no_grad(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        "sdpa_fwd_nomask_bf16": no_grad(lambda: F.scaled_dot_product_attention(qb, kb, vb)),
        "sdpa_fwd_bwd_nomask": fwd_bwd,
        "sdpa_fwd_bwd_nomask_bf16": fwd_bwd_bf16(False),
        "sdpa_fwd_bwd_causal_bf16": fwd_bwd_bf16(True),
        packed_name(docs): no_grad(lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)),
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
    ap.add_argument("--seq", type=bench_shapes.integer(1, 1 << 20), help="tokens of the one sequence")
    ap.add_argument("--heads", type=bench_shapes.integer(1, 1024))
    ap.add_argument("--head-dim", type=bench_shapes.integer(1, 1024))
    ap.add_argument("--docs", type=bench_shapes.integers(1, 1 << 20), help="the packed documents' lengths, L,L,...")
    bench_shapes.apply(ap, 'bench_attention_torch', table=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    runs = measurements(a.seq, a.heads, a.head_dim, a.docs)
    if a.serve:
        serve(runs)
        return
    reps = 2 if a.quick else a.reps
    print(f"shape S={a.seq} H={a.heads} D={a.head_dim} docs={','.join(map(str, a.docs))}", flush=True)
    print("torch_threads", torch.get_num_threads(), flush=True)
    for name, fn in runs.items():
        n = max(1, reps // 2) if name == packed_name(a.docs) else reps  # ~2 s per run
        fn()
        print(name, statistics.median(once(fn) for _ in range(n)), flush=True)


if __name__ == "__main__":
    main()
