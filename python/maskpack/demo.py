"""maskpack.demo: one batch, every layout, one table (``maskpack demo``, ``make run``).

    python -m maskpack.demo [--sequences 48] [--tokens 512] [--scale 32] [--steps 3] [--layouts padded,packed,cp2]
                            [--hidden 128] [--threads N] [--json] [--out build/demo] [--quiet]

What it does, in order:

1. **Draws a batch** from the length sample that ships with maskpack (``data/sft_lengths.txt``: 4096
   SFT-like lengths with a long tail, written by ``data/make_sft_lengths.py``, fixed seed): ``--sequences``
   lengths drawn with a fixed seed, divided by ``--scale`` (the model is scaled down, so are the
   sequences; the shape of the mix is kept).
2. **Plans it** with :func:`maskpack.plan`: the drawn sequences packed into rows of ``--tokens`` tokens
   in their order (next-fit: the rows a streaming loader with a token budget cuts, so a row holds the
   sample's mix of lengths), each sequence rounded up to the cp = 2 multiple; the demo's batch is the
   plan's first row. Its padded form is those sequences padded to the longest, as a dataloader hands
   them to transformers.
3. **Trains** a small hybrid Qwen3.5 model (transformers' ``Qwen3_5ForCausalLM``: three Gated DeltaNet
   layers then one gated full-attention layer, as Qwen3.5 arranges them; sizes scaled down, head
   structure kept: twice as many GDN value heads as key heads, 4 query heads per key/value head) with
   fixed-seed random weights for ``--steps`` SGD steps, in each layout:

   * ``padded``: transformers' own run, ``[B, S]`` with its 2D attention mask (SDPA, its torch GDN);
   * ``packed``: the model through :func:`maskpack.hf.prepare_model`, one packed row (THD), no padding;
   * ``cp2``: the same across two processes (torch.distributed over gloo, spawned by the demo), each
     holding its zigzag shard of the packed row (context parallelism, cp = 2).

   Every layout starts from the same weights and sees the same tokens, so its losses and gradients
   must equal the padded run's to float32 rounding; the demo exits with status 1 when one does not
   (relative difference ``max|a - b| / max|b|`` above ``TOLERANCE``).
4. **Prints one table** (layout, tokens computed, pad fraction, median step time, loss per step, the
   largest loss and gradient difference from the padded run) and, for the same batch, what each
   attention backend would be handed: the SDPA mask, flash-attn varlen's kwargs, Megatron's
   ``PackedSeqParams`` (cp = 2, rank 0) and Ascend ``npu_fusion_attention``'s TND arguments.
5. **Draws the pictures** of the batch with the CLI (``maskpack inspect --png``, ``maskpack plan
   --png``) into ``--out`` when the ``maskpack`` program is found (``MASKPACK_CLI``, ``build/maskpack``
   of the source tree, or ``maskpack`` on the PATH).

What cannot run is skipped with a line saying what and why (no torch or transformers: no training;
a torch without gloo: no cp2; no CLI: no pictures); the rest still runs. Bad options exit with status 2
and a message naming the option.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

import maskpack

__all__ = ["main", "TOLERANCE", "LAYOUTS"]

# float32 rounding: the kernels accumulate in another order than transformers' (test_hf measures ~3e-6 on
# gradients at one step); a layout bug (a token attending across a boundary, a lost gradient) is O(1)
TOLERANCE = 1e-4
LAYOUTS = ("padded", "packed", "cp2")
_SAMPLE = "sft_lengths.txt"
_SEED = 35


class _Usage(Exception):
    """A bad option: exit status 2 with this message."""


# ---- progress and skips --------------------------------------------------------------------------------


class _Progress:
    """One progress line on stderr: rewritten in place on a terminal, a plain line per phase otherwise
    (only with --progress); nothing with --quiet."""

    def __init__(self, mode: str) -> None:
        self.tty = sys.stderr.isatty()
        self.on = mode == "on" or (mode == "auto" and self.tty)
        self.t0 = time.perf_counter()
        self.width = 0

    def __call__(self, msg: str, final: bool = False) -> None:
        if not self.on:
            return
        line = f"demo [{time.perf_counter() - self.t0:5.1f} s] {msg}"
        if self.tty:
            sys.stderr.write("\r" + line.ljust(self.width))
            self.width = len(line)
            if final:
                sys.stderr.write("\n")
                self.width = 0
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.on and self.tty and self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()
            self.width = 0


# ---- options ------------------------------------------------------------------------------------------


def _in_range(kind, what: str, lo, hi):
    """An argparse type: a value of ``kind`` (int or float) in [lo, hi], or the option's one-line error."""
    def conv(s: str):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} in [{lo}, {hi}], found {s!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected {what} in [{lo}, {hi}], found {v}")
        return v
    return conv


def _int_in(lo: int, hi: int):
    return _in_range(int, "an integer", lo, hi)


def _float_in(lo: float, hi: float):
    return _in_range(float, "a number", lo, hi)


def _layouts(s: str) -> List[str]:
    got = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in got if x not in LAYOUTS]
    if bad or not got:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(LAYOUTS)}, found {s!r}")
    return [x for x in LAYOUTS if x in got]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage and exits 2; the demo says which option, once
        raise _Usage(message)


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="maskpack demo", description="Draw a batch from the shipped SFT length sample, plan it, train a "
                 "small hybrid Qwen3.5 model on it padded (transformers), packed (maskpack) and over cp = 2 gloo "
                 "processes, and check that every layout gives the padded run's losses and gradients.")
    ap.add_argument("--lengths", metavar="FILE", help="length sample, one length per line (default: data/sft_lengths.txt)")
    ap.add_argument("--sequences", type=_int_in(1, 4096), default=48,
                    help="sequences drawn from the sample (default 48); the planner cuts them into rows")
    ap.add_argument("--scale", type=_int_in(1, 4096), default=32,
                    help="divide the drawn lengths by this (the model is scaled down too; default 32)")
    ap.add_argument("--tokens", type=_int_in(8, 1 << 20), default=512,
                    help="planner row capacity: tokens in the packed batch (default 512)")
    ap.add_argument("--seed", type=_int_in(0, 2**31 - 1), default=0, help="draw, data and weights seed (default 0)")
    ap.add_argument("--steps", type=_int_in(1, 100), default=3, help="training steps per layout (default 3)")
    ap.add_argument("--lr", type=_float_in(0.0, 100.0), default=0.5, help="SGD learning rate (default 0.5)")
    ap.add_argument("--hidden", type=_int_in(16, 4096), default=128,
                    help="hidden size (a multiple of 16; default 128): heads follow it, as Qwen3.5's do")
    ap.add_argument("--layers", type=_int_in(1, 64), default=4,
                    help="layers, every 4th full attention, the rest Gated DeltaNet (default 4)")
    ap.add_argument("--vocab", type=_int_in(16, 1 << 18), default=4096, help="vocabulary size (default 4096)")
    ap.add_argument("--layouts", type=_layouts, default=list(LAYOUTS),
                    help=f"which layouts to train, comma-separated (default {','.join(LAYOUTS)}); padded is the reference")
    ap.add_argument("--threads", type=_int_in(1, 1024), default=None,
                    help="torch and kernel threads (default: the cores, at most 8; each cp2 rank gets half)")
    ap.add_argument("--cp-backend", choices=("gloo", "mpi"), default="gloo",
                    help="how the two cp2 processes talk: gloo (spawned by the demo; default) or mpi (torch's MPI "
                         "backend under mpirun, when this torch has it)")
    ap.add_argument("--cp-timeout", type=_int_in(10, 3600), default=300,
                    help="seconds the cp2 processes may take (default 300)")
    ap.add_argument("--out", metavar="DIR", default=None,
                    help="where the pictures and the batch go (default build/demo of the source tree, else ./maskpack-demo)")
    ap.add_argument("--no-pictures", action="store_true", help="do not call the CLI for the pictures")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object instead of the table")
    ap.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                    help="progress line on stderr (default: when stderr is a terminal)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    return ap


# ---- the length sample and the batch ---------------------------------------------------------------------


def _source_root() -> Optional[str]:
    """The source tree this module runs from (python/maskpack/demo.py), or MASKPACK_ROOT, or the current
    directory when it is one; None for an installed package run elsewhere."""
    cands = [os.environ.get("MASKPACK_ROOT"),
             os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), os.getcwd()]
    for c in cands:
        if c and os.path.isfile(os.path.join(c, "data", _SAMPLE)):
            return c
    return None


def _sample_lengths(path: Optional[str], notes: List[str]) -> tuple:
    if path is None:
        root = _source_root()
        if root is not None:
            path = os.path.join(root, "data", _SAMPLE)
    if path is None:
        # an installed package away from the source tree: the committed file's recipe, regenerated
        notes.append(f"length sample: data/{_SAMPLE} not found (set MASKPACK_ROOT to the source tree); regenerated "
                     "from its recipe (data/make_sft_lengths.py: three lognormals, PCG64 seed 35)")
        rng = np.random.Generator(np.random.PCG64(35))
        comp = rng.choice(3, size=4096, p=(0.55, 0.35, 0.10))
        z = rng.standard_normal(4096)
        med = np.array([350.0, 1400.0, 6000.0])[comp]
        sig = np.array([0.7, 0.6, 0.7])[comp]
        return np.clip(np.rint(med * np.exp(sig * z)), 16, 32768).astype(np.int64), "recipe of data/make_sft_lengths.py"
    try:
        with open(path) as f:
            vals = [int(tok) for line in f for tok in line.split()[:1]]
    except OSError as e:
        raise _Usage(f"--lengths: cannot read {path} ({e.strerror})") from None
    except ValueError:
        raise _Usage(f"--lengths: {path}: expected one integer length per line") from None
    arr = np.asarray(vals, dtype=np.int64)
    if arr.size == 0 or (arr < 1).any():
        raise _Usage(f"--lengths: {path}: expected positive lengths, one per line ({arr.size} read)")
    return arr, path


def _draw(sample: np.ndarray, a) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(a.seed))
    drawn = sample[rng.integers(0, sample.size, size=a.sequences)]
    return np.maximum(1, drawn // a.scale).astype(np.int64)


def _batch(lengths: Sequence[int], vocab: int, seed: int) -> Dict[str, Any]:
    """The padded batch (numpy): right-padded [B, S] input_ids with their 2D keep mask and labels.
    Each sequence counts: token t+1 = token t + a stride (1..3, per sequence) modulo the vocabulary from
    a random start, so the loss falls as the model learns it."""
    rng = np.random.Generator(np.random.PCG64(seed + 1))
    B, S = len(lengths), max(lengths)
    ids = np.zeros((B, S), dtype=np.int64)
    mask = np.zeros((B, S), dtype=np.int64)
    for b, L in enumerate(lengths):
        start = int(rng.integers(1, vocab))
        stride = int(rng.integers(1, 4))
        ids[b, :L] = 1 + (start + stride * np.arange(L)) % (vocab - 1)
        mask[b, :L] = 1
    labels = np.where(mask == 1, ids, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


# ---- what each attention backend is handed ----------------------------------------------------------------


def _compact(v: Any, n: int = 4) -> Any:
    """A tensor / array as 'int32[13] 0 97 140 … 1020' (JSON: dtype, shape, head, tail); scalars as they are."""
    if hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, (int, np.integer)) for x in v):
        v = np.asarray(v)
    if isinstance(v, np.ndarray):
        flat = v.reshape(-1)
        dtype = str(v.dtype)
        shape = list(v.shape)
        if v.ndim >= 2:  # a mask: its shape, dtype and how much of it is True / finite
            if v.dtype == np.bool_:
                return {"dtype": dtype, "shape": shape, "true_fraction": round(float(flat.mean()), 4)}
            return {"dtype": dtype, "shape": shape}
        head = flat[:n].tolist()
        tail = flat[-n:].tolist() if flat.size > 2 * n else flat[n:].tolist()
        return {"dtype": dtype, "shape": shape, "head": head, "tail": tail if flat.size > 2 * n else [],
                "values": flat.tolist() if flat.size <= 2 * n else None}
    if isinstance(v, float):
        return round(v, 6)
    return v


def _compact_str(c: Any) -> str:
    if isinstance(c, dict) and "dtype" in c:
        head = f"{c['dtype']}{c['shape']}"
        if "true_fraction" in c:
            return f"{head} ({c['true_fraction']:.1%} True)"
        if c.get("values") is not None:
            return f"{head} {c['values']}"
        if "head" in c:
            return f"{head} [{', '.join(map(str, c['head']))}, ..., {', '.join(map(str, c['tail']))}]"
        return head
    return repr(c)


def _handoff(batch: Dict[str, Any], head_dim: int, notes: List[str]) -> Dict[str, Dict[str, Any]]:
    """For the demo's batch: what SDPA (padded), flash-attn varlen, Megatron's PackedSeqParams (cp = 2,
    rank 0) and Ascend npu_fusion_attention (TND) would be handed, compacted."""
    out: Dict[str, Dict[str, Any]] = {}
    try:
        padded = maskpack.prepare_batch(batch, backend="sdpa", padding_free=False)
        out["sdpa (padded)"] = {"attn_mask": _compact(padded.sdpa_mask())}
    except (ImportError, maskpack.Error) as e:
        notes.append(f"sdpa hand-off skipped: {e}")
    try:
        packed = maskpack.prepare_batch(batch, backend="flash_attn", padding_free=True)
        out["flash-attn varlen"] = {k: _compact(v) for k, v in packed.flash_attn_kwargs().items()}
    except ImportError as e:
        notes.append(f"flash-attn hand-off skipped: it is built as torch tensors ({e})")
    try:
        mg = maskpack.prepare_batch(batch, backend="megatron", padding_free=True, cp=2, cp_rank=0)
        out["Megatron PackedSeqParams (cp=2, rank 0)"] = {k: _compact(v)
                                                           for k, v in mg.megatron_packed_seq_params().items()}
    except ImportError as e:
        notes.append(f"Megatron hand-off skipped: it is built as torch tensors ({e})")
    try:
        npu = maskpack.prepare_batch(batch, backend="npu", padding_free=True, head_dim=head_dim)
        kw = npu.npu_kwargs()
        out["Ascend npu_fusion_attention (TND)"] = {k: _compact(v) for k, v in kw.items() if v is not None}
    except ImportError as e:
        notes.append(f"Ascend hand-off skipped: {e}")
    return out


# ---- the model and one training step ----------------------------------------------------------------------


def _config(a):
    from transformers import Qwen3_5TextConfig

    h = a.hidden
    heads = max(2, h // 32)  # GDN key heads; value heads twice as many (Qwen3.5: 16 / 32 at hidden 4096)
    attn = max(4, h // 32)  # query heads; 4 per key/value head (Qwen3.5: 16 / 4)
    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(a.layers)]
    cfg = Qwen3_5TextConfig(hidden_size=h, linear_num_key_heads=heads, linear_num_value_heads=2 * heads,
                            linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
                            num_hidden_layers=a.layers, layer_types=types, num_attention_heads=attn,
                            num_key_value_heads=max(1, attn // 4), head_dim=64, intermediate_size=3 * h,
                            vocab_size=a.vocab, rms_norm_eps=1e-6, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return cfg


def _model(a):
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    import torch

    torch.manual_seed(a.seed)
    return Qwen3_5ForCausalLM(_config(a)).train()


def _torch_batch(batch: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    return {k: torch.from_numpy(v) for k, v in batch.items()}


def _bundle_loss(model, bundle, group=None):
    import torch.nn.functional as F

    if bundle.cp > 1:
        kw = _cp_kwargs(bundle)
        logits = model(**kw).logits[0]
    else:
        logits = model(**bundle.hf_kwargs()).logits
    flat = logits.reshape(-1, logits.shape[-1])
    per_token = F.cross_entropy(flat, bundle.shift_labels.reshape(-1), reduction="none")
    if group is not None:
        return maskpack.cp_loss(per_token, bundle.loss_weights.reshape(-1), group)
    return (per_token * bundle.loss_weights.reshape(-1)).sum()


def _cp_kwargs(bundle):
    """A CP rank's model kwargs: bundle.hf_kwargs() where it takes CP bundles, else maskpack.hf.cp_kwargs."""
    try:
        return bundle.hf_kwargs()
    except maskpack.Error as e:
        if e.argument != "cp":
            raise
    import maskpack.hf as mhf

    return mhf.cp_kwargs(bundle)


def _train(step_loss, model, steps: int, lr: float, progress, name: str, grads_out: Optional[list] = None,
           reduce=None) -> Dict[str, Any]:
    """``steps`` SGD steps: each step's loss, time and (optionally) a copy of every gradient."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, times = [], []
    for s in range(steps):
        if progress is not None:
            progress(f"{name}: step {s + 1}/{steps}")
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = step_loss()
        loss.backward()
        if reduce is not None:
            reduce(model)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
        if grads_out is not None:
            grads_out.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
    return {"losses": losses, "times": times}


def _relerr(x, ref) -> float:
    x, ref = x.double(), ref.double()
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def _grad_diff(grads: List[dict], ref: List[dict]) -> tuple:
    """The largest difference of the gradients from the reference's over the steps: per step, the
    gradient as one vector (every parameter), ``max|a - b| / max|b|``. A per-tensor figure would divide
    by the gate parameters' own small gradients (A_log, dt_bias: sums that cancel to ~1e-5 of the
    largest), whose float32 rounding then reads 1e-4; the worst tensor by that measure is returned too,
    for the JSON."""
    worst, tensor = 0.0, (0.0, None)
    for g, r in zip(grads, ref):
        if set(g) != set(r):
            return math.inf, (math.inf, sorted(set(g) ^ set(r))[0])
        num = max(float((g[n].double() - r[n].double()).abs().max()) for n in r)
        den = max(float(r[n].abs().max()) for n in r)
        worst = max(worst, num / max(den, 1e-30))
        for n in r:
            e = _relerr(g[n], r[n])
            if e > tensor[0]:
                tensor = (e, n)
    return worst, tensor


# ---- cp = 2 over two gloo processes ---------------------------------------------------------------------


def _cp_worker(rank: int, world: int, init_file: str, out_dir: str, a_dict: dict, batch: dict, threads: int) -> None:
    import torch
    import torch.distributed as dist

    import maskpack.hf as mhf

    torch.set_num_threads(threads)
    a = argparse.Namespace(**a_dict)
    if init_file:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    else:  # under mpirun: rank and size from MPI
        dist.init_process_group("mpi")
        rank, world = dist.get_rank(), dist.get_world_size()
    try:
        group = dist.group.WORLD
        model = mhf.prepare_model(_model(a), group=group, threads=threads)
        tb = _torch_batch(batch)
        bundle = maskpack.prepare_batch(tb, backend="sdpa", padding_free=True, cp=world, cp_rank=rank)

        def reduce(m):  # each rank's share of the gradient, summed as Megatron does over the CP group
            for p in m.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=group)

        grads: list = []
        res = _train(lambda: _bundle_loss(model, maskpack.prepare_batch(tb, backend="sdpa", padding_free=True, cp=world,
                                                                          cp_rank=rank), group),
                     model, a.steps, a.lr, None, "cp2", grads if rank == 0 else None, reduce)
        res["tokens_per_rank"] = int(bundle.input_ids.shape[0])
        t_local = torch.tensor([res["tokens_per_rank"]])
        gathered = [torch.zeros_like(t_local) for _ in range(world)]
        dist.all_gather(gathered, t_local, group=group)
        res["tokens_each_rank"] = [int(t) for t in gathered]
        if rank == 0:
            torch.save({"res": res, "grads": grads}, os.path.join(out_dir, "cp.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # done: leave without the interpreter's teardown, where a library thread still joinable at exit can
    # abort the process ("terminate called without an active exception") after the work is written
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _mpi_worker(out_dir: str) -> None:
    """One rank under ``mpirun -np 2`` (--cp-backend mpi): the arguments come from out_dir/args.pt."""
    import torch

    args = torch.load(os.path.join(out_dir, "args.pt"))
    _cp_worker(0, 2, "", out_dir, args["a"], args["batch"], args["threads"])


def _run_cp_mpi(a, batch: dict, threads: int, mpirun: str, progress) -> Dict[str, Any]:
    import torch

    with tempfile.TemporaryDirectory(prefix="maskpack-demo-") as d:
        a_dict = {k: getattr(a, k) for k in ("seed", "hidden", "layers", "vocab", "steps", "lr")}
        torch.save({"a": a_dict, "batch": batch, "threads": threads}, os.path.join(d, "args.pt"))
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(maskpack.__file__))),
                                               os.environ.get("PYTHONPATH", "")]))
        progress("cp2: two MPI processes training")
        try:
            r = subprocess.run([mpirun, "--oversubscribe", "-np", "2", sys.executable, "-c",
                                f"import maskpack.demo as d; d._mpi_worker({d!r})"], capture_output=True, text=True,
                               env=env, timeout=a.cp_timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"mpirun took longer than --cp-timeout {a.cp_timeout} s; stopped") from None
        path = os.path.join(d, "cp.pt")
        if not os.path.isfile(path):
            tail = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
            raise RuntimeError(f"mpirun exited {r.returncode}: {tail[-1] if tail else 'no output'}")
        return torch.load(path)


def _run_cp(a, batch: dict, threads: int, progress) -> Dict[str, Any]:
    import torch
    import torch.multiprocessing as mp

    world = 2
    with tempfile.TemporaryDirectory(prefix="maskpack-demo-") as d:
        init = os.path.join(d, "init")
        a_dict = {k: getattr(a, k) for k in ("seed", "hidden", "layers", "vocab", "steps", "lr")}
        ctx = mp.start_processes(_cp_worker, args=(world, init, d, a_dict, batch, threads), nprocs=world, join=False,
                                 start_method="spawn")
        t0 = time.perf_counter()
        try:
            while not ctx.join(timeout=1.0):
                el = time.perf_counter() - t0
                progress(f"cp2: two gloo processes training ({el:.0f} s)")
                if el > a.cp_timeout:
                    for p in ctx.processes:
                        if p.is_alive():
                            p.terminate()
                    raise RuntimeError(f"the two processes took longer than --cp-timeout {a.cp_timeout} s; stopped")
        except mp.ProcessRaisedException as e:
            last = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            raise RuntimeError(f"a cp2 process failed: {last[-1] if last else e}") from None
        except mp.ProcessExitedException as e:
            # the results are complete once rank 0 has written them (after the last step's all-reduce)
            if not os.path.isfile(os.path.join(d, "cp.pt")):
                raise RuntimeError(f"a cp2 process exited: {e}") from None
            got = torch.load(os.path.join(d, "cp.pt"))
            got["note"] = f"a cp2 process exited abnormally after the results were written ({e})"
            return got
        got = torch.load(os.path.join(d, "cp.pt"))
    return got


# ---- pictures through the CLI -------------------------------------------------------------------------------


def _cli() -> Optional[str]:
    env = os.environ.get("MASKPACK_CLI")
    if env:
        return env if os.access(env, os.X_OK) else None
    root = _source_root()
    if root is not None:
        p = os.path.join(root, "build", "maskpack")
        if os.access(p, os.X_OK):
            return p
    return shutil.which("maskpack")


def _pictures(a, batch: dict, pool: np.ndarray, out_dir: str, notes: List[str]) -> Dict[str, str]:
    cli = _cli()
    if cli is None:
        notes.append("pictures skipped: no maskpack program found (make build, or set MASKPACK_CLI)")
        return {}
    pics: Dict[str, str] = {}
    npz = os.path.join(out_dir, "batch.npz")
    np.savez(npz, attention_mask=batch["attention_mask"])
    lens = os.path.join(out_dir, "lengths.txt")
    with open(lens, "w") as f:
        f.write("".join(f"{int(x)}\n" for x in pool))
    jobs = {"mask": [cli, "inspect", npz, "--mask-convention", "keep", "--png", os.path.join(out_dir, "mask.png")],
            "plan": [cli, "plan", lens, "--capacity", str(a.tokens), "--cp", "2", "--allow-split", "--algorithm", "nextfit", "-q",
                     "--png", os.path.join(out_dir, "plan.png")]}
    for name, cmd in jobs.items():
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            notes.append(f"{name} picture skipped: {os.path.basename(cli)} {cmd[1]} could not run ({e})")
            continue
        png = cmd[cmd.index("--png") + 1]
        # inspect exits 1 when it reports problems (none expected here) but still draws
        if os.path.isfile(png) and r.returncode in (0, 1):
            pics[name] = png
        else:
            msg = (r.stderr or r.stdout).strip().splitlines()
            notes.append(f"{name} picture skipped: '{' '.join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))}' "
                         f"exited {r.returncode}: {msg[-1] if msg else ''}")
    return pics


# ---- main ---------------------------------------------------------------------------------------------------


def _have(mod: str) -> Optional[str]:
    try:
        __import__(mod)
        return None
    except ImportError as e:
        return str(e)


def _machine() -> Dict[str, Any]:
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"cpu": cpu or "unknown CPU", "cores": os.cpu_count(), "load_average": load,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _default_threads() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def run(a) -> Dict[str, Any]:
    """The demo with parsed options -> the results dict (what --json prints)."""
    progress = _Progress("off" if a.quiet else ("on" if a.progress == "on" else a.progress))
    notes: List[str] = []
    threads = a.threads or _default_threads()
    sample, sample_src = _sample_lengths(a.lengths, notes)
    pool = _draw(sample, a)
    progress("planning")
    # next-fit keeps the sample's order: its rows are the batches a streaming loader with a token budget
    # cuts (a mix of lengths, as a dataloader hands them); the decreasing packers would group alike lengths
    p = maskpack.plan(pool, capacity=a.tokens, cp=2, allow_split=True, algorithm="nextfit")
    rep = p.report()
    # the demo's batch: the plan's first row (pieces of a sequence cut to fit count as sequences)
    lengths = _first_row_lengths(p, pool)
    if max(lengths) < 2:
        raise _Usage(f"the batch (the plan's first row: {len(lengths)} sequence(s) of 1 token) has no next-token target "
                     "to train on; use a smaller --scale or more --sequences")
    batch = _batch(lengths, a.vocab, a.seed)
    real = int(sum(lengths))
    B, S = len(lengths), max(lengths)
    res: Dict[str, Any] = {
        "sample": {"source": sample_src, "size": int(sample.size), "median": float(np.median(sample)),
                   "p99": float(np.percentile(sample, 99)), "max": int(sample.max())},
        "draw": {"sequences": int(a.sequences), "scale": int(a.scale), "seed": int(a.seed),
                 "lengths": [int(x) for x in pool]},
        "plan": {"capacity": int(a.tokens), "rows": int(p.n_rows), "multiple": int(p.multiple),
                 "fill": float(rep.get("fill_all_rows", float("nan"))), "batch_row": 0},
        "batch": {"sequences": B, "lengths": [int(x) for x in lengths], "real_tokens": real, "padded_shape": [B, S]},
        "machine": _machine(), "threads": threads, "cp_backend": a.cp_backend, "tolerance": TOLERANCE,
        "layouts": {}, "handoff": {}, "pictures": {}, "notes": notes,
    }
    miss = [m for m in ("torch", "transformers") if _have(m) is not None]
    if miss:
        notes.append(f"training skipped: {' and '.join(miss)} not importable by {sys.executable} (make python installs "
                     "them into .venv); the plan and the hand-offs below need no model")
    head_dim = 64
    res["handoff"] = _handoff(batch, head_dim, notes)
    if not miss:
        _train_all(a, batch, res, threads, progress, notes)
    out_dir = a.out or _default_out()
    if not a.no_pictures:
        try:
            os.makedirs(out_dir, exist_ok=True)
            progress("pictures")
            res["pictures"] = _pictures(a, batch, pool, out_dir, notes)
        except OSError as e:
            notes.append(f"pictures skipped: cannot write {out_dir} ({e.strerror})")
    progress.done()
    try:
        res["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    lay = res["layouts"]
    res["agree"] = all(v.get("agree", True) for v in lay.values())
    return res


def _first_row_lengths(p, pool: np.ndarray) -> List[int]:
    """Token lengths of the plan's first row: each sequence's length, or its piece's when it was cut."""
    return [int(pc[2]) for pc in p.pieces[0]]


def _default_out() -> str:
    root = _source_root()
    return os.path.join(root, "build", "demo") if root is not None else os.path.join(os.getcwd(), "maskpack-demo")


def _train_all(a, batch: dict, res: dict, threads: int, progress, notes: List[str]) -> None:
    import copy

    import torch

    import maskpack.hf as mhf

    torch.set_num_threads(threads)
    try:  # its "falling back to the reference PyTorch implementation" lines: the note below says it once
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass
    lengths = res["batch"]["lengths"]
    B, S = res["batch"]["padded_shape"]
    real = res["batch"]["real_tokens"]
    progress("building the model")
    base = _model(a)
    res["model"] = {k: getattr(base.config, k) for k in (
        "hidden_size", "num_hidden_layers", "layer_types", "linear_num_key_heads", "linear_num_value_heads",
        "linear_key_head_dim", "linear_value_head_dim", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size")}
    res["model"]["parameters"] = int(sum(p.numel() for p in base.parameters()))
    res["torch"] = torch.__version__
    tb = _torch_batch(batch)
    ref_grads: List[dict] = []
    lay = res["layouts"]

    def record(name, out, tokens, pad, grads, ref):
        times = out["times"]
        steady = times[1:] if len(times) > 1 else times
        entry = {"tokens": tokens, "pad_fraction": pad, "step_ms": statistics.median(steady) * 1e3,
                 "step_ms_all": [t * 1e3 for t in times], "losses": out["losses"]}
        if ref is not None:
            rl = ref["losses"]
            entry["loss_diff"] = max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(out["losses"], rl))
            entry["grad_diff"], (entry["grad_diff_worst_tensor"], entry["worst_tensor"]) = _grad_diff(grads, ref_grads)
            entry["agree"] = bool(entry["loss_diff"] <= TOLERANCE and entry["grad_diff"] <= TOLERANCE)
        lay[name] = entry

    # padded: transformers' own run (the reference); its model is never prepared
    if "padded" in a.layouts:
        own = copy.deepcopy(base)
        out = _train(lambda: own(**tb, use_cache=False).loss, own, a.steps, a.lr, progress, "padded (transformers)",
                     ref_grads)
        record("padded", out, f"{B} x {S}", 1 - real / (B * S), ref_grads, None)
        del own
        notes.append("step times compare whole stacks: padded is transformers' own step (SDPA, and its reference "
                     "PyTorch Gated DeltaNet on a CPU), packed and cp2 run maskpack's kernels; the padding alone accounts "
                     f"for {1 / max(real / (B * S), 1e-9):.1f}x (1 / (1 - pad))")
    ref = lay.get("padded")
    if "packed" in a.layouts:
        model = mhf.prepare_model(copy.deepcopy(base), threads=threads)
        grads: List[dict] = []
        out = _train(lambda: _bundle_loss(model, maskpack.prepare_batch(tb, backend="sdpa", padding_free=True)),
                     model, a.steps, a.lr, progress, "packed (maskpack)", grads)
        record("packed", out, f"1 x {real}", 0.0, grads, ref)
        del model, grads
    if "cp2" in a.layouts:
        why = None
        import torch.distributed as dist

        mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
        if not dist.is_available():
            why = "this torch is built without torch.distributed"
        elif a.cp_backend == "gloo" and not dist.is_gloo_available():
            why = "this torch has no gloo backend (torch.distributed.is_gloo_available() is False)"
        elif a.cp_backend == "mpi" and not dist.is_mpi_available():
            why = ("this torch is built without the MPI backend (torch.distributed.is_mpi_available() is False; "
                   "--cp-backend gloo needs none)")
        elif a.cp_backend == "mpi" and mpirun is None:
            why = "no mpirun or mpiexec on the PATH (Open MPI: tools/install_deps.sh; --cp-backend gloo needs none)"
        if why:
            notes.append(f"cp2 skipped: {why}; the other layouts ran")
            return
        progress(f"cp2: starting two {a.cp_backend} processes")
        try:
            if a.cp_backend == "mpi":
                got = _run_cp_mpi(a, batch, max(1, threads // 2), mpirun, progress)
            else:
                got = _run_cp(a, batch, max(1, threads // 2), progress)
        except RuntimeError as e:
            notes.append(f"cp2 failed: {e}")
            lay["cp2"] = {"error": str(e), "agree": False}
            return
        if got.get("note"):
            notes.append(got["note"])
        r = got["res"]
        each = r["tokens_each_rank"]
        total = sum(each)
        record("cp2", r, f"2 x {each[0]}" if len(set(each)) == 1 else " + ".join(map(str, each)),
               1 - real / total, got["grads"], ref)


# ---- printing -------------------------------------------------------------------------------------------------


_NAMES = {"padded": "padded (transformers)", "packed": "packed (maskpack)", "cp2": "cp=2 (2 {} procs)"}


def _fmt_diff(x: Optional[float], name: str) -> str:
    if x is None:
        return "reference" if name == "padded" else "-"
    return f"{x:.1e}"


def _verdict(res: Dict[str, Any]) -> str:
    lay = res["layouts"]
    if "padded" not in lay:
        return "no padded run to compare with (--layouts without padded)"
    failed = [n for n, e in lay.items() if "error" in e]
    differ = [n for n, e in lay.items() if "error" not in e and not e.get("agree", True)]
    parts = []
    if differ:
        parts.append(f"{', '.join(differ)} DISAGREE{'S' if len(differ) == 1 else ''} with the padded run")
    if failed:
        parts.append(f"{', '.join(failed)} FAILED to run")
    return "; ".join(parts) if parts else "every layout agrees"


def format_table(res: Dict[str, Any]) -> str:
    b, pl = res["batch"], res["plan"]
    lines = []
    s = res["sample"]
    lines.append(f"batch: {b['sequences']} sequences, {b['real_tokens']} tokens (lengths {b['lengths']}), drawn from "
                 f"{res['draw']['sequences']} of the length sample ({s['size']} SFT-like lengths, median {s['median']:.0f}, "
                 f"p99 {s['p99']:.0f}; divided by {res['draw']['scale']}); the planner's first row of {pl['capacity']} "
                 f"tokens ({pl['rows']} rows, fill {pl['fill']:.1%}, sequences rounded to multiples of {pl['multiple']} for cp=2)")
    if "model" in res:
        m = res["model"]
        lines.append(f"model: Qwen3.5 hybrid, {m['parameters'] / 1e6:.2f} M parameters, hidden {m['hidden_size']}, "
                     f"layers {'/'.join('GDN' if t == 'linear_attention' else 'attn' for t in m['layer_types'])} "
                     f"(GDN {m['linear_num_key_heads']}k/{m['linear_num_value_heads']}v heads, gated attention "
                     f"{m['num_attention_heads']}q/{m['num_key_value_heads']}kv heads), vocab {m['vocab_size']}; "
                     f"torch {res['torch']}, {res['threads']} threads")
    mc = res["machine"]
    lines.append(f"machine: {mc['cpu']}, {mc['cores']} cores, {mc['date']}, load average {mc['load_average']} at the "
                 f"start, {mc.get('load_average_end')} at the end")
    if res["layouts"]:
        lines.append("")
        ref_ms = res["layouts"].get("padded", {}).get("step_ms")
        hdr = (f"{'layout':<22} {'tokens':>10} {'pad':>6} {'step ms':>8} {'speed-up':>8}  {'loss per step':<30} "
               f"{'d loss':>9} {'d grad':>9}")
        lines.append(hdr)
        lines.append("-" * len(hdr))
        for name, e in res["layouts"].items():
            if "error" in e:
                lines.append(f"{_NAMES.get(name, name).format(res['cp_backend']):<22} failed: {e['error']}")
                continue
            losses = " ".join(f"{x:.4f}" for x in e["losses"])
            ok = "" if e.get("agree", True) else "  DIFFERS"
            sp = f"{ref_ms / e['step_ms']:.1f}x" if ref_ms else "-"
            lines.append(f"{_NAMES.get(name, name).format(res['cp_backend']):<22} {e['tokens']:>10} {e['pad_fraction']:>6.1%} {e['step_ms']:>8.1f} "
                         f"{sp:>8}  {losses:<30} {_fmt_diff(e.get('loss_diff'), name):>9} {_fmt_diff(e.get('grad_diff'), name):>9}{ok}")
        lines.append("step ms: median over the steps after the first; speed-up: the padded step's time over the layout's")
        lines.append(f"d loss, d grad: largest relative difference from the padded run over the steps "
                     f"(max|a-b| / max|b|; the gradient: every parameter as one vector); fp32 rounding limit {res['tolerance']:.0e}: "
                     + _verdict(res))
    if res["handoff"]:
        lines.append("")
        lines.append("what each attention backend is handed for this batch:")
        for be, kw in res["handoff"].items():
            lines.append(f"  {be}:")
            for k, v in kw.items():
                lines.append(f"    {k:<22} {_compact_str(v)}")
    if res["pictures"]:
        lines.append("")
        lines.append("pictures: " + ", ".join(f"{k} {v}" for k, v in res["pictures"].items()))
    for n in res["notes"]:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        a = _parser().parse_args(argv)
        if a.hidden % 16:
            raise _Usage(f"argument --hidden: expected a multiple of 16, found {a.hidden}")
        if a.tokens % 4:
            raise _Usage(f"argument --tokens: expected a multiple of 4 (each sequence is rounded up to the cp = 2 "
                         f"multiple, 4, and the rows must hold whole slots), found {a.tokens}")
        res = run(a)
    except _Usage as e:
        print(f"maskpack demo: {e}", file=sys.stderr)
        return 2
    except maskpack.Error as e:
        print(f"maskpack demo: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("maskpack demo: interrupted", file=sys.stderr)
        return 130
    if a.json:
        print(json.dumps(res, indent=1, default=str))
    else:
        print(format_table(res))
    return 0 if res["agree"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
