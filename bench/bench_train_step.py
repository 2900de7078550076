"""bench_train_step.py: whole training steps of a transformers Qwen3.5 causal LM (randomly initialised,
built from a config: no download), padding-free, its Gated DeltaNet layers through maskpack, with
maskpack's teams on torch's OpenMP pool (the default) against maskpack's own threads
(MASKPACK_THREAD_POOL=own).

The two alternate step by step in one process (which goes first alternating), on the same model and
batch; the figure is the median of the per-pair ratios own / openmp of the step time (forward,
backward and the optimizer step). The losses of both must agree (the pool changes no result).

--compare hf: the padding-free step through maskpack (maskpack.hf.prepare_model: attention and the Gated
DeltaNet layers on maskpack's kernels, one packed row) against transformers' own padded step (its SDPA
attention with the 2D mask, its torch GDN path) on copies of one model, both in --dtype (bf16:
model.to(torch.bfloat16), the kernels taking bf16 tensors), alternating step by step in one process;
the figure is the median of the per-pair ratios maskpack / transformers of the step time. The per-token
losses (float32 cross-entropy of each side's logits, matched token by token) must agree within a
tolerance stated in the output: f32 1e-3; bf16 1.5 % of the mean loss, since in bf16 every activation
of either side is rounded to 8 significant bits (2^-9 relative), in different orders, through every
layer (measured: 0.3 % at the defaults), while a wrong token or shifted label moves a loss by units.

    python bench/bench_train_step.py [--pairs 10] [--hidden 512] [--tokens 2048]
    python bench/bench_train_step.py --compare hf --dtype bf16 [--pairs 6] [--hidden 256] [--tokens 1024]
"""
import copy
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

import maskpack
import maskpack.hf


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
    ap.add_argument("--compare", choices=["pool", "hf"], default="pool",
                    help="pool: maskpack's own threads vs torch's OpenMP pool (the default); hf: maskpack's padding-free "
                         "step vs transformers' padded one")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32", help="the model's dtype (--compare hf)")
    import bench_shapes  # the defaults are bench/shapes.json's arguments for this program

    bench_shapes.apply(ap, 'bench_train_step')
    a = ap.parse_args()
    if a.compare == "pool" and a.dtype != "f32":
        raise SystemExit("--dtype: the pool comparison runs f32 only (use --compare hf for bf16)")
    torch.manual_seed(0)
    h = a.hidden
    cfg = Qwen3_5TextConfig(hidden_size=h, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
                            linear_value_head_dim=64, linear_conv_kernel_dim=4, num_hidden_layers=4,
                            num_attention_heads=8, num_key_value_heads=2, head_dim=64, intermediate_size=2 * h,
                            vocab_size=4096, rms_norm_eps=1e-6)
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(cfg).train()
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
    if a.compare == "hf":
        return compare_hf(a, model, batch, lengths)
    assert maskpack.patch_linear_attention(model) == 3
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every step sees the same weights

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


# (args, model, padded batch, document lengths) -> exit status: maskpack's padding-free step against
# transformers' padded one, both in a.dtype, paired step by step
def compare_hf(a, model, batch, lengths):
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    hf = copy.deepcopy(model).to(dt)  # transformers' own: never prepared
    mp = maskpack.hf.prepare_model(copy.deepcopy(model).to(dt))
    opts = {"hf": torch.optim.SGD(hf.parameters(), lr=0.0), "mp": torch.optim.SGD(mp.parameters(), lr=0.0)}
    labels = batch["labels"]
    # the loss weights of transformers' mean: every real token with a next token in its document
    n_pred = sum(n - 1 for n in lengths)

    def hf_step():
        logits = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        per = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                              reduction="none", ignore_index=-100).view(len(lengths), -1)
        loss = per.sum() / n_pred
        return loss, [per[b, :n - 1].detach() for b, n in enumerate(lengths)]

    def mp_step():
        bundle = maskpack.prepare_batch(batch, backend="sdpa", padding_free=True)
        logits = mp(**bundle.hf_kwargs()).logits
        per = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), bundle.shift_labels.reshape(-1),
                              reduction="none", ignore_index=-100)
        loss = (per * bundle.loss_weights.reshape(-1).float()).sum()
        # the packed row holds the documents in order: document b's predicting tokens are its first n - 1
        out, at = [], 0
        for n in lengths:
            out.append(per[at:at + n - 1].detach())
            at += n
        return loss, out

    steps = {"hf": hf_step, "mp": mp_step}

    def run(kind):
        t0 = time.perf_counter()
        loss, per = steps[kind]()
        opts[kind].zero_grad()
        loss.backward()
        opts[kind].step()
        return time.perf_counter() - t0, float(loss.detach()), torch.cat(per)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; Qwen3.5 hidden {a.hidden}, 4 layers (3 GDN), "
          f"{a.dtype}; {len(lengths)} documents, {sum(lengths)} tokens (padded batch {len(lengths)} x {max(lengths)}); "
          f"load average at the start: {load()}")
    times = {"hf": [], "mp": []}
    ratios, dev, losses = [], 0.0, {"hf": [], "mp": []}
    for p in range(-1, a.pairs):  # pair -1 warms up
        pair = {}
        for kind in (("mp", "hf") if p % 2 == 0 else ("hf", "mp")):
            t, loss, per = run(kind)
            pair[kind] = (t, per)
            losses[kind].append(loss)
        dev = max(dev, float((pair["mp"][1] - pair["hf"][1]).abs().max()))
        mean_loss = float(pair["hf"][1].mean())
        if p >= 0:
            for kind in pair:
                times[kind].append(pair[kind][0])
            ratios.append(pair["mp"][0] / pair["hf"][0])
    m = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    # per-token tolerance: f32 rounding for f32; for bf16 1.5 % of the mean loss (log V = 8.3 here: about
    # 0.12), the size the two sides' bf16 roundings reach, never a wrong token or a shifted label
    # (those move a token's loss by units)
    tol = 1e-3 if dt == torch.float32 else 0.015 * mean_loss
    ok = dev <= tol
    print(f"training step ({a.dtype}): transformers padded {m['hf']:.1f} ms, maskpack padding-free {m['mp']:.1f} ms: "
          f"{statistics.median(ratios):.2f}x (median of {a.pairs} per-pair ratios maskpack / transformers)")
    print(f"per-token loss: max |maskpack - transformers| {dev:.3e} over {n_pred} tokens (tolerance {tol:.3e}: "
          f"{'agree' if ok else 'DIFFER'}); mean loss transformers {losses['hf'][-1]:.4f}, maskpack {losses['mp'][-1]:.4f}")
    print(f"load average at the end: {load()}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
