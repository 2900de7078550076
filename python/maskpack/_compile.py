"""torch.compile support: the moves and the derived outputs as torch custom ops with fake (meta)
implementations, so a compiled step that takes a layout built outside it traces without graph breaks
(``fullgraph=True``).

Dynamo traces maskpack's own Python bookkeeping (layout caches, plan lookups) but cannot trace a call
into the C extension. Under compilation the layout methods therefore hand the work to these ops,
naming each layout by a key into the registry of live layouts (``id(layout)``, held weakly: a compiled
graph keeps working while the layouts it was traced with live); the op resolves the move and caches
it on the layout outside the graph. Outside compilation nothing here runs.

* ``maskpack::move(xs, srcs, dst, spec, path, pad, threads, engine)``: a move between registered
  layouts; its autograd formula is the adjoint move (so compiled gradients equal eager ones, double
  backward included).
* ``maskpack::derived(key, name, args, device)``: a derived output of a registered layout
  (cu_seqlens, position_ids, masks, ...), computed on the host and placed on ``device``; the fake
  implementation is the same call on the meta device (shapes without data).
* ``maskpack::shift_labels(labels, key, ignore_index)``: next-token labels on the labels' device.
"""

from __future__ import annotations

import ast
from typing import Any, List, Optional, Sequence

import torch

import contextlib

from ._tensors import IN_OP, dtype_name

from ._layout import _LIVE


@contextlib.contextmanager
def _eager():
    """The ops' implementations call the ordinary (eager) methods, on real tensors: a fake
    implementation computes its shapes outside the fake-tensor mode (host buffers the C library fills)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    IN_OP[0] += 1
    try:
        with unset_fake_temporarily():
            yield
    finally:
        IN_OP[0] -= 1


def _lookup(key: int) -> Any:
    obj = _LIVE.get(key)
    if obj is None:
        from ._errors import Error

        raise Error(f"key: the layout {key} a compiled graph refers to no longer exists (keep the layout alive as "
                    "long as the compiled function that was traced with it)", "MASKPACK_ERR_NOT_FOUND",
                    argument="key")
    return obj


def _resolve(srcs: Sequence[int], dst: int, spec: str, path: str):
    """(source layout keys, destination key, what the move is, adjoint path) -> the _Move to run.
    spec: "" (srcs -> dst), "pack", "unpack", "shard,cp,rank,scheme,tp,align" or
    "gather,scheme,tp,align" (the parts of dst's shards -> dst); path: source indices of nested
    adjoints ("1" = the adjoint of source 1, "1.0" = that adjoint's adjoint)."""
    from ._moves import _Move, _cached, _plan, _PACK_PLAN, _UNPACK_PLAN

    layouts = [_lookup(k) for k in srcs]
    if spec == "pack":
        src = layouts[0]
        dst_l = src.packed_of()
        mv = _cached(src, _PACK_PLAN, lambda: _Move.create([src], dst_l))
    elif spec == "unpack":
        lay = layouts[0]
        src = lay.packed_of()
        mv = _cached(lay, _UNPACK_PLAN, lambda: _Move.create([src], lay))
    elif spec.startswith("shard,"):
        _, cp, rank, scheme, tp, align = spec.split(",")
        src = layouts[0]
        mv = _plan([src], src.cp_shard(int(cp), int(rank), scheme, int(tp), None if align == "None" else align))
    elif spec.startswith("gather,"):
        _, scheme, tp, align = spec.split(",")
        whole = _lookup(dst)
        cp = len(srcs)
        shards = [whole.cp_shard(cp, r, scheme=scheme, tp=int(tp), align=None if align == "None" else align)
                  for r in range(cp)]
        mv = _plan(shards, whole)
    else:
        mv = _plan(layouts, _lookup(dst))
    for s in filter(None, path.split(".")):
        mv = mv.adjoint(int(s))
    return mv


@torch.library.custom_op("maskpack::move", mutates_args=())
def move_op(xs: Sequence[torch.Tensor], srcs: Sequence[int], dst: int, spec: str, path: str, pad: float,
            threads: int, engine: str) -> torch.Tensor:
    from ._moves import _execute, _pick_engine

    xs = list(xs)
    with _eager():
        eng = _pick_engine(xs, None, engine or None)
        return _execute(_resolve(srcs, dst, spec, path), None, None, xs, None, pad, threads or None, eng)


@move_op.register_fake
def _move_fake(xs, srcs, dst, spec, path, pad, threads, engine):
    with _eager():
        mv = _resolve(srcs, dst, spec, path)
    trailing = tuple(xs[0].shape[len(mv.src_grids[0]):])
    return xs[0].new_empty(tuple(mv.dst_grid) + trailing)


def _move_setup(ctx, inputs, output):
    xs, srcs, dst, spec, path, pad, threads, engine = inputs
    ctx.args = (list(srcs), dst, spec, path, threads, engine)
    ctx.n = len(xs)


def _move_backward(ctx, grad):
    srcs, dst, spec, path, threads, engine = ctx.args
    grad = grad.contiguous()
    grads: List[Optional[torch.Tensor]] = [
        move_op([grad], srcs, dst, spec, f"{path}.{s}" if path else str(s), 0.0, threads, engine)
        for s in range(ctx.n)]
    return grads, None, None, None, None, None, None, None


move_op.register_autograd(_move_backward, setup_context=_move_setup)


def move(xs: list, srcs: list, dst: Any, spec: str, pad_value: Any, threads: Optional[int],
         engine: Optional[str]) -> torch.Tensor:
    """A move under compilation: layouts named by key, the move resolved (and cached) outside the graph."""
    pad = 0.0 if pad_value is None else float(pad_value)
    return move_op(list(xs), [id(s) for s in srcs], id(dst) if dst is not None else 0, spec, "", pad,
                   int(threads or 0), engine or "")


@torch.library.custom_op("maskpack::derived", mutates_args=())
def derived_op(key: int, name: str, args: str, device: torch.device) -> torch.Tensor:
    with _eager():
        return getattr(_lookup(key), name)(**ast.literal_eval(args), device=device)


@derived_op.register_fake
def _derived_fake(key, name, args, device):
    with _eager():
        meta = getattr(_lookup(key), name)(**ast.literal_eval(args), device="meta")
    return torch.empty(meta.shape, dtype=meta.dtype, device=device)


def derived(layout: Any, name: str, kwargs: dict, device: Any) -> torch.Tensor:
    """A derived output under compilation; kwargs are plain constants (strings, ints, bools, dtype names)."""
    args = {k: (dtype_name(v) if k == "dtype" and v is not None else v) for k, v in kwargs.items()}
    return derived_op(id(layout), name, repr(args), torch.device("cpu") if device is None else torch.device(device))


@torch.library.custom_op("maskpack::shift_labels", mutates_args=())
def shift_labels_op(labels: torch.Tensor, key: int, ignore_index: int) -> torch.Tensor:
    with _eager():
        return _lookup(key).shift_labels(labels, ignore_index=ignore_index, engine="torch")


@shift_labels_op.register_fake
def _shift_fake(labels, key, ignore_index):
    return torch.empty_like(labels)


def shift_labels(layout: Any, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    return shift_labels_op(labels, id(layout), int(ignore_index))
