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
from typing import Any, List, Optional, Sequence, Tuple

import contextlib
import itertools
import weakref

import numpy as np
import torch

from ._attention import _forward, _lse_shape, _scale, _softcap, attention_backward
from ._errors import Error
from ._layout import _LIVE
from ._moves import _Move, _PACK_PLAN, _UNPACK_PLAN, _execute, _pick_engine, _plan
from ._runtime import cached as _cached, threads as gdn_threads
from ._tensors import IN_OP, ISA_CODES, dtype_name
from .distributed import (_cp_method, attention_cp, causal_conv1d_cp, causal_conv1d_sp, cp_loss, gated_delta_rule_cp,
                          gated_delta_rule_sp)
from .gdn import _CHECKED, _ConvFn, _GatesFn, _L2Fn, _RuleFn, _call_layout, _check_cp_offsets


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
        raise Error(f"key: the layout {key} a compiled graph refers to no longer exists (keep the layout alive as "
                    "long as the compiled function that was traced with it)", "MASKPACK_ERR_NOT_FOUND",
                    argument="key")
    return obj


def _resolve(srcs: Sequence[int], dst: int, spec: str, path: str):
    """(source layout keys, destination key, what the move is, adjoint path) -> the _Move to run.
    spec: "" (srcs -> dst), "pack", "unpack", "shard,cp,rank,scheme,tp,align" or
    "gather,scheme,tp,align" (the parts of dst's shards -> dst); path: source indices of nested
    adjoints ("1" = the adjoint of source 1, "1.0" = that adjoint's adjoint)."""
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


def _key(layout: Any) -> int:
    """A layout's registry key (a key already: as it is)."""
    return layout if isinstance(layout, int) else id(layout)


def derived(layout: Any, name: str, kwargs: dict, device: Any) -> torch.Tensor:
    """A derived output under compilation; kwargs are plain constants (strings, ints, bools, dtype names)."""
    args = {k: (dtype_name(v) if k == "dtype" and v is not None else v) for k, v in kwargs.items()}
    return derived_op(_key(layout), name, repr(args), torch.device("cpu") if device is None else torch.device(device))


@torch.library.custom_op("maskpack::shift_labels", mutates_args=())
def shift_labels_op(labels: torch.Tensor, key: int, ignore_index: int) -> torch.Tensor:
    with _eager():
        return _lookup(key).shift_labels(labels, ignore_index=ignore_index, engine="torch")


@shift_labels_op.register_fake
def _shift_fake(labels, key, ignore_index):
    return torch.empty_like(labels)


def shift_labels(layout: Any, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    return shift_labels_op(labels, id(layout), int(ignore_index))


# ---- the kernels: attention, the gated delta rule, the conv, the gates, the L2 norm ----------------
#
# Each kernel is one custom op for its forward and one for its backward; the forward's autograd
# formula calls the backward op, so a compiled step's gradients come from the same C backward as an
# eager step's. Scalars cross as numbers (threads 0 = the default count, resolved inside the op, since
# torch.get_num_threads() breaks a Dynamo graph), the layout as its registry key.

Tensor = torch.Tensor


def _like(x: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A fake output of x's shape (and dtype unless given), contiguous as every op's real output is
    (torch.empty_like would keep x's strides, and inductor checks the real strides against the fake's)."""
    return x.new_empty(tuple(x.shape), dtype=x.dtype if dtype is None else dtype)


def _absent() -> torch.Tensor:
    # an op cannot return None: the gradient of an absent input crosses as a 0-element tensor (dropped)
    return torch.empty(0, dtype=torch.uint8)


@torch.library.custom_op("maskpack::attention", mutates_args=())
def attention_op(q: Tensor, k: Tensor, v: Tensor, key: int, scale: float, softcap: float, threads: int,
                 isa: int) -> Tuple[Tensor, Tensor]:
    with _eager():
        return _forward(q, k, v, _lookup(key), scale or None, softcap, None, threads or None, isa)


@attention_op.register_fake
def _attention_fake(q, k, v, key, scale, softcap, threads, isa):
    return _like(q), q.new_empty(_lse_shape(None, q), dtype=torch.float32)


@torch.library.custom_op("maskpack::attention_backward", mutates_args=())
def attention_backward_op(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, key: int,
                          scale: float, softcap: float, threads: int, isa: int) -> Tuple[Tensor, Tensor, Tensor]:
    names = {c: n for n, c in ISA_CODES.items()}
    with _eager():
        return attention_backward(dout.contiguous(), q, k, v, out, lse, _lookup(key), scale or None, softcap,
                                  threads or None, isa=names[isa])


@attention_backward_op.register_fake
def _attention_backward_fake(dout, q, k, v, out, lse, key, scale, softcap, threads, isa):
    return _like(q), _like(k), _like(v)


def _attention_setup(ctx, inputs, output):
    q, k, v, key, scale, softcap, threads, isa = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.args = (key, scale, softcap, threads, isa)


def _attention_grad(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = attention_backward_op(dout.contiguous(), q, k, v, out, lse, *ctx.args)
    return dq, dk, dv, None, None, None, None, None


attention_op.register_autograd(_attention_grad, setup_context=_attention_setup)


def attention(q, k, v, layout, scale, softcap, threads, isa: int):
    """maskpack.attention under compilation -> (out, lse); lse is not differentiable (its gradient is dropped)."""
    return attention_op(q, k, v, _key(layout), _scale(scale), _softcap(softcap), int(threads or 0), int(isa))


@torch.library.custom_op("maskpack::gated_delta_rule", mutates_args=())
def gdn_rule_op(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, h0: Optional[Tensor], key: int,
                scale: float, chunked: bool, l2norm: bool, threads: int, isa: int,
                check_gate: bool) -> Tuple[Tensor, Tensor]:
    class _Ctx:  # the Function's forward fills a context the op does not keep
        def save_for_backward(self, *a):
            pass

    with _eager():
        return _RuleFn.forward(_Ctx(), q, k, v, g, beta, h0, _lookup(key), scale, chunked, l2norm,
                               gdn_threads(threads or None), isa, check_gate)


@gdn_rule_op.register_fake
def _gdn_rule_fake(q, k, v, g, beta, h0, key, scale, chunked, l2norm, threads, isa, check_gate):
    n_seg = _lookup(key).n_segments
    return _like(v), v.new_empty((n_seg, v.shape[-2], q.shape[-1], v.shape[-1]), dtype=torch.float32)


@torch.library.custom_op("maskpack::gated_delta_rule_backward", mutates_args=())
def gdn_rule_backward_op(do: Tensor, dht: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                         h0: Optional[Tensor], key: int, scale: float, l2norm: bool, threads: int, isa: int,
                         check_gate: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    class _Ctx:
        saved_tensors = (q, k, v, g, beta, h0)
        needs_input_grad = (True, True, True, True, True, h0 is not None)

    c = _Ctx()
    c.layout, c.scale, c.chunked, c.l2norm = _lookup(key), scale, True, l2norm
    c.threads, c.isa, c.check_gate = gdn_threads(threads or None), isa, check_gate
    with _eager():
        dq, dk, dv, dg, db, dh0 = _RuleFn.backward(c, do.contiguous(), dht.contiguous())[:6]
    return dq, dk, dv, dg, db, _absent() if dh0 is None else dh0


@gdn_rule_backward_op.register_fake
def _gdn_rule_backward_fake(do, dht, q, k, v, g, beta, h0, key, scale, l2norm, threads, isa, check_gate):
    dh0 = _absent() if h0 is None else torch.empty(h0.shape, dtype=torch.float32, device=h0.device)
    return _like(q), _like(k), _like(v), _like(g), _like(beta), dh0


def _gdn_rule_setup(ctx, inputs, output):
    q, k, v, g, beta, h0, key, scale, chunked, l2norm, threads, isa, check_gate = inputs
    ctx.save_for_backward(q, k, v, g, beta, h0)
    ctx.args = (key, scale, l2norm, threads, isa, check_gate)


def _gdn_rule_grad(ctx, do, dht):
    q, k, v, g, beta, h0 = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(v)
    if dht is None:
        dht = v.new_zeros((_lookup(ctx.args[0]).n_segments, v.shape[-2], q.shape[-1], v.shape[-1]),
                          dtype=torch.float32)
    dq, dk, dv, dg, db, dh0 = gdn_rule_backward_op(do, dht, q, k, v, g, beta, h0, *ctx.args)
    return dq, dk, dv, dg, db, (None if h0 is None else dh0), None, None, None, None, None, None, None


gdn_rule_op.register_autograd(_gdn_rule_grad, setup_context=_gdn_rule_setup)


def gated_delta_rule(q, k, v, g, beta, h0, layout, scale: float, chunked: bool, l2norm: bool,
                     threads: Optional[int], isa: int, check_gate: bool):
    """maskpack.gated_delta_rule under compilation -> (o, final_state)."""
    return gdn_rule_op(q, k, v, g, beta, h0, id(layout), float(scale), bool(chunked), bool(l2norm),
                       int(threads or 0), int(isa), bool(check_gate))


@torch.library.custom_op("maskpack::causal_conv1d", mutates_args=())
def conv1d_op(x: Tensor, weight: Tensor, prefix: Optional[Tensor], key: int, silu: bool, threads: int,
              isa: int) -> Tuple[Tensor, Tensor]:
    class _Ctx:
        def save_for_backward(self, *a):
            pass

    with _eager():
        return _ConvFn.forward(_Ctx(), x, weight, prefix, _lookup(key), silu, gdn_threads(threads or None), None,
                               isa)


@conv1d_op.register_fake
def _conv1d_fake(x, weight, prefix, key, silu, threads, isa):
    n_seg = _lookup(key).n_segments
    return _like(x), x.new_empty((n_seg, weight.shape[0], weight.shape[1] - 1), dtype=torch.float32)


@torch.library.custom_op("maskpack::causal_conv1d_backward", mutates_args=())
def conv1d_backward_op(dy: Tensor, dstate: Tensor, x: Tensor, weight: Tensor, prefix: Optional[Tensor], key: int,
                       silu: bool, threads: int, isa: int) -> Tuple[Tensor, Tensor, Tensor]:
    class _Ctx:
        saved_tensors = (x, weight, prefix)
        needs_input_grad = (True, True, prefix is not None)

    c = _Ctx()
    c.layout, c.silu, c.threads, c.isa = _lookup(key), silu, gdn_threads(threads or None), isa
    with _eager():
        dx, dw, dp = _ConvFn.backward(c, dy.contiguous(), dstate.contiguous())[:3]
    return dx, dw, _absent() if dp is None else dp


@conv1d_backward_op.register_fake
def _conv1d_backward_fake(dy, dstate, x, weight, prefix, key, silu, threads, isa):
    return _like(x), _like(weight), _absent() if prefix is None else _like(prefix)


def _conv1d_setup(ctx, inputs, output):
    x, weight, prefix, key, silu, threads, isa = inputs
    ctx.save_for_backward(x, weight, prefix)
    ctx.args = (key, silu, threads, isa)


def _conv1d_grad(ctx, dy, dstate):
    x, weight, prefix = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(x)
    if dstate is None:
        dstate = x.new_zeros((_lookup(ctx.args[0]).n_segments, weight.shape[0], weight.shape[1] - 1),
                             dtype=torch.float32)
    dx, dw, dp = conv1d_backward_op(dy, dstate, x, weight, prefix, *ctx.args)
    return dx, dw, (None if prefix is None else dp), None, None, None, None


conv1d_op.register_autograd(_conv1d_grad, setup_context=_conv1d_setup)


def causal_conv1d(x, weight2d, prefix, layout, silu: bool, threads: Optional[int], isa: int):
    """maskpack.causal_conv1d under compilation (weight as [C, W]) -> (y, conv_state)."""
    return conv1d_op(x, weight2d, prefix, id(layout), bool(silu), int(threads or 0), int(isa))


@torch.library.custom_op("maskpack::gdn_gates", mutates_args=())
def gates_op(a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, key: int) -> Tuple[Tensor, Tensor]:
    class _Ctx:
        def save_for_backward(self, *a):
            pass

    with _eager():
        return _GatesFn.forward(_Ctx(), a, b, A_log, dt_bias, _lookup(key))


@gates_op.register_fake
def _gates_fake(a, b, A_log, dt_bias, key):
    return _like(a, torch.float32), _like(b, torch.float32)


@torch.library.custom_op("maskpack::gdn_gates_backward", mutates_args=())
def gates_backward_op(dg: Tensor, dbeta: Tensor, a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor,
                      key: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    class _Ctx:
        saved_tensors = (a, b, A_log, dt_bias)
        needs_input_grad = (True, True, True, True)

    c = _Ctx()
    c.layout = _lookup(key)
    with _eager():
        return tuple(_GatesFn.backward(c, dg.contiguous(), dbeta.contiguous())[:4])


@gates_backward_op.register_fake
def _gates_backward_fake(dg, dbeta, a, b, A_log, dt_bias, key):
    return _like(a), _like(b), _like(A_log), _like(dt_bias)


def _gates_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:4])
    ctx.key = inputs[4]


def _gates_grad(ctx, dg, dbeta):
    a, b, A_log, dt_bias = ctx.saved_tensors
    dg = torch.zeros_like(a, dtype=torch.float32) if dg is None else dg
    dbeta = torch.zeros_like(b, dtype=torch.float32) if dbeta is None else dbeta
    return (*gates_backward_op(dg, dbeta, a, b, A_log, dt_bias, ctx.key), None)


gates_op.register_autograd(_gates_grad, setup_context=_gates_setup)


def gdn_gates(a, b, A_log, dt_bias, layout):
    return gates_op(a, b, A_log, dt_bias, _key(layout))


@torch.library.custom_op("maskpack::gdn_l2norm", mutates_args=())
def l2norm_op(x: Tensor, key: int, eps: float) -> Tensor:
    class _Ctx:
        def save_for_backward(self, *a):
            pass

    with _eager():
        return _L2Fn.forward(_Ctx(), x, _lookup(key), eps)


@l2norm_op.register_fake
def _l2norm_fake(x, key, eps):
    return _like(x)


@torch.library.custom_op("maskpack::gdn_l2norm_backward", mutates_args=())
def l2norm_backward_op(dy: Tensor, x: Tensor, key: int, eps: float) -> Tensor:
    class _Ctx:
        saved_tensors = (x,)

    c = _Ctx()
    c.layout, c.eps = _lookup(key), eps
    with _eager():
        return _L2Fn.backward(c, dy.contiguous())[0]


@l2norm_backward_op.register_fake
def _l2norm_backward_fake(dy, x, key, eps):
    return _like(x)


def _l2norm_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.args = inputs[1:]


def _l2norm_grad(ctx, dy):
    (x,) = ctx.saved_tensors
    return l2norm_backward_op(dy, x, *ctx.args), None, None


l2norm_op.register_autograd(_l2norm_grad, setup_context=_l2norm_setup)


def gdn_l2norm(x, layout, eps: float):
    return l2norm_op(x, id(layout), float(eps))


# ---- a patched linear-attention layer's boundaries, checked at run time ---------------------------


@torch.library.custom_op("maskpack::check_call", mutates_args=())
def check_call_op(hidden_states: Tensor, attention_mask: Optional[Tensor], forms: List[Optional[Tensor]],
                  key: int, tail_padding: bool) -> Tensor:
    """The patched layer's reading of its call (maskpack.gdn._call_layout: every form present must agree
    with the maskpack_layout, tokens left out must be marked padding) on the call's real tensors;
    raises maskpack.Error as the eager call does, else returns True."""
    kwargs = {n: f for n, f in zip(_CHECKED, forms) if f is not None}  # forms: one per name of _CHECKED
    kwargs["maskpack_layout"] = _lookup(key)
    with _eager():
        _call_layout(hidden_states, attention_mask, kwargs, tail_padding)
    return torch.ones((), dtype=torch.bool, device=hidden_states.device)


@check_call_op.register_fake
def _check_call_fake(hidden_states, attention_mask, forms, key, tail_padding):
    return hidden_states.new_empty((), dtype=torch.bool)


def check_call(hidden_states, attention_mask, forms, layout, tail_padding: bool):
    return check_call_op(hidden_states.detach(), attention_mask, forms, id(layout), bool(tail_padding))


# ---- the context-parallel calls ------------------------------------------------------------------
#
# A CP call is a composition of kernels and collectives (all-to-alls, the ring's point-to-point
# sends, the agreement every call starts with) whose backward runs collectives of its own. Under
# compilation the whole call is one opaque op: its implementation runs the eager call with autograd
# on, keeps that call's graph under a token, and the backward op runs torch.autograd.grad on it, so
# the compiled step sends and receives exactly what the eager step does, in the same order on every
# rank. The token is an int64 tensor over numpy memory: when the last tensor sharing it goes (the
# backward ran, or the graph holding it was freed without one), the kept graph is dropped with it.
# The group crosses by name (torch.distributed's registry of groups, as functional collectives do).

_KEPT: dict = {}
_TOKENS = itertools.count(1)
# the dispatch keys a plain thread excludes (autocast's); an op's implementation runs with autograd
# excluded as well, which the kept call needs back
_PLAIN_EXCLUDE = torch._C._dispatch_tls_local_exclude_set()


@contextlib.contextmanager
def _autograd_on():
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), _PLAIN_EXCLUDE), \
            torch.enable_grad():
        yield


def _group(name: str):
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def _present(xs):
    """The list an op was given, absent arguments (see _absent) as None again."""
    return [None if x.dtype == torch.uint8 and x.dim() == 1 and x.shape[0] == 0 else x for x in xs]


def _cp_attention(xs, layout, group, kw):
    return tuple(attention_cp(*xs, layout, group, **kw))


def _cp_gdn(xs, layout, group, kw):
    q, k, v, g, beta, h0 = xs
    kw = dict(kw)
    fn = gated_delta_rule_sp if _cp_method(kw.pop("cp_method"), group, q.shape[-2], v.shape[-2]) == "sequence" \
        else gated_delta_rule_cp
    return tuple(fn(q, k, v, g, beta, layout, group, initial_state=h0, **kw))


def _cp_conv(xs, layout, group, kw):
    x, weight, prefix = xs
    kw = dict(kw)
    fn = causal_conv1d_sp if _cp_method(kw.pop("cp_method"), group, x.shape[-1], x.shape[-1]) == "sequence" \
        else causal_conv1d_cp
    return tuple(fn(x, weight, layout, group, prefix=prefix, **kw))


def _cp_loss(xs, layout, group, kw):
    return (cp_loss(xs[0], xs[1], group),)


def _fake_attention(xs, layout):
    return [_like(xs[0]), xs[0].new_empty(_lse_shape(None, xs[0]), dtype=torch.float32)]


def _fake_gdn(xs, layout):
    q, v = xs[0], xs[2]
    return [_like(v), v.new_empty((layout.n_segments, v.shape[-2], q.shape[-1], v.shape[-1]),
                                             dtype=torch.float32)]


def _fake_conv(xs, layout):
    x, w = xs[0], xs[1]
    return [_like(x), x.new_empty((layout.n_segments, w.shape[0], w.shape[-1] - 1), dtype=torch.float32)]


def _fake_loss(xs, layout):
    return [xs[0].new_empty((), dtype=torch.result_type(xs[0], xs[0]))]


_CP_CALLS = {"attention": (_cp_attention, _fake_attention), "gated_delta_rule": (_cp_gdn, _fake_gdn),
             "causal_conv1d": (_cp_conv, _fake_conv), "cp_loss": (_cp_loss, _fake_loss)}
# the outputs of a call that take no gradient (attention's lse, as in the eager call): marked so, the
# compiled call's lse does not require grad either
_CP_NO_GRAD = {"attention": (1,)}


@torch.library.custom_op("maskpack::cp_call", mutates_args=())
def cp_call_op(xs: List[Tensor], want: List[bool], call: str, key: int, group: str, args: str) -> List[Tensor]:
    """The eager CP call ``call`` on xs (want[i]: xs[i] takes a gradient; an absent argument is a
    0-element uint8 tensor, since torch's autograd of a custom op skips a list holding None) -> its
    outputs and the token of its kept graph (-1: none kept)."""
    xs = _present(xs)
    fn = _CP_CALLS[call][0]
    layout = _lookup(key) if key else None
    with _eager(), _autograd_on():
        leaves = [None if x is None else x.detach().requires_grad_(bool(w) and x.is_floating_point())
                  for x, w in zip(xs, want)]
        outs = fn(leaves, layout, _group(group), ast.literal_eval(args))
    keep = any(o.requires_grad for o in outs)
    tok = next(_TOKENS) if keep else -1
    cell = np.array([tok], dtype=np.int64)
    if keep:
        _KEPT[tok] = (leaves, outs)
        weakref.finalize(cell, _KEPT.pop, tok, None)
    return [o.detach().contiguous() for o in outs] + [torch.from_numpy(cell)]


@cp_call_op.register_fake
def _cp_call_fake(xs, want, call, key, group, args):
    xs = _present(xs)
    layout = _lookup(key) if key else None
    return _CP_CALLS[call][1](xs, layout) + [torch.empty((1,), dtype=torch.int64)]


@torch.library.custom_op("maskpack::cp_call_backward", mutates_args=())
def cp_call_backward_op(token: Tensor, grads: List[Optional[Tensor]], xs: List[Tensor],
                        want: List[bool]) -> List[Tensor]:
    entry = _KEPT.pop(int(token[0]), None)
    if entry is None:
        raise Error("token: the forward of this context-parallel call is gone (its backward runs once, while the "
                    "graph of the step that made it lives)", "MASKPACK_ERR_NOT_FOUND", argument="token")
    leaves, outs = entry
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
    need = [x for x in leaves if x is not None and x.requires_grad]
    with _eager(), _autograd_on():
        res = iter(torch.autograd.grad([o for o, _ in pairs], need, [g for _, g in pairs], allow_unused=True))
    out = []
    for x in leaves:
        if x is not None and x.requires_grad:
            r = next(res)
            out.append(torch.zeros(x.shape, dtype=x.dtype, device=x.device) if r is None else r.contiguous())
        else:
            out.append(_absent())
    return out


@cp_call_backward_op.register_fake
def _cp_call_backward_fake(token, grads, xs, want):
    xs = _present(xs)
    return [_like(x) if x is not None and w and x.is_floating_point() else _absent()
            for x, w in zip(xs, want)]


def _cp_call_setup(ctx, inputs, output):
    xs, want, call, key, group, args = inputs
    ctx.save_for_backward(output[-1], *xs)
    ctx.want = list(want)
    if call in _CP_NO_GRAD:
        ctx.mark_non_differentiable(*(output[i] for i in _CP_NO_GRAD[call]))


def _cp_call_grad(ctx, grads):
    token, *given = ctx.saved_tensors
    res = cp_call_backward_op(token, list(grads[:-1]), given, ctx.want)
    xs = _present(given)
    out = [r if x is not None and w and x.is_floating_point() else None for r, x, w in zip(res, xs, ctx.want)]
    return out, None, None, None, None, None


cp_call_op.register_autograd(_cp_call_grad, setup_context=_cp_call_setup)


def cp_call(call: str, xs: list, layout: Any, group: Any, kwargs: dict) -> tuple:
    """A CP call under compilation -> its outputs (a tuple); kwargs are plain constants."""
    record = torch.is_grad_enabled()
    want = [bool(record and x is not None and x.requires_grad) for x in xs]
    outs = cp_call_op([_absent() if x is None else x for x in xs], want, call, _key(layout) if layout is not None else 0, group.group_name,
                      repr(kwargs))
    return tuple(outs[:-1])


@torch.library.custom_op("maskpack::check_cp_offsets", mutates_args=())
def check_cp_offsets_op(hidden_states: Tensor, key: int, cu: Tensor) -> Tensor:
    """A CP call's cu_seq_lens_q against its maskpack_layout (maskpack.gdn._check_cp_offsets) -> True."""
    with _eager():
        _check_cp_offsets(_lookup(key), cu)
    return torch.ones((), dtype=torch.bool, device=hidden_states.device)


@check_cp_offsets_op.register_fake
def _check_cp_offsets_fake(hidden_states, key, cu):
    return hidden_states.new_empty((), dtype=torch.bool)


def check_cp_offsets(hidden_states, layout, cu):
    return check_cp_offsets_op(hidden_states.detach(), id(layout), torch.as_tensor(cu))
