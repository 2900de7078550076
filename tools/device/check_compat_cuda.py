"""check_compat_cuda.py: maskpack.compat's twins on an accelerator, for a machine with a GPU.

    bash tools/device/build_ext.sh /tmp/mp && PYTHONPATH=/tmp/mp python tools/device/check_compat_cuda.py

Every twin is called on device tensors and on the same CPU tensors; the results (every returned tensor,
every PackedSeqParams field, gradients) must be on the device and equal the CPU results bit for bit (the
CPU results are the ones `make test-conformance` proves equal to the upstream functions). The all-gather
of the postprocess twins is faked in one process (rank j's part is parts[j]), as in the conformance tests.
Exits non-zero when a check fails. ``--device cpu`` runs the script where no GPU is (both sides CPU)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import types

import torch

from maskpack.compat import mcore_bridge as mb
from maskpack.compat import megatron as mg
from maskpack.compat import swift as sw
from maskpack.compat import te
from maskpack.compat import twinkle as tk
from maskpack.compat import verl

FAILS = []
CHECKS = [0]


def same(a, b, what, dev):
    CHECKS[0] += 1
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            FAILS.append(f"{what}: lengths {len(a)} != {len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{what}[{i}]", dev)
        return
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            same(getattr(a, f.name), getattr(b, f.name), f"{what}.{f.name}", dev)
        return
    if isinstance(a, types.SimpleNamespace):
        a, b = vars(a), vars(b)
    if isinstance(a, dict):
        for k in a:
            same(a[k], b[k], f"{what}[{k!r}]", dev)
        return
    if not isinstance(a, torch.Tensor):
        if a != b and not (a is None and b is None):
            FAILS.append(f"{what}: {a!r} != {b!r}")
        return
    if a.is_nested:
        same(a.offsets(), b.offsets(), what + ".offsets()", dev)
        same(a.values(), b.values(), what + ".values()", dev)
        return
    if b.device.type != dev.type:
        FAILS.append(f"{what}: on {b.device}, expected {dev}")
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b.cpu()):
        FAILS.append(f"{what}: differs (dtype {a.dtype}/{b.dtype}, shape {tuple(a.shape)}/{tuple(b.shape)})")


@contextlib.contextmanager
def fake_all_gather(parts):
    old = torch.distributed.all_gather

    def all_gather(tensor_list, tensor, group=None, async_op=False):
        for j, t in enumerate(tensor_list):
            t.copy_(parts[j].detach().to(t.device))

    torch.distributed.all_gather = all_gather
    try:
        yield
    finally:
        torch.distributed.all_gather = old


def to(x, dev):
    if isinstance(x, torch.Tensor):
        if x.is_nested:
            return torch.nested.nested_tensor_from_jagged(x.values().to(dev), x.offsets().to(dev))
        return x.to(dev)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: to(getattr(x, f.name), dev) for f in dataclasses.fields(x)
                                         if isinstance(getattr(x, f.name), torch.Tensor)})
    if isinstance(x, types.SimpleNamespace):
        return types.SimpleNamespace(**{k: to(v, dev) for k, v in vars(x).items()})
    if isinstance(x, dict):
        return {k: to(v, dev) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to(v, dev) for v in x)
    return x


def both(fn, args, kw, dev, what):
    a = fn(*to(args, torch.device("cpu")), **kw)
    b = fn(*to(args, dev), **kw)
    same(a, b, what, dev)
    return a, b


def grad_check(fn, x, args_after, kw, parts, dev, what):
    """fn(x, *args_after) on both devices inside a faked all-gather; the gradient of sum(out * w)."""
    outs = []
    for d in (torch.device("cpu"), dev):
        xi = x.detach().to(d).requires_grad_(True)
        with fake_all_gather(to(parts, d)):
            o = fn(xi, *to(args_after, d), **kw)
        v = o.values() if o.is_nested else o
        w = torch.linspace(-1, 1, v.numel(), dtype=v.dtype, device=d).view_as(v)
        (v * w).sum().backward()
        outs.append((o, xi.grad))
    same(outs[0][0], outs[1][0], what, dev)
    same(outs[0][1], outs[1][1], what + " grad", dev)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    dev = torch.device(ap.parse_args().device)
    g = torch.Generator().manual_seed(0)
    B, S, H = 5, 37, 3
    lens = torch.tensor([37, 20, 1, 9, 30])
    mask = torch.zeros(B, S, dtype=torch.bool)
    for i, n in enumerate(lens.tolist()):
        (mask[i, S - n:] if i % 2 else mask[i, :n]).fill_(True)
    ids = torch.randint(1, 1000, (B, S), generator=g)
    hidden = torch.randn(B, S, H, generator=g, dtype=torch.float64)
    nested = torch.nested.as_nested_tensor([ids[i][mask[i]] for i in range(B)], layout=torch.jagged)
    nested_h = torch.nested.as_nested_tensor([hidden[i][mask[i]] for i in range(B)], layout=torch.jagged)
    for tp, cp in ((1, 1), (2, 2), (1, 4)):
        for fp8 in (False, True):
            for r in range(cp):
                kw = dict(tp=tp, cp=cp, cp_rank=r)
                both(verl.preprocess_packed_seqs, (ids, mask, True, fp8), kw, dev, f"preprocess_packed_seqs {tp} {cp} {r}")
                for roll in (False, True):
                    for lay in ("zigzag", "contiguous"):
                        both(verl.preprocess_thd_engine, (nested, True, roll, fp8, None, None, None, lay), kw, dev,
                             f"preprocess_thd_engine {tp} {cp} {r} {roll} {lay}")
                    for npu in (False, True):
                        both(verl.preprocess_bshd_engine, (nested, True, roll, fp8, None), dict(kw, npu=npu), dev,
                             f"preprocess_bshd_engine {tp} {cp} {r} {roll} {npu}")
            parts = [verl.preprocess_packed_seqs(hidden, mask, True, fp8, tp=tp, cp=cp, cp_rank=r)[0] for r in range(cp)]
            params = verl.preprocess_packed_seqs(hidden, mask, True, fp8, tp=tp, cp=cp, cp_rank=0)[1]
            for r in range(cp):
                grad_check(verl.postprocess_packed_seqs, parts[r], (params, mask, B, S, True), dict(cp=cp, cp_rank=r),
                           parts, dev, f"postprocess_packed_seqs {tp} {cp} {r}")
            tparts = [verl.preprocess_thd_engine(nested_h, True, False, fp8, tp=tp, cp=cp, cp_rank=r)[0]
                      for r in range(cp)]
            tparams = verl.preprocess_thd_engine(nested_h, True, False, fp8, tp=tp, cp=cp, cp_rank=0)[1]
            for r in range(cp):
                grad_check(verl.postprocess_thd_engine, tparts[r], (tparams, nested, B), dict(cp=cp, cp_rank=r),
                           tparts, dev, f"postprocess_thd_engine {tp} {cp} {r}")
        both(verl.build_vlm_attn_mask_thd, (nested, 0), dict(tp=tp, cp=cp), dev, "build_vlm_attn_mask_thd")
        both(verl.build_vlm_attn_mask_bshd, (nested, B, 0, None), dict(tp=tp, cp=cp, npu=False), dev,
             "build_vlm_attn_mask_bshd")
    # Megatron / TransformerEngine / mcore-bridge / ms-swift / twinkle on a packed stream
    slots = lens + (-lens) % 8
    cu_pad = torch.zeros(B + 1, dtype=torch.int32)
    cu_pad[1:] = torch.cumsum(slots, 0)
    cu_real = torch.zeros(B + 1, dtype=torch.int32)
    cu_real[1:] = torch.cumsum(lens, 0)
    total = int(cu_pad[-1])
    stream = torch.randn(total, 2, generator=g)
    row = torch.randint(1, 99, (1, total), generator=g)
    psp = types.SimpleNamespace(cu_seqlens_q=cu_pad, cu_seqlens_q_padded=cu_pad)
    for cp in (1, 2, 4):
        for r in range(cp):
            both(te.thd_get_partitioned_indices, (cu_pad, total, cp, r), {}, dev, f"thd_get_partitioned_indices {cp} {r}")
            both(te.get_cu_seqlens_on_cp_rank, (cu_real, cu_pad // cp, cp, r, True, True), {}, dev,
                 "get_cu_seqlens_on_cp_rank")
            both(te.get_batch_on_this_cp_rank, (cu_pad, row, row[0], row[0]), dict(cp=cp, cp_rank=r), dev,
                 "te.get_batch_on_this_cp_rank")
            both(mb.split_cp_inputs, (row, cu_pad, -1), dict(cp=cp, cp_rank=r), dev, "split_cp_inputs")
            both(mg.get_batch_on_this_cp_rank, ({"tokens": ids[:, :32], "labels": ids[:, :32]},), dict(cp=cp, cp_rank=r),
                 dev, "megatron.get_batch_on_this_cp_rank")
        both(mg.undo_attention_load_balancing, (stream, cp, psp), {}, dev, "undo_attention_load_balancing")
        both(mg.redo_attention_load_balancing, (stream, cp, psp), {}, dev, "redo_attention_load_balancing")
    both(mg.roll_tensor, (row.float(), -1, -1, None, psp), {}, dev, "roll_tensor")
    both(te.pad_thd_sequences_for_cp, (nested.values(), nested.values(), cu_real, 8), {}, dev, "pad_thd_sequences_for_cp")
    pos = torch.cat([torch.arange(int(n)) for n in slots]).unsqueeze(0)
    both(sw.get_packed_seq_params, (pos,), {}, dev, "swift.get_packed_seq_params")
    both(tk.get_packed_seq_params, (pos,), dict(npu=False), dev, "twinkle.get_packed_seq_params")
    args = types.SimpleNamespace(is_multimodal=False, task_type="causal_lm", cp_partition_mode="zigzag")
    batch = {"input_ids": row, "labels": row, "position_ids": pos, "packed_seq_params": types.SimpleNamespace(cu_seqlens_q=cu_pad)}
    both(lambda b: sw.get_batch_on_this_cp_rank(args, dict(b), cp=2, cp_rank=1, npu=False), (batch,), {}, dev,
         "swift.get_batch_on_this_cp_rank")
    both(lambda b: tk.split_cp([dict(b)], cp=2, cp_rank=1), (batch,), {}, dev, "twinkle.split_cp")
    pad_in = {"input_ids": nested.values().unsqueeze(0), "labels": nested.values().unsqueeze(0),
              "position_ids": torch.cat([torch.arange(int(n)) for n in lens]).unsqueeze(0)}
    both(lambda b: tk.pad_cp([dict(b)], cp=2, tp=1), (pad_in,), {}, dev, "twinkle.pad_cp")
    print(f"check_compat_cuda on {dev}: {CHECKS[0]} comparisons, {len(FAILS)} failures")
    for f in FAILS[:40]:
        print("  FAIL", f)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
