"""bench_train_step.py: whole training steps of a transformers Qwen3.5 causal LM (randomly initialised,
built from a config: no download), padding-free, its Gated DeltaNet layers through maskpack, with
maskpack's teams on torch's OpenMP pool (the default) against maskpack's own threads
(MASKPACK_THREAD_POOL=own).

The two alternate step by step in one process (which goes first alternating), on the same model and
batch; the figure is the median of the per-pair ratios own / openmp of the step time (forward,
backward and the optimizer step). The losses of both must agree (the pool changes no result).

    python bench/bench_train_step.py [--pairs 10] [--hidden 512] [--tokens 2048]
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

import maskpack


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=2048, help="real tokens in the batch (documents of 64 to 448)")
    import bench_shapes  # the defaults are bench/shapes.json's arguments for this program

    bench_shapes.apply(ap, 'bench_train_step')
    a = ap.parse_args()
    torch.manual_seed(0)
    h = a.hidden
    cfg = Qwen3_5TextConfig(hidden_size=h, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
                            linear_value_head_dim=64, linear_conv_kernel_dim=4, num_hidden_layers=4,
                            num_attention_heads=8, num_key_value_heads=2, head_dim=64, intermediate_size=2 * h,
                            vocab_size=4096, rms_norm_eps=1e-6)
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(cfg).train()
    assert maskpack.patch_linear_attention(model) == 3
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every step sees the same weights
    g = torch.Generator().manual_seed(1)
    lengths = []
    while sum(lengths) < a.tokens:
        lengths.append(int(torch.randint(64, 449, (1,), generator=g)))
    lengths[-1] -= sum(lengths) - a.tokens
    S = max(lengths)
    mask = torch.zeros(len(lengths), S, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    ids = torch.randint(1, cfg.vocab_size, mask.shape, generator=g) * mask
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.where(mask == 1, ids, -100)}

    def step():
        bundle = maskpack.prepare_batch(batch, backend="sdpa", padding_free=True)
        logits = model(**bundle.hf_kwargs()).logits
        logits = logits.reshape(-1, logits.shape[-1])
        per_token = F.cross_entropy(logits, bundle.shift_labels.reshape(-1), reduction="none")
        loss = (per_token * bundle.loss_weights.reshape(-1)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; Qwen3.5 hidden {h}, 4 layers (3 GDN), "
          f"{len(lengths)} documents, {a.tokens} tokens; load average at the start: {load()}")
    times = {"own": [], "openmp": []}
    losses = {"own": set(), "openmp": set()}
    ratios = []
    for p in range(-1, a.pairs):
        pair = {}
        for kind in (("own", "openmp") if p % 2 == 0 else ("openmp", "own")):
            os.environ["MASKPACK_THREAD_POOL"] = "own" if kind == "own" else "auto"
            t0 = time.perf_counter()
            loss = step()
            pair[kind] = time.perf_counter() - t0
            losses[kind].add(loss)
        if p >= 0:
            for kind in pair:
                times[kind].append(pair[kind])
            ratios.append(pair["own"] / pair["openmp"])
    os.environ.pop("MASKPACK_THREAD_POOL", None)
    m = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    same = losses["own"] == losses["openmp"] and len(losses["own"]) == 1
    print(f"training step: torch's OpenMP pool {m['openmp']:.1f} ms, maskpack's own threads {m['own']:.1f} ms: "
          f"{statistics.median(ratios):.2f}x (median of {a.pairs} pairs); losses {'identical' if same else 'DIFFER'}")
    print(f"load average at the end: {load()}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
