"""bench_hf_step.py: one training step (forward, backward, optimizer step) of a small transformers Qwen3.5
causal LM on the CPU, transformers' own padded step against the same model prepared with
maskpack.hf.prepare_model, padded and padding-free.

The batch is drawn as real ones are: document lengths lognormal (seeded), redrawn until the padded
batch is about --pad padding (default 40 %). The variants run in one process on one model, paired step
by step (each pair runs every variant once, the order rotating from pair to pair); each figure is the
median over the pairs of the per-pair ratio of step times, by the wall clock and by the process's CPU
time (on a shared machine run --threads 1 and read the CPU-time ratio: other processes stretch the wall
clock, and waiting OpenMP threads spin). Expected: the padding-free step beats
transformers' padded one by at least the padding (time ratio <= 1 - pad fraction, i.e. speed-up >= 1 /
(1 - pad)), since that step computes every pad token in every op; against maskpack's own padded step the
ratio lies between 1 - pad and 1, since maskpack's attention, Gated DeltaNet, conv and gate kernels skip
the pads there too (only the torch projections, MLP, norms and head run on them).

    hf_padded      transformers' own step: padded batch, 2D attention_mask, SDPA, its torch GDN fallback
    mp_padded      prepared model, the same padded batch (bundle.hf_kwargs(), 2D mask)
    mp_packed      prepared model, padding-free (one packed row, cu_seq_lens)

The losses of all variants are printed (they must agree to float32 rounding).

Hook for the compiled-vs-eager comparison (engineer E): add a variant to VARIANTS (a name -> builder
taking (model, batch) and returning (a function computing the step's loss tensor, the module it
trains); the bench runs backward and the optimizer step), e.g.
"mp_packed_compiled" wrapping the mp_packed step in torch.compile, and pass it with --variants. The
--compile flag is reserved for it and refuses to run until such a variant is registered.

    python bench/bench_hf_step.py [--pairs 10] [--hidden 256] [--sequences 8] [--pad 0.4] [--threads N] [--variants ...]
"""
import argparse
import copy
import math
import os
import statistics
import time
from typing import Callable, Dict

import torch
import torch.nn.functional as F

import maskpack
import maskpack.hf


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def draw_batch(gen: torch.Generator, n: int, median: int, sigma: float, pad: float, vocab: int, cap: int):
    """Lognormal document lengths (median ``median``, log-sd ``sigma``, 8..cap), redrawn (at most 1000
    times) until the padded batch's pad fraction is within 0.03 of ``pad``; the closest draw otherwise."""
    best = None
    for _ in range(1000):
        z = torch.randn(n, generator=gen)
        lengths = [int(min(cap, max(8, round(median * math.exp(sigma * float(x)))))) for x in z]
        frac = 1 - sum(lengths) / (n * max(lengths))
        if best is None or abs(frac - pad) < abs(best[1] - pad):
            best = (lengths, frac)
        if abs(frac - pad) <= 0.03:
            break
    lengths, frac = best
    S = max(lengths)
    mask = torch.zeros(n, S, dtype=torch.long)
    for b, L in enumerate(lengths):
        mask[b, :L] = 1
    ids = torch.randint(1, vocab, mask.shape, generator=gen) * mask
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.where(mask == 1, ids, -100)}, lengths, frac


def _bundle_loss(model, bundle) -> torch.Tensor:
    logits = model(**bundle.hf_kwargs()).logits
    flat = logits.reshape(-1, logits.shape[-1])
    per_token = F.cross_entropy(flat, bundle.shift_labels.reshape(-1), reduction="none")
    return (per_token * bundle.loss_weights.reshape(-1)).sum()


def hf_padded(model, batch) -> Callable[[], torch.Tensor]:
    """transformers' own step on its own copy of the model (never prepared)."""
    own = copy.deepcopy(model)
    return lambda: own(**batch, use_cache=False).loss, own


_PREPARED: Dict[int, torch.nn.Module] = {}


def mp(padding_free: bool):
    def build(model, batch):
        """The prepared copy of the model (one, shared by the maskpack variants); the bundle is built
        inside the step: its cost belongs to the step."""
        prepared = _PREPARED.get(id(model))
        if prepared is None:
            prepared = _PREPARED[id(model)] = maskpack.hf.prepare_model(copy.deepcopy(model))
        return (lambda: _bundle_loss(prepared, maskpack.prepare_batch(batch, backend="sdpa",
                                                                      padding_free=padding_free))), prepared
    return build


def mp_compiled(padding_free: bool, compile: bool = True):
    """The mp step with the model's forward and the loss under torch.compile (inductor), the layout handed
    over as maskpack_layout (a compiled graph cannot read boundaries out of tensor values); maskpack's
    moves, derived outputs and kernels are custom ops inside the graph. Graph breaks are allowed here
    (fullgraph=False): the step runs whatever the attention implementation traces.

    The bundle is built once, at the variant's build, and reused by every step (this bench steps on one
    batch): a compiled graph names its layouts by identity (maskpack._compile), so a new Layout object
    (a new batch) is a new graph, compiled again, and a graph's layout must outlive its backward. The
    figure is therefore the steady state of one batch, not of a loop over new batches; compare it with
    the same step uncompiled (compile=False: mp_*_reused, the bundle likewise built once)."""
    def build(model, batch):
        prepared = _PREPARED.get(id(model))
        if prepared is None:
            prepared = _PREPARED[id(model)] = maskpack.hf.prepare_model(copy.deepcopy(model))

        def loss_of(kwargs, shift_labels, weights):
            logits = prepared(**kwargs).logits
            flat = logits.reshape(-1, logits.shape[-1])
            return (F.cross_entropy(flat, shift_labels.reshape(-1), reduction="none") * weights.reshape(-1)).sum()

        compiled = torch.compile(loss_of) if compile else loss_of
        bundle = maskpack.prepare_batch(batch, backend="sdpa", padding_free=padding_free)
        kwargs = dict(bundle.hf_kwargs(), maskpack_layout=bundle.layout)

        def step():
            return compiled(kwargs, bundle.shift_labels, bundle.loss_weights)

        return step, prepared
    return build


# name -> builder(model, batch) -> (a function computing the step's loss tensor, the module it trains)
VARIANTS: Dict[str, Callable] = {"hf_padded": hf_padded, "mp_padded": mp(False), "mp_packed": mp(True),
                                 "mp_padded_compiled": mp_compiled(False), "mp_packed_compiled": mp_compiled(True),
                                 "mp_padded_reused": mp_compiled(False, False),
                                 "mp_packed_reused": mp_compiled(True, False)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4, help="every 4th a full-attention layer, the rest GDN")
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--median", type=int, default=256, help="median document length")
    ap.add_argument("--sigma", type=float, default=0.6, help="log-sd of the lengths")
    ap.add_argument("--pad", type=float, default=0.4, help="target pad fraction of the padded batch")
    ap.add_argument("--variants", nargs="+", default=["hf_padded", "mp_padded", "mp_packed"])
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default torch's); 1 makes the CPU-time figure meaningful on a shared machine, "
                         "where waiting OpenMP threads spin")
    ap.add_argument("--compile", action="store_true",
                    help="reserved for the compiled-vs-eager variants (engineer E): register them in VARIANTS")
    a = ap.parse_args()
    if a.compile and not any("compiled" in v for v in VARIANTS):
        raise SystemExit("--compile: no compiled variant is registered yet (add one to VARIANTS, see the module doc)")
    unknown = [v for v in a.variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {sorted(VARIANTS)}")
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    if a.threads is not None:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    h = a.hidden
    heads = max(2, h // 64)
    cfg = Qwen3_5TextConfig(hidden_size=h, linear_num_key_heads=heads, linear_num_value_heads=2 * heads,
                            linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
                            num_hidden_layers=a.layers, num_attention_heads=heads,
                            num_key_value_heads=max(1, heads // 2),
                            head_dim=64, intermediate_size=2 * h, vocab_size=4096, rms_norm_eps=1e-6)
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(cfg).train()
    batch, lengths, frac = draw_batch(torch.Generator().manual_seed(1), a.sequences, a.median, a.sigma, a.pad,
                                      cfg.vocab_size, 4 * a.median)
    steps = {name: VARIANTS[name](model, batch) for name in a.variants}
    # lr 0: every step sees the same weights; one optimizer per trained module
    opts = {name: torch.optim.SGD(mod.parameters(), lr=0.0) for name, (_, mod) in steps.items()}

    def run(name):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = steps[name][0]()
        opts[name].zero_grad()
        loss.backward()
        opts[name].step()
        return time.perf_counter() - t0, time.process_time() - c0, float(loss.detach())

    real = sum(lengths)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; Qwen3.5 hidden {h}, {a.layers} layers; "
          f"{len(lengths)} documents, lengths lognormal (median {a.median}, log-sd {a.sigma}): {sorted(lengths)}; "
          f"{real} real tokens in a padded {len(lengths)} x {max(lengths)} batch: pad fraction {frac:.2f}")
    print(f"load average at the start: {load()}")
    names = list(a.variants)
    times = {n: [] for n in names}
    cpu = {n: [] for n in names}
    losses = {n: [] for n in names}
    for p in range(-1, a.pairs):  # pair -1 warms up (first calls plan layouts, allocate caches)
        order = names[p % len(names):] + names[:p % len(names)] if p >= 0 else names
        got = {n: run(n) for n in order}
        if p >= 0:
            for n in names:
                times[n].append(got[n][0])
                cpu[n].append(got[n][1])
                losses[n].append(got[n][2])
    med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
    medc = {n: statistics.median(v) * 1e3 for n, v in cpu.items()}
    print("step time (median of pairs), wall clock: " + ", ".join(f"{n} {med[n]:.1f} ms" for n in names)
          + "; process CPU time: " + ", ".join(f"{n} {medc[n]:.1f} ms" for n in names))
    ok = True
    base = "mp_packed" if "mp_packed" in names else names[-1]
    for n in names:
        if n == base:
            continue
        r = statistics.median(times[base][i] / times[n][i] for i in range(a.pairs))
        rc = statistics.median(cpu[base][i] / cpu[n][i] for i in range(a.pairs))
        if n == "hf_padded":  # every op of transformers' padded step runs on the pads
            why = f"the padding alone predicts <= {1 - frac:.3f}"
        elif n == "mp_padded":  # maskpack's kernels skip pads: only the torch projections, MLP and head run on them
            why = f"between {1 - frac:.3f} and 1: maskpack's kernels skip the pads of the padded step too"
        else:
            why = ""
        print(f"{base} / {n}: wall-clock ratio {r:.3f} (median of {a.pairs} per-pair ratios; speed-up {1 / r:.2f}x), "
              f"CPU-time ratio {rc:.3f}" + (f"; {why}" if why else ""))
        if n == "hf_padded" and min(r, rc) > 1 - frac:
            ok = False
    ref = losses[names[0]][0]
    worst = max(abs(l - ref) / abs(ref) for n in names for l in losses[n])
    print(f"losses: " + ", ".join(f"{n} {losses[n][0]:.6f}" for n in names) + f"; largest relative difference "
          f"{worst:.1e} ({'agree' if worst < 1e-4 else 'DIFFER'})")
    print(f"load average at the end: {load()}")
    if not ok:
        print("padding-free did not beat transformers' padded step by the pad fraction on this run (see the load "
              "average)")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
