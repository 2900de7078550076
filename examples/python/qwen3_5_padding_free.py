"""A few training steps of a (tiny, randomly initialised) transformers Qwen3.5 causal LM on one
batch of variable-length sequences, three ways:

  padded        transformers' own forward on the padded batch with its 2D attention mask
  padded+mp     the same, with the Gated DeltaNet layers running through maskpack
  packed+mp     padding-free: one packed row with cu_seq_lens (transformers' own CPU path refuses
                this without flash-linear-attention), GDN layers through maskpack

Each run starts from the same weights with the same optimizer; the losses agree step by step (to
float32 rounding), so dropping the padding changes nothing but the work. No download: the model
is built from a config.

    .venv/bin/python examples/python/qwen3_5_padding_free.py [--steps 5]
"""

import argparse
import copy
import sys

import torch
import torch.nn.functional as F
from transformers import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

import maskpack


def make_batch(gen, lengths, vocab):
    """A dataloader's padded batch: input_ids, the HF attention_mask (1 = real) and labels."""
    S = max(lengths)
    mask = torch.zeros(len(lengths), S, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    ids = torch.randint(1, vocab, mask.shape, generator=gen) * mask
    labels = torch.where(mask == 1, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def train(model, batch, steps, mode):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        if mode == "padded":  # transformers computes the loss from the labels itself
            loss = model(**batch, use_cache=False).loss
        else:
            bundle = maskpack.prepare_batch(batch, backend="sdpa", padding_free=(mode == "packed+mp"))
            logits = model(**bundle.hf_kwargs()).logits
            logits = logits.reshape(-1, logits.shape[-1])
            per_token = F.cross_entropy(logits, bundle.shift_labels.reshape(-1), reduction="none")
            loss = (per_token * bundle.loss_weights.reshape(-1)).sum()  # = the mean over labelled tokens
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = Qwen3_5TextConfig(hidden_size=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                            linear_value_head_dim=16, linear_conv_kernel_dim=4, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                            vocab_size=256, rms_norm_eps=1e-6)
    cfg._attn_implementation = "sdpa"
    base = Qwen3_5ForCausalLM(cfg)
    batch = make_batch(torch.Generator().manual_seed(1), [37, 5, 64, 19], cfg.vocab_size)
    n_real = int(batch["attention_mask"].sum())
    print(f"batch: {len(batch['input_ids'])} sequences, {n_real} real tokens in a padded "
          f"{tuple(batch['input_ids'].shape)} batch ({batch['input_ids'].numel() - n_real} pads)")
    runs = {}
    for mode in ("padded", "padded+mp", "packed+mp"):
        model = copy.deepcopy(base).train()
        if mode != "padded":
            n = maskpack.patch_linear_attention(model)
            assert n == 3, n  # three of every four layers are Gated DeltaNet
        runs[mode] = train(model, batch, args.steps, mode)
    print("step  " + "  ".join(f"{m:>10}" for m in runs))
    for i in range(args.steps):
        print(f"{i:4d}  " + "  ".join(f"{runs[m][i]:10.6f}" for m in runs))
    worst = max(abs(a - b) / abs(b) for m in runs for a, b in zip(runs[m], runs["padded"]))
    ok = worst < 1e-4
    print(f"largest relative difference from transformers' padded run: {worst:.1e} ({'same' if ok else 'DIFFERENT'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
