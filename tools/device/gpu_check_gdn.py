"""gpu_check_gdn.py: a tiny transformers Qwen3.5 with maskpack's patched Gated DeltaNet layers, one
training step (forward, loss, backward) on CUDA, packed (one row, position ids) against padded (2D
attention mask); on CUDA the layers run flash-linear-attention's kernels (chunk_gated_delta_rule and
causal_conv1d with the cu_seqlens maskpack derives), on the CPU maskpack's C kernels.

    bash tools/device/build_ext.sh /tmp/mp && PYTHONPATH=/tmp/mp python tools/device/gpu_check_gdn.py

Prints the max differences of the loss and of every parameter's gradient (relative to that gradient's
largest entry): CUDA packed vs CUDA padded, CUDA vs the CPU step, and CPU packed vs CPU padded; exits 1
when one exceeds its tolerance (--tol, float32 with fla's TF32 products) or a step fails, 2 when a
backward could not run (flash-linear-attention refuses its backward on some Triton / GPU pairs, e.g.
Triton 3.4 to 3.7.0 on Hopper: the losses are then compared alone), 0 otherwise. On
a machine without CUDA (or without fla) it runs the CPU comparison only and says which parts it skipped.
Needs torch, transformers (Qwen3.5) and, for the CUDA part, flash-linear-attention with triton."""

import argparse
import sys
import traceback

import torch
import torch.nn.functional as F

import maskpack
from maskpack.gdn import patch_linear_attention

LENGTHS = [37, 100, 64, 5, 81]


def model_and_batch(seed: int, layers: int, hidden: int):
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3_5TextConfig(hidden_size=hidden, linear_num_key_heads=2, linear_num_value_heads=4,
                            linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
                            num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                            intermediate_size=2 * hidden, vocab_size=128, rms_norm_eps=1e-6,
                            layer_types=["linear_attention"] * layers)
    model = Qwen3_5ForCausalLM(cfg).float()
    assert patch_linear_attention(model) == layers
    gen = torch.Generator().manual_seed(seed + 1)
    docs = [torch.randint(0, 128, (n,), generator=gen) for n in LENGTHS]
    S = max(LENGTHS)
    ids = torch.zeros(len(docs), S, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, d in enumerate(docs):
        ids[i, :len(d)], mask[i, :len(d)] = d, 1
    packed = torch.cat(docs)[None]
    pos = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    return model, (ids, mask), (packed, pos)


def step(model, device, padded, packed, form):
    """One forward + backward -> (loss, {name: grad}). The loss: next-token cross entropy summed over each
    sequence's own tokens (the same tokens in both forms), divided by the token count."""
    model.zero_grad(set_to_none=True)
    if form == "padded":
        ids, mask = (t.to(device) for t in padded)
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        labels = torch.where(mask.bool(), ids, -100)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), reduction="sum",
                               ignore_index=-100)
    else:
        ids, pos = (t.to(device) for t in packed)
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        starts = pos[0] == 0
        labels = torch.where(torch.cat([starts[1:], torch.ones(1, dtype=torch.bool, device=device)]), -100,
                             torch.roll(ids[0], -1))
        loss = F.cross_entropy(logits[0].float(), labels, reduction="sum", ignore_index=-100)
    n = sum(LENGTHS) - len(LENGTHS)
    loss = loss / n
    try:
        loss.backward()
    except RuntimeError as e:  # fla refuses its backward on some Triton / GPU pairs rather than compute wrong
        return float(loss.detach()), f"{type(e).__name__}: {e}"
    return float(loss.detach()), {k: p.grad.detach().float().cpu() for k, p in model.named_parameters() if p.grad is not None}


def compare(what, a, b, tol, failures, skipped):
    (la, ga), (lb, gb) = a, b
    dl = abs(la - lb) / max(abs(lb), 1e-30)
    if isinstance(ga, str) or isinstance(gb, str):  # a backward that did not run: the losses alone
        why = ga if isinstance(ga, str) else gb
        ok = dl <= tol
        print(f"{what:32s} loss {la:.6f} vs {lb:.6f}  rel diff {dl:.2e}  {'ok' if ok else 'FAIL'}; gradients NOT "
              f"compared: the backward failed: {why[:300]}")
        skipped.append(what + " gradients")
        if not ok:
            failures.append(what)
        return
    dg, worst = 0.0, ""
    for k in gb:
        d = float((ga[k] - gb[k]).abs().max() / gb[k].abs().max().clamp_min(1e-30))
        if d > dg:
            dg, worst = d, k
    ok = dl <= tol and dg <= tol and ga.keys() == gb.keys()
    print(f"{what:32s} loss {la:.6f} vs {lb:.6f}  rel diff {dl:.2e}  max grad rel diff {dg:.2e} ({worst})  "
          f"{'ok' if ok else 'FAIL'}")
    if not ok:
        failures.append(what)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tol", type=float, default=2e-3, help="relative tolerance of loss and gradients")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    failures, skipped = [], []
    print(f"torch {torch.__version__}, maskpack {getattr(maskpack, '__version__', '?')}, cuda "
          f"{torch.cuda.is_available()}")
    model, padded, packed = model_and_batch(a.seed, a.layers, a.hidden)
    try:
        cpu_pad = step(model, "cpu", padded, packed, "padded")
        cpu_pack = step(model, "cpu", padded, packed, "packed")
        compare("cpu: packed vs padded", cpu_pack, cpu_pad, 1e-5, failures, skipped)
    except Exception:  # noqa: BLE001 - reported, and the exit status says so
        traceback.print_exc()
        failures.append("cpu step")
        cpu_pad = None
    if not torch.cuda.is_available():
        print("SKIPPED: CUDA is not available here: the CUDA steps (flash-linear-attention's kernels) did not run")
        return 1 if failures else 0
    try:
        import fla  # noqa: F401
        print(f"flash-linear-attention {getattr(fla, '__version__', '?')}")
    except Exception as e:  # noqa: BLE001
        print(f"SKIPPED: flash-linear-attention does not import here ({type(e).__name__}: {e}); checking that "
              "a CUDA step refuses to run without it")
        model.cuda()
        try:
            step(model, "cuda", padded, packed, "packed")
            print("FAIL: a CUDA step ran without flash-linear-attention")
            failures.append("fla missing")
        except maskpack.Error as err:
            ok = "flash-linear-attention" in str(err)
            print(f"refused: {err}  {'ok' if ok else 'FAIL'}")
            if not ok:
                failures.append("fla missing message")
        return 1 if failures else 0
    model.cuda()
    try:
        gpu_pad = step(model, "cuda", padded, packed, "padded")
        gpu_pack = step(model, "cuda", padded, packed, "packed")
        compare("cuda: packed vs padded", gpu_pack, gpu_pad, a.tol, failures, skipped)
        if cpu_pad is not None:
            compare("cuda padded vs cpu padded", gpu_pad, cpu_pad, a.tol, failures, skipped)
            compare("cuda packed vs cpu packed", gpu_pack, cpu_pack, a.tol, failures, skipped)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        failures.append("cuda step")
    if failures:
        print("FAILED: " + ", ".join(failures))
        return 1
    if skipped:
        print("NOT CHECKED (exit 2): " + ", ".join(skipped))
        return 2
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
