"""Gated DeltaNet (the linear-attention layer of Qwen3-Next / Qwen3.5) over a maskpack layout.

Every op runs per segment of the layout, so a padded batch and the packed batch of the same
sequences give bitwise equal results, padding is never read (a NaN there changes nothing) and
padded output rows are exactly 0. Tensors are torch CPU tensors in the layout's token order with
heads second-to-last: ``[B, S, H, D]`` for a padded layout, ``[T, H, D]`` for a packed one.

    >>> o, state = maskpack.gated_delta_rule(q, k, v, g, beta, layout)      # doctest: +SKIP
    >>> y, conv_state = maskpack.causal_conv1d(x, weight, layout)           # doctest: +SKIP

Autograd flows through every op (the backward runs in C as well). ``GatedDeltaNet`` is the whole
layer with the parameter names of transformers' ``Qwen3NextGatedDeltaNet`` or (``projections=
"qwen3_5"``) ``Qwen3_5GatedDeltaNet``, so either state dict loads directly.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, Optional, Tuple

import torch

from ._maskpack import gdn as _gdn
from ._alloc import fresh
from ._errors import Error
from ._tensors import check_layout, check_threads, compiling, isa_code, layout_handle, named_dtype_code
from ._tensors import describe_kernel as _d  # the package's one check of a kernel's tensor argument
from ._runtime import cache_of as _cache_of, team as _team, threads as _threads
from ._runtime import above as _above  # the layers above this one, by name (see there)

__all__ = [
    "GatedDeltaNet",
    "fla_cp_kwargs",
    "patch_linear_attention",
    "GatedRMSNorm",
    "causal_conv1d",
    "gated_delta_rule",
    "gdn_gates",
    "gdn_isa",
    "gdn_l2norm",
]

def _check_call(layout: Any, **tensors: Any) -> None:
    """The arguments a kernel reads before anything is computed from them: torch tensors (numpy
    arrays and lists are a TypeError naming the argument, not an AttributeError from deep inside)
    and a maskpack.Layout."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, found {type(t).__module__}.{type(t).__name__}")
    check_layout(layout)


# (dtype) -> the rule's kernel name here for inputs of that dtype ("avx512", "avx2", "ref", ...)
def gdn_isa(dtype: Any = "float32") -> str:
    """The kernel the rule runs here for q, k, v of ``dtype`` (float32 or bfloat16): under ``AUTO``,
    ``"amx"`` for bfloat16 on a CPU with AMX (the chunk products on the tiles, TDPBF16PS), else
    ``"avx512"``, ``"avx2"`` or ``"ref"``, for either dtype. Without AMX, bfloat16 inputs are converted
    once to float32 as they are loaded and run the float32 kernel: the bf16 dot-product kernel
    (``"avx512_bf16"``, chunk products on VDPBF16PS) is taken only when asked for by name, since on the
    CPUs it was measured on its dot products run at half the f32 FMA rate (docs/kernels.md).
    ``MASKPACK_ISA`` forces one (float32 inputs asking for ``amx`` or ``avx512_bf16`` run the AVX-512
    kernel); forcing one the CPU lacks raises ``MASKPACK_ERR_UNSUPPORTED`` (never a silent fallback).
    """
    return _gdn.resolve_isa(named_dtype_code(dtype))


# ---- on accelerators: flash-linear-attention's kernels over maskpack's boundaries -------------------
#
# maskpack's kernels are CPU code. Tensors on another device run flash-linear-attention's Triton kernels
# (chunk_gated_delta_rule and causal_conv1d with cu_seqlens) over the boundaries the layout gives, in
# whatever form the caller described them: the tokens move (differentiably, by torch indexing on the
# device) into the layout's packed form, the one fla reads, and the outputs move back (pad rows 0).
# fla is optional: missing, the call raises maskpack.Error naming the package, never another path.

# Tests: {"rule": fn, "conv": fn} standing in for fla's two functions (same signatures); while set, CPU
# tensors take the device path too, so the dispatch runs against fla's own torch reference code.
_FLA_TEST_HOOK: Optional[Dict[str, Any]] = None


def _device_of(**named: Any) -> torch.device:
    """The one device of the named tensors (None entries skipped); another device: maskpack.Error naming
    the first tensor found elsewhere."""
    dev, first = None, None
    for name, t in named.items():
        if t is None:
            continue
        if dev is None:
            dev, first = t.device, name
        elif t.device != dev:
            raise Error(f"{name}: expected a tensor on {dev} (the device of {first}), found one on {t.device}",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument=name)
    return dev if dev is not None else torch.device("cpu")


def _on_device(dev: torch.device) -> bool:
    return _FLA_TEST_HOOK is not None or dev.type != "cpu"


def _fla(what: str, dev: torch.device, argument: str):
    """fla's chunk_gated_delta_rule ("rule") or causal_conv1d ("conv")."""
    if _FLA_TEST_HOOK is not None:
        return _FLA_TEST_HOOK[what]
    try:
        if what == "rule":
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn
        else:
            from fla.modules.causal_conv1d import causal_conv1d as fn
    except ImportError as e:
        raise Error(f"{argument}: tensors on {dev} run flash-linear-attention's kernels, and the package "
                    f"flash-linear-attention (import fla) is not installed or fails to import ({e}); install it "
                    "(pip install flash-linear-attention) or pass CPU tensors", "MASKPACK_ERR_UNSUPPORTED",
                    argument=argument) from e
    return fn


def _to_packed(layout: Any):
    """(the packed layout fla reads: each segment's tokens contiguous, in segment order, no gaps; a move
    of a tensor into it, and one back with pad rows 0). No move when the layout already is one."""
    from ._moves import relayout

    P = layout.packed_of()
    if P is layout:
        return P, (lambda x: x), (lambda x: x)
    return P, (lambda x: relayout(x, layout, P)), (lambda x: relayout(x, P, layout, pad_value=0))


def _check_gate_device(g: torch.Tensor, layout: Any) -> None:
    """The C gate check's rule on a device tensor: every real token's g a finite log decay <= 0, else
    maskpack.Error naming g with the first offending index in g's own coordinates. One device pass and
    one synchronising read of whether anything was found."""
    keep = layout.mask2d("bool", device=g.device).reshape(*g.shape[:-1], 1)
    bad = ~(torch.isfinite(g) & (g <= 0)) & keep
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        val = float(g[idx])
        raise Error(f"g: expected a finite log decay <= 0 at every real token, found {val} at {idx}",
                    "MASKPACK_ERR_VALUE", argument="g", index=idx)


def _rule_on_device(q, k, v, g, beta, layout, scale, initial_state, l2norm, check_gate, dev):
    fn = _fla("rule", dev, "q")
    P, there, back = _to_packed(layout)
    if check_gate:
        _check_gate_device(g.detach(), layout)
    qp, kp, vp, gp, bp = (there(x) for x in (q, k, v, g, beta))
    cu = P.cu_seqlens(dtype="int64", device=dev)
    h0 = None if initial_state is None else initial_state.float()
    o, ht = fn(qp.unsqueeze(0), kp.unsqueeze(0), vp.unsqueeze(0), gp.unsqueeze(0), bp.unsqueeze(0), scale=scale,
               initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=bool(l2norm), cu_seqlens=cu)
    return back(o.squeeze(0)), ht.float()


def _conv_on_device(x, w2, prefix, layout, silu, dev):
    fn = _fla("conv", dev, "x")
    P, there, back = _to_packed(layout)
    C, W = w2.shape
    init = None
    if prefix is not None:  # maskpack's prefix holds the W-1 inputs before a segment; fla's state all W
        init = torch.cat([prefix.new_zeros(prefix.shape[0], C, 1), prefix], dim=-1).to(x.dtype)
    y, final = fn(x=there(x).unsqueeze(0), weight=w2, initial_state=init, output_final_state=True,
                  activation="silu" if silu else None, cu_seqlens=P.cu_seqlens(dtype="int64", device=dev))
    return back(y.squeeze(0)), final[..., 1:].float()  # the last W-1 inputs, as maskpack's conv_state


# whole packed layout, group -> {cu_seqlens [N+1] int64, cu_seqlens_cpu, group, layout, conv1d_kernel_size}
def fla_cp_kwargs(layout: Any, group: Any, scheme: str = "ulysses", tp: int = 1, align: Optional[str] = "verl",
                  conv1d_kernel_size: Optional[int] = None, cp: Optional[int] = None,
                  device: Any = None) -> Dict[str, Any]:
    """whole packed layout, group -> keyword arguments of ``fla.ops.cp.build_cp_context`` for this rank.

    flash-linear-attention's context parallelism cuts the whole packed stream into equal contiguous parts
    (its layout "contiguous") and reads the whole batch's ``cu_seqlens``: that is maskpack's "ulysses"
    split (the stream padded at its end to a multiple of cp * tp by ``align``, then cut contiguously), so
    ``layout.shard(x, cp, rank, scheme="ulysses", tp=tp, align=align)`` gives each rank the tokens fla
    expects. The returned ``cu_seqlens`` (int64 on ``device``, and ``cu_seqlens_cpu``) cover the padded
    stream: every run of padding (between slots, the tail) is a sequence of its own to fla, whose outputs
    there are not maskpack's zeros (select the real tokens, e.g. by ``layout.cp_shard(...).mask2d()``).
    maskpack's per-sequence splits ("zigzag", "contiguous") hand fla other tokens than it expects: an error
    naming ``scheme`` (reshard first). ``cp``: the rank count the batch was cut for, when known; one that is
    not the group's size is an error naming ``group``."""
    check_layout(layout)
    if scheme != "ulysses":
        raise Error(f"scheme: flash-linear-attention's context parallelism cuts the whole packed stream "
                    f"contiguously (maskpack's scheme 'ulysses'); found {scheme!r}, whose parts hold other tokens",
                    "MASKPACK_ERR_UNSUPPORTED", argument="scheme")
    if not layout.packed:
        raise Error("layout: flash-linear-attention's context parallelism takes one packed stream; found a padded "
                    "layout (layout.packed_of() packs it)", "MASKPACK_ERR_UNSUPPORTED", argument="layout")
    rank, n = _above("cp")._rank_size(group)
    if cp is not None and int(cp) != n:
        raise Error(f"group: the batch was cut for cp = {int(cp)} ranks, the group has {n}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="group")
    whole = layout._cp_global(n, tp, align, "ulysses")
    total = int(whole.q_width)
    if total % n:
        raise Error(f"layout: {total} tokens do not divide among the group's {n} ranks (pass align= to pad the "
                    "stream)", "MASKPACK_ERR_INVALID_ARGUMENT", argument="layout")
    cuts = {0, total}
    for seg in whole.segments:
        cuts.update((int(seg[1]), int(seg[1]) + int(seg[2])))
    cu_cpu = torch.tensor(sorted(cuts), dtype=torch.int64)
    out: Dict[str, Any] = {"cu_seqlens": cu_cpu.to(device) if device is not None else cu_cpu.clone(),
                           "cu_seqlens_cpu": cu_cpu, "group": group, "layout": "contiguous"}
    if conv1d_kernel_size is not None:
        out["conv1d_kernel_size"] = int(conv1d_kernel_size)
    return out


# ---- the gated delta rule ---------------------------------------------------------------------


def _rule_op(layout, q, v, scale, chunked, l2norm, threads, isa, check_gate=True):
    """The C operator of the rule for this layout, shapes and options, made on first use and kept in
    the layout's cache (the kernel choice, the sorted work lists and a workspace are planned once
    per layout, not per call); None where the shapes cannot make one: the plain call then names
    the problem as it always has."""
    if q.dim() < 2 or v.dim() < 2:
        return None
    # the op picks its kernel when made, MASKPACK_ISA included: a change of the variable makes another
    key = ("gdn_op", int(q.shape[-2]), int(v.shape[-2]), int(q.shape[-1]), int(v.shape[-1]), float(scale),
           bool(chunked), bool(l2norm), threads, isa, bool(check_gate),
           os.environ.get("MASKPACK_ISA") if isa == 0 else None)
    cache = _cache_of(layout)
    op = cache.get(key)
    if op is None:
        try:
            op = _gdn.op_create(layout_handle(layout), *key[1:11])
        except Error:
            return None
        cache[key] = op
    return op


def _rule_into(q, k, v, g, beta, h0, layout, scale, chunked, l2norm, threads, isa, o, ht, check_gate=True) -> None:
    """The C forward of the rule into the given outputs (it validates every tensor, g's values
    included unless ``check_gate`` is False, before writing), through the layout's operator on the
    process's worker team of ``threads``."""
    descs = (_d(q, "q"), _d(k, "k"), _d(v, "v"), _d(g, "g"), _d(beta, "beta"), _d(h0, "initial_state"),
             _d(o, "o"), _d(ht, "final_state"))
    op = _rule_op(layout, q, v, scale, chunked, l2norm, threads, isa, check_gate)
    if op is None:
        _gdn.forward(layout_handle(layout), descs, float(scale), bool(chunked), bool(l2norm), threads, isa,
                     bool(check_gate))
    else:
        _gdn.op_forward(op, _team(threads), descs)


class _RuleFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, h0, layout, scale, chunked, l2norm, threads, isa, check_gate):
        n_seg = layout.n_segments
        HV, V = v.shape[-2], v.shape[-1]
        K = q.shape[-1]
        o = fresh(v.shape, v.dtype)
        ht = fresh((n_seg, HV, K, V), torch.float32)
        _rule_into(q, k, v, g, beta, h0, layout, scale, chunked, l2norm, threads, isa, o, ht, check_gate)
        ctx.save_for_backward(q, k, v, g, beta, h0)
        ctx.layout, ctx.scale, ctx.chunked, ctx.l2norm, ctx.threads = layout, scale, chunked, l2norm, threads
        ctx.isa, ctx.check_gate = isa, check_gate
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, h0 = ctx.saved_tensors
        need = ctx.needs_input_grad
        if do is None:
            do = torch.zeros(v.shape, dtype=v.dtype)
        dq = fresh(q.shape, q.dtype) if need[0] else None
        dk = fresh(k.shape, k.dtype) if need[1] else None
        dv = fresh(v.shape, v.dtype) if need[2] else None
        dg = fresh(g.shape, dtype=g.dtype) if need[3] else None
        db = fresh(beta.shape, dtype=beta.dtype) if need[4] else None
        dh0 = fresh(h0.shape, dtype=torch.float32) if (h0 is not None and need[5]) else None
        descs = (_d(q, "q"), _d(k, "k"), _d(v, "v"), _d(g, "g"), _d(beta, "beta"), _d(h0, "initial_state"),
                 _d(do, "d_o"), _d(dht, "d_final_state"), _d(dq, "dq"), _d(dk, "dk"), _d(dv, "dv"), _d(dg, "dg"),
                 _d(db, "dbeta"), _d(dh0, "d_initial_state"))
        op = _rule_op(ctx.layout, q, v, ctx.scale, ctx.chunked, ctx.l2norm, ctx.threads, ctx.isa, ctx.check_gate)
        if op is None:
            _gdn.backward(layout_handle(ctx.layout), descs, float(ctx.scale), bool(ctx.l2norm), ctx.threads, ctx.isa,
                          bool(ctx.check_gate))
        else:
            _gdn.op_backward(op, _team(ctx.threads), descs)
        return dq, dk, dv, dg, db, dh0, None, None, None, None, None, None, None


# q, k [.., H, K], v [.., HV, V], g, beta [.., HV], layout -> (o like v, final_state [segments, HV, K, V] f32)
def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     layout: Any, scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
                     chunked: bool = True, l2norm: bool = True, threads: Optional[int] = None,
                     out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None, *, group: Any = None,
                     cp_scheme: str = "zigzag", tp: int = 1, align: Optional[str] = "verl",
                     cp_method: str = "auto", isa: Optional[str] = None,
                     check_gate: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule per segment of ``layout``.

    q, k ``[.., H, K]``, v ``[.., HV, V]`` (HV a multiple of H; value head h reads key head
    h // (HV // H)), g (log decay) and beta ``[.., HV]``; float32 or bfloat16, ``..`` = ``[B, S]``
    (padded layout) or ``[T]`` (packed). Per token: ``S <- exp(g) S``,
    ``S <- S + k (beta (v - S^T k))^T``, ``o = scale S^T q`` with q, k L2-normalised first when
    ``l2norm``. ``initial_state``: ``[segments, HV, K, V]`` (float32) or None for zeros.
    ``chunked`` picks the forward form (chunks of 64 from each segment start, or the token
    recurrence); the backward always runs the chunked algorithm.

    Returns ``(o, final_state)``: o like v (pad rows 0), final_state ``[segments, HV, K, V]`` float32.
    ``out=(o, final_state)``: preallocated outputs of those shapes and dtypes (any strides), filled
    and returned, so a loop can reuse its memory instead of paying fresh pages every call; not
    allowed while autograd records (an input requires grad). ``isa``: the kernel for this call ("ref",
    "avx2", "avx512"; None or "auto": MASKPACK_ISA, else the best this CPU runs); one this CPU lacks
    raises maskpack.Error naming the missing feature.

    ``check_gate`` (default True): g of every real token must be a finite log decay <= 0. A gate
    g > 0 grows the state without bound (the chunked and recurrent forms then part ways by orders
    of magnitude), NaN poisons the state and -inf breaks the chunked form; each raises
    maskpack.Error (status MASKPACK_ERR_VALUE, argument "g", index (token, head) for a packed
    layout, (row, token, head) for a padded one: the first offending one) before anything is
    written. Pads are never read. The check is one pass over g in the C library
    (``maskpack_gdn_options.skip_gate_check``), forward and backward; ``check_gate=False`` runs g
    as given. With ``group=`` the gate is always checked.

    ``group`` (a torch.distributed ProcessGroup): context parallelism. The tensors are then this
    rank's CP shard ([T_local, ...], as ``layout.shard(x, cp, rank, scheme=cp_scheme, tp=tp,
    align=align)`` cut them) and ``layout`` is the whole batch's; o comes back as this rank's shard and
    final_state whole on every rank. ``cp_method``: "head" (head-parallel, bitwise: see
    :func:`maskpack.distributed.gated_delta_rule_cp`), "sequence" (each rank its own pieces, states
    composed across ranks: :func:`maskpack.distributed.gated_delta_rule_sp`) or "auto" (head-parallel
    when both head counts divide by the group size, else sequence-parallel).
    """
    if not isinstance(check_gate, bool):
        raise TypeError(f"check_gate: expected True or False, found {check_gate!r}")
    if group is not None:
        if out is not None:
            raise TypeError("gated_delta_rule(): out= cannot be combined with group=")
        if not check_gate:
            raise TypeError("gated_delta_rule(): check_gate=False cannot be combined with group= (the CP ways "
                            "check the gate)")
        if isa is not None:
            raise TypeError("gated_delta_rule(): isa= cannot be combined with group= (the CP ways choose their kernels)")
        if compiling():  # the whole CP call is one opaque op (maskpack._compile.cp_call), collectives included
            return _above("compile").cp_call("gated_delta_rule", [q, k, v, g, beta, initial_state], layout, group,
                                             dict(scale=scale, chunked=bool(chunked), l2norm=bool(l2norm), threads=threads,
                                                  scheme=cp_scheme, tp=tp, align=align, cp_method=cp_method))
        cp = _above("cp")
        fn = cp.gated_delta_rule_sp if cp._cp_method(cp_method, group, q.shape[-2], v.shape[-2]) == "sequence" \
            else cp.gated_delta_rule_cp
        return fn(q, k, v, g, beta, layout, group, scale=scale, initial_state=initial_state, chunked=chunked,
                  l2norm=l2norm, threads=threads, scheme=cp_scheme, tp=tp, align=align)
    _check_call(layout, q=q, k=k, v=v, g=g, beta=beta)
    code = isa_code(isa)
    if initial_state is not None and not isinstance(initial_state, torch.Tensor):
        raise TypeError(f"initial_state: expected a torch.Tensor or None, found {type(initial_state).__name__}")
    dev = _device_of(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    if initial_state is not None and initial_state.dtype != torch.float32:
        initial_state = initial_state.float()
    K = q.shape[-1] if q.dim() > 0 else 1
    if K < 1:  # 1/sqrt(K) below; the C checks would name the shape after the division failed
        raise Error(f"q: expected a head dimension K >= 1 (last dimension), found shape {list(q.shape)}",
                    "MASKPACK_ERR_SHAPE", argument="q")
    sc = (1.0 / math.sqrt(K)) if scale is None else float(scale)
    if not math.isfinite(sc) or sc == 0.0:
        raise Error(f"scale: expected a finite non-zero number, found {scale}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="scale")
    if _on_device(dev):
        if out is not None:
            raise TypeError("gated_delta_rule(): out= is a CPU kernel's; tensors on a device return fresh outputs")
        return _rule_on_device(q, k, v, g, beta, layout, sc, initial_state, l2norm, check_gate, dev)
    if out is None and compiling():  # under torch.compile: one custom op (maskpack._compile), autograd included
        if threads is not None:
            check_threads(threads, 1)  # an invalid count is refused while tracing, as in eager
        return _above("compile").gated_delta_rule(q, k, v, g, beta, initial_state, layout, sc, chunked, l2norm, threads,
                                                  code, check_gate)
    if out is None:
        return _RuleFn.apply(q, k, v, g, beta, initial_state, layout, sc, bool(chunked), bool(l2norm),
                             _threads(threads), code, check_gate)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, g, beta, initial_state)):
        raise TypeError("gated_delta_rule(): out= cannot be used when autograd records (an input requires grad)")
    if not isinstance(out, (tuple, list)) or len(out) != 2 or not all(isinstance(t, torch.Tensor) for t in out):
        raise TypeError("gated_delta_rule(): out= expects a pair of tensors (o, final_state)")
    o, ht = out
    want = (layout.n_segments, v.shape[-2], K, v.shape[-1])
    if o.dtype != v.dtype or tuple(o.shape) != tuple(v.shape):
        raise Error(f"out[0] (o): expected {v.dtype} {tuple(v.shape)}, found {o.dtype} {tuple(o.shape)}",
                    "MASKPACK_ERR_SHAPE", argument="o")
    if ht.dtype != torch.float32 or tuple(ht.shape) != want:
        raise Error(f"out[1] (final_state): expected torch.float32 {want}, found {ht.dtype} {tuple(ht.shape)}",
                    "MASKPACK_ERR_SHAPE", argument="final_state")
    _rule_into(q, k, v, g, beta, initial_state, layout, sc, chunked, l2norm, _threads(threads), code, o, ht,
               check_gate)
    return o, ht


# ---- causal conv1d ------------------------------------------------------------------------------


_ACTIVATIONS = {"silu": True, "swish": True, None: False, "none": False, "identity": False}


class _ConvFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight2d, prefix, layout, silu, threads, weight_shape, isa):
        C, W = weight2d.shape
        y = fresh(x.shape, dtype=x.dtype)
        state = fresh((layout.n_segments, C, W - 1), dtype=torch.float32)
        descs = (_d(x, "x"), _d(weight2d, "weight"), _d(prefix, "prefix"), _d(y, "y"), _d(state, "conv_state"))
        _gdn.conv1d_on(layout_handle(layout), descs, bool(silu), _team(threads), isa)
        ctx.save_for_backward(x, weight2d, prefix)
        ctx.layout, ctx.silu, ctx.threads, ctx.weight_shape, ctx.isa = layout, silu, threads, weight_shape, isa
        return y, state

    @staticmethod
    def backward(ctx, dy, dstate):
        x, w, prefix = ctx.saved_tensors
        need = ctx.needs_input_grad
        if dy is None:
            dy = torch.zeros(x.shape, dtype=x.dtype)
        dx = fresh(x.shape, dtype=x.dtype) if need[0] else None
        dw = fresh(w.shape, dtype=torch.float32) if need[1] else None
        dp = fresh(prefix.shape, dtype=torch.float32) if (prefix is not None and need[2]) else None
        descs = (_d(x, "x"), _d(w, "weight"), _d(prefix, "prefix"), _d(dy, "dy"), _d(dstate, "d_conv_state"),
                 _d(dx, "dx"), _d(dw, "dweight"), _d(dp, "d_prefix"))
        _gdn.conv1d_backward_on(layout_handle(ctx.layout), descs, bool(ctx.silu), _team(ctx.threads), ctx.isa)
        if dw is not None:
            dw = dw.to(w.dtype)
        if dp is not None:
            dp = dp.to(prefix.dtype)
        return dx, dw, dp, None, None, None, None, None


# x [.., C], weight [C, W] | [C, 1, W], layout -> (y like x, conv_state [segments, C, W-1] f32)
def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, layout: Any, activation: Optional[str] = "silu",
                  prefix: Optional[torch.Tensor] = None, threads: Optional[int] = None, *, group: Any = None,
                  cp_scheme: str = "zigzag", tp: int = 1, align: Optional[str] = "verl",
                  cp_method: str = "auto", isa: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv1d per segment: ``y[t] = act(sum_w weight[:, w] * x[t - (W-1) + w])``.

    x ``[B, S, C]`` / ``[T, C]``; weight ``[C, W]`` or nn.Conv1d's ``[C, 1, W]`` with 1 <= W <= 4;
    prefix ``[segments, C, W-1]`` (the inputs before each segment, most recent last: a cache or a
    context-parallel halo) or None for zeros; activation "silu" or None.
    Returns ``(y, conv_state)``: y like x (pad rows 0), conv_state ``[segments, C, W-1]`` float32
    = each segment's last W-1 inputs (the prefix's tail when the segment is shorter).
    ``group``: context parallelism, x being this rank's CP shard of the whole ``layout`` (see
    :func:`maskpack.distributed.causal_conv1d_cp` for ``cp_method="head"`` (channel-parallel),
    :func:`maskpack.distributed.causal_conv1d_sp` for "sequence"; "auto": channel-parallel when the
    channels divide by the group size). ``isa``: the kernel for this call, as for :func:`gated_delta_rule`."""
    if group is not None:
        if isa is not None:
            raise TypeError("causal_conv1d(): isa= cannot be combined with group= (the CP ways choose their kernels)")
        if compiling():
            return _above("compile").cp_call("causal_conv1d", [x, weight, prefix], layout, group,
                                             dict(activation=activation, threads=threads, scheme=cp_scheme, tp=tp, align=align,
                                                  cp_method=cp_method))
        cp = _above("cp")
        fn = cp.causal_conv1d_sp if cp._cp_method(cp_method, group, x.shape[-1], x.shape[-1]) == "sequence" \
            else cp.causal_conv1d_cp
        return fn(x, weight, layout, group, activation=activation, prefix=prefix, threads=threads,
                  scheme=cp_scheme, tp=tp, align=align)
    if activation not in _ACTIVATIONS:
        raise Error(f"activation: expected 'silu' or None, found {activation!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="activation")
    _check_call(layout, x=x, weight=weight)
    if weight.dim() not in (2, 3) or weight.shape[-1] < 1 or (weight.dim() == 3 and weight.shape[1] != 1):
        raise Error(f"weight: expected [C, W] or [C, 1, W] with W >= 1, found shape {list(weight.shape)}",
                    "MASKPACK_ERR_SHAPE", argument="weight")
    weight_shape = tuple(weight.shape)
    w2 = weight.reshape(weight.shape[0], weight.shape[-1]) if weight.dim() == 3 else weight
    dev = _device_of(x=x, weight=weight, prefix=prefix)
    if _on_device(dev):
        return _conv_on_device(x, w2, prefix, layout, _ACTIVATIONS[activation], dev)
    if compiling():
        if threads is not None:
            check_threads(threads, 1)
        return _above("compile").causal_conv1d(x, w2, prefix, layout, _ACTIVATIONS[activation], threads, isa_code(isa))
    return _ConvFn.apply(x, w2, prefix, layout, _ACTIVATIONS[activation], _threads(threads), weight_shape,
                         isa_code(isa))


# ---- gates and L2 norm ---------------------------------------------------------------------------


class _GatesFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, A_log, dt_bias, layout):
        g = fresh(a.shape, dtype=torch.float32)
        beta = fresh(b.shape, dtype=torch.float32)
        _gdn.gates(layout_handle(layout), (_d(a, "a"), _d(b, "b"), _d(A_log, "A_log"), _d(dt_bias, "dt_bias"), _d(g, "g"),
                                  _d(beta, "beta")))
        ctx.save_for_backward(a, b, A_log, dt_bias)
        ctx.layout = layout
        return g, beta

    @staticmethod
    def backward(ctx, dg, dbeta):
        a, b, A_log, dt_bias = ctx.saved_tensors
        need = ctx.needs_input_grad
        da = fresh(a.shape, dtype=a.dtype) if need[0] else None
        db = fresh(b.shape, dtype=b.dtype) if need[1] else None
        dA = fresh(A_log.shape, dtype=torch.float32) if need[2] else None
        ddt = fresh(dt_bias.shape, dtype=torch.float32) if need[3] else None
        _gdn.gates_backward(layout_handle(ctx.layout), (_d(a, "a"), _d(b, "b"), _d(A_log, "A_log"), _d(dt_bias, "dt_bias"),
                                               _d(dg, "dg"), _d(dbeta, "dbeta"), _d(da, "da"), _d(db, "db"),
                                               _d(dA, "dA_log"), _d(ddt, "ddt_bias")))
        if dA is not None:
            dA = dA.to(A_log.dtype)
        if ddt is not None:
            ddt = ddt.to(dt_bias.dtype)
        return da, db, dA, ddt, None


# a, b [.., HV], A_log, dt_bias [HV], layout -> (g, beta) float32 [.., HV]
def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
              layout: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)`` per real token (float32;
    pad rows 0). a, b ``[.., HV]``; A_log, dt_bias ``[HV]``."""
    if _on_device(_device_of(a=a, b=b, A_log=A_log, dt_bias=dt_bias)):  # the same formula in torch
        keep = layout.mask2d("bool", device=a.device).reshape(*a.shape[:-1], 1)
        g = -A_log.float().exp() * torch.nn.functional.softplus(a.float() + dt_bias.float())
        zero = torch.zeros((), device=a.device)
        return torch.where(keep, g, zero), torch.where(keep, torch.sigmoid(b.float()), zero)
    if compiling():
        return _above("compile").gdn_gates(a, b, A_log, dt_bias, layout)
    return _GatesFn.apply(a, b, A_log, dt_bias, layout)


class _L2Fn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, layout, eps):
        y = fresh(x.shape, dtype=x.dtype)
        _gdn.l2norm(layout_handle(layout), (_d(x, "x"), _d(y, "y")), float(eps))
        ctx.save_for_backward(x)
        ctx.layout, ctx.eps = layout, eps
        return y

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dx = fresh(x.shape, dtype=x.dtype)
        _gdn.l2norm_backward(layout_handle(ctx.layout), (_d(x, "x"), _d(dy, "dy"), _d(dx, "dx")), float(ctx.eps))
        return dx, None, None


# x [.., H, D], layout -> like x
def gdn_l2norm(x: torch.Tensor, layout: Any, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2, -1) + eps)`` per real token and head (x ``[.., H, D]``; pad rows 0)."""
    if _on_device(x.device):
        keep = layout.mask2d("bool", device=x.device).reshape(*x.shape[:-2], 1, 1)
        y = x * torch.rsqrt(x.float().square().sum(-1, keepdim=True) + eps).to(x.dtype)
        return torch.where(keep, y, torch.zeros((), dtype=x.dtype, device=x.device))
    if compiling():
        return _above("compile").gdn_l2norm(x, layout, eps)
    return _L2Fn.apply(x, layout, eps)


# ---- the layer ------------------------------------------------------------------------------------


class GatedRMSNorm(torch.nn.Module):
    """RMS norm over the head dim, then times silu(gate) (transformers' Qwen3NextRMSNormGated)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        h = self.weight * h.to(dtype)
        return (h * torch.nn.functional.silu(gate.to(torch.float32))).to(dtype)


def _layer_project(m: Any, projections: str, hidden: torch.Tensor):
    """hidden [.., hidden] -> mixed [.., conv_dim] (q | k | v, the conv's channel order),
    z [.., HV, dv], b and a [.., HV]. ``m``: a GatedDeltaNet or transformers' layer (same names)."""
    lead = hidden.shape[:-1]
    if projections == "qwen3_5":
        z = m.in_proj_z(hidden).reshape(*lead, m.num_v_heads, m.head_v_dim)
        return m.in_proj_qkv(hidden), z, m.in_proj_b(hidden), m.in_proj_a(hidden)
    # transformers' Qwen3-Next ordering: per key head, [q (dk) | k (dk) | v (G*dv) | z (G*dv)]
    # and [b (G) | a (G)]
    G = m.num_v_heads // m.num_k_heads
    qkvz = m.in_proj_qkvz(hidden).view(*lead, m.num_k_heads, 2 * m.head_k_dim + 2 * G * m.head_v_dim)
    ba = m.in_proj_ba(hidden).view(*lead, m.num_k_heads, 2 * G)
    q, k, v, z = torch.split(qkvz, [m.head_k_dim, m.head_k_dim, G * m.head_v_dim, G * m.head_v_dim], dim=-1)
    b, a = torch.split(ba, [G, G], dim=-1)
    mixed = torch.cat((q.reshape(*lead, -1), k.reshape(*lead, -1), v.reshape(*lead, -1)), dim=-1)
    z = z.reshape(*lead, m.num_v_heads, m.head_v_dim)
    return mixed, z, b.reshape(*lead, m.num_v_heads), a.reshape(*lead, m.num_v_heads)


def _layer_forward(m: Any, projections: str, hidden_states: torch.Tensor, layout: Any,
                   initial_state: Optional[torch.Tensor], conv_prefix: Optional[torch.Tensor], chunked: bool,
                   threads: Optional[int], cp: Optional[dict] = None, ok: Optional[torch.Tensor] = None):
    """The layer over ``layout`` with the parameters of ``m`` (a GatedDeltaNet or transformers'
    Qwen3-Next / Qwen3.5 layer: the same attribute names) -> (out, final_state, conv_state, the
    conv's input [.., conv_dim]). ``cp`` (group, cp_scheme, tp, align): hidden_states is this rank's
    CP shard of the whole ``layout``; the conv and the rule run head-parallel across the group."""
    lead = hidden_states.shape[:-1]
    cp = cp or {}
    tok_layout = layout  # the layout of the tokens this process holds
    if cp:
        import torch.distributed as dist

        g_ = cp["group"]
        shard = (dist.get_world_size(g_), dist.get_rank(g_), cp["cp_scheme"], cp["tp"], cp["align"])
        # traced: the shard layout by its registry key (kept alive by the whole layout's cache)
        tok_layout = _shard_key(layout, *shard) if compiling() else \
            layout.cp_shard(shard[0], shard[1], scheme=shard[2], tp=shard[3], align=shard[4])
    # the projections are torch GEMMs over every row: select (never multiply) the real rows so
    # a NaN in the padding reaches neither the outputs nor the weight gradients
    if isinstance(tok_layout, int):
        keep = _above("compile").derived(tok_layout, "mask2d", dict(dtype="bool"), None).reshape(*lead, 1)
    else:
        keep = torch.as_tensor(tok_layout.mask2d("bool", device=hidden_states.device)).reshape(*lead, 1)
    if ok is not None:  # a compiled call's check of its boundaries (see _compiled_layout): its result feeds on
        keep = keep & ok
    zero = torch.zeros((), dtype=hidden_states.dtype, device=hidden_states.device)
    hidden_states = torch.where(keep, hidden_states, zero)
    conv_in, z, b, a = _layer_project(m, projections, hidden_states)
    mixed, conv_state = causal_conv1d(conv_in, m.conv1d.weight, layout, "silu", prefix=conv_prefix, threads=threads,
                                      **cp)
    q, k, v = torch.split(mixed, [m.key_dim, m.key_dim, m.value_dim], dim=-1)
    q = q.reshape(*lead, m.num_k_heads, m.head_k_dim)
    k = k.reshape(*lead, m.num_k_heads, m.head_k_dim)
    v = v.reshape(*lead, m.num_v_heads, m.head_v_dim)
    g, beta = gdn_gates(a, b, m.A_log, m.dt_bias, tok_layout)
    o, state = gated_delta_rule(q, k, v, g, beta, layout, initial_state=initial_state, chunked=chunked, l2norm=True,
                                threads=threads, **cp)
    o = m.norm(o, z)
    out = m.out_proj(o.reshape(*lead, m.value_dim))
    # pad rows are exactly 0 (the norm and projections of zero rows need not give exact zeros)
    return torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device)), state, conv_state, conv_in


# the two projection layouts of transformers' GDN layers: Qwen3-Next fuses q, k, v, z (and b, a)
# into one projection whose columns are grouped per key head; Qwen3.5 (dense and MoE) projects q|k|v
# (already in the conv's channel order), z, b and a separately
_PROJECTIONS = ("qwen3_next", "qwen3_5")


class GatedDeltaNet(torch.nn.Module):
    """The Gated DeltaNet layer of Qwen3-Next and Qwen3.5, computed per segment of a layout.

    Same parameters (and state-dict names) as transformers' ``Qwen3NextGatedDeltaNet``
    (``projections="qwen3_next"``: ``in_proj_qkvz``, ``in_proj_ba``) or ``Qwen3_5GatedDeltaNet``
    and ``Qwen3_5MoeGatedDeltaNet`` (``projections="qwen3_5"``: ``in_proj_qkv``, ``in_proj_z``,
    ``in_proj_b``, ``in_proj_a``), plus ``conv1d``, ``dt_bias``, ``A_log``, ``norm.weight`` and
    ``out_proj``. The projections, the gated RMS norm and the output projection run in torch; the
    conv, the gates and the rule run in maskpack's C kernels, per segment.
    """

    def __init__(self, hidden_size: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                 conv_kernel_size: int = 4, rms_norm_eps: float = 1e-6, chunked: bool = True,
                 projections: str = "qwen3_next") -> None:
        super().__init__()
        if num_v_heads % num_k_heads:
            raise Error(f"num_v_heads: expected a multiple of num_k_heads = {num_k_heads}, found {num_v_heads}",
                        "MASKPACK_ERR_SHAPE", argument="num_v_heads")
        if projections not in _PROJECTIONS:
            raise Error(f"projections: expected one of {', '.join(_PROJECTIONS)}, found {projections!r}",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="projections")
        self.hidden_size = hidden_size
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.key_dim, self.value_dim = head_k_dim * num_k_heads, head_v_dim * num_v_heads
        self.conv_kernel_size = conv_kernel_size
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.chunked = chunked
        self.projections = projections
        self.conv1d = torch.nn.Conv1d(self.conv_dim, self.conv_dim, kernel_size=conv_kernel_size, bias=False,
                                      groups=self.conv_dim, padding=conv_kernel_size - 1)
        if projections == "qwen3_next":
            self.in_proj_qkvz = torch.nn.Linear(hidden_size, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = torch.nn.Linear(hidden_size, 2 * num_v_heads, bias=False)
        else:
            self.in_proj_qkv = torch.nn.Linear(hidden_size, self.conv_dim, bias=False)
            self.in_proj_z = torch.nn.Linear(hidden_size, self.value_dim, bias=False)
            self.in_proj_b = torch.nn.Linear(hidden_size, num_v_heads, bias=False)
            self.in_proj_a = torch.nn.Linear(hidden_size, num_v_heads, bias=False)
        self.dt_bias = torch.nn.Parameter(torch.ones(num_v_heads))
        self.A_log = torch.nn.Parameter(torch.log(torch.empty(num_v_heads).uniform_(0.01, 16)))
        self.norm = GatedRMSNorm(head_v_dim, eps=rms_norm_eps)
        self.out_proj = torch.nn.Linear(self.value_dim, hidden_size, bias=False)

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> "GatedDeltaNet":
        """From a transformers Qwen3NextConfig, Qwen3_5TextConfig or Qwen3_5MoeTextConfig (or the
        vision-language Qwen3_5Config / Qwen3_5MoeConfig, whose ``text_config`` holds the layer's
        fields; or anything with the same attribute names). The projection layout follows the
        config's ``model_type`` unless ``projections=`` is given."""
        text = getattr(config, "text_config", None) or config
        if "projections" not in kwargs:
            kwargs["projections"] = "qwen3_5" if str(getattr(text, "model_type", "")).startswith("qwen3_5") \
                else "qwen3_next"
        act = getattr(text, "hidden_act", "silu")
        if act not in ("silu", "swish"):
            # the layer's conv runs with config.hidden_act; maskpack's conv has SiLU or nothing
            raise Error(f"hidden_act: the conv activation must be silu, found {act!r}",
                        "MASKPACK_ERR_UNSUPPORTED", argument="hidden_act")
        return cls(text.hidden_size, text.linear_num_key_heads, text.linear_num_value_heads,
                   text.linear_key_head_dim, text.linear_value_head_dim, text.linear_conv_kernel_dim,
                   text.rms_norm_eps, **kwargs)

    def forward(self, hidden_states: torch.Tensor, layout: Any, initial_state: Optional[torch.Tensor] = None,
                conv_prefix: Optional[torch.Tensor] = None, return_states: bool = False,
                threads: Optional[int] = None, *, group: Any = None, cp_scheme: str = "zigzag", tp: int = 1,
                align: Optional[str] = "verl", cp_method: str = "auto"):
        """hidden_states ``[B, S, hidden]`` (padded layout) or ``[T, hidden]`` (packed) -> the same
        shape, pad rows 0. ``initial_state`` ``[segments, HV, dk, dv]`` and ``conv_prefix``
        ``[segments, conv_dim, kernel-1]`` continue earlier pieces of the sequences (cache / CP);
        with ``return_states`` the result is ``(out, final_state, conv_state)``.
        ``group``: context parallelism; hidden_states is then this rank's CP shard ``[T_local,
        hidden]`` of the whole batch ``layout`` (``layout.shard(x, cp, rank, ...)``), and the conv and
        the rule run head-parallel (value heads and conv channels divide by the group size)."""
        cp = None if group is None else {"group": group, "cp_scheme": cp_scheme, "tp": tp, "align": align,
                                         "cp_method": cp_method}
        out, state, conv_state, _ = _layer_forward(self, self.projections, hidden_states, layout, initial_state,
                                                   conv_prefix, self.chunked, threads, cp)
        if return_states:
            return out, state, conv_state
        return out


# ---- transformers' own layers through maskpack -------------------------------------------------------

_HF_GDN_LAYERS = ("Qwen3NextGatedDeltaNet", "Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet")


# what a model call hands a patched layer besides its 2D mask: the keys that describe packed segments
# (transformers passes a call's extra keyword arguments down to every layer); position_ids reach the
# linear-attention layers only through the call tap below, as maskpack_position_ids
_SEGMENT_KEYS = ("cu_seqlens", "cu_seq_lens_q", "cu_seq_lens_k", "seq_idx")
_TAPPED = {"position_ids": "maskpack_position_ids", "attention_mask": "maskpack_attention_mask"}


def _host(x: Any) -> Any:
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


class _CallTap:
    """A forward pre-hook on the model a patch was applied to: transformers hands a model call's
    ``position_ids`` to its attention layers only, and its linear-attention layers no 2D mask at all
    when every token is real, so the tap passes the call's own position ids and 2D attention mask on
    as ``maskpack_position_ids`` and ``maskpack_attention_mask`` (keyword arguments, which
    transformers carries down to every layer, gradient checkpointing's recomputation included). A
    plain object, so that a patched model deep-copies and pickles."""

    def __init__(self, index: Dict[str, Optional[int]]) -> None:
        self.index = index  # each tapped argument's place among forward's positional parameters, or None

    def __call__(self, module: Any, args: tuple, kwargs: dict):
        add = {}
        for name, i in self.index.items():
            x = kwargs.get(name)
            if x is None and i is not None and len(args) > i:
                x = args[i]
            if name == "attention_mask" and not (isinstance(x, torch.Tensor) and x.dim() == 2):
                continue  # a 4D or dict mask carries no 2D padding mask
            if x is not None and kwargs.get(_TAPPED[name]) is None:
                add[_TAPPED[name]] = x
        return (args, {**kwargs, **add}) if add else None


def _tap_index(model: torch.nn.Module) -> Optional[Dict[str, Optional[int]]]:
    """The arguments a call tap on ``model`` reads ({name: index among forward's positional
    parameters, or None}), or None where its forward takes no position_ids or passes no other
    keywords on."""
    import inspect

    try:
        params = list(inspect.signature(type(model).forward).parameters.values())[1:]  # without self
    except (TypeError, ValueError):
        return None
    names = [p.name for p in params]
    if "position_ids" not in names or not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    out: Dict[str, Optional[int]] = {}
    for name in _TAPPED:
        if name in names:
            i = names.index(name)
            positional = params[i].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                            inspect.Parameter.POSITIONAL_OR_KEYWORD)
            out[name] = i if positional else None
    return out


def _segment_ids(lay: Any):
    import numpy as np

    return np.asarray(lay.with_outputs("numpy").segment_ids()).reshape(-1)


def _batch_layout(batch: dict) -> Tuple[Any, str]:
    """prepare_batch's reading of a batch's segments (maskpack.batch's own helpers, so that a patched
    layer and prepare_batch cannot read one batch two ways) -> (layout, the key that described it)."""
    from . import batch as _b

    key, grid, one_row = _b._token_grid(batch)
    _b._check_layout_shapes(batch, key, grid)
    pos = batch.get("position_ids")
    text, planes = _b._positions(pos, grid, one_row) if pos is not None else (None, None)
    return _b._source_layout(batch, None, "te", "reset", {}, text, planes is not None)


def _call_layout(hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor], kwargs: dict,
                 tail_padding: bool) -> Tuple[Any, str]:
    """The segments of a patched layer's call [B, S, hidden] -> (layout, the key that described it),
    by prepare_batch's rules (maskpack.batch): explicit offsets (cu_seqlens, cu_seq_lens_q/k,
    seq_idx) first, then the position ids of one packed row, then the 2D keep mask, then position
    ids of a padded batch, else whole rows; every other form present must agree (an error names the
    first token where two disagree). A ``maskpack_layout`` passed through the call is the segments
    themselves: the other forms must agree with it. Tokens the segments leave out (offsets that sum
    to fewer than the row's tokens, a trailing run of zero position ids) are padding only when the
    2D mask or the layout says so, or the patch was made with ``tail_padding=True``; otherwise the
    call raises, as it does for forms that disagree."""
    import numpy as np

    B, S = int(hidden_states.shape[0]), int(hidden_states.shape[1])
    batch: dict = {"inputs_embeds": hidden_states}
    for key in _SEGMENT_KEYS:
        if kwargs.get(key) is not None:
            batch[key] = _host(kwargs[key])
    pos = kwargs.get("position_ids")
    if pos is None:
        pos = kwargs.get("maskpack_position_ids")
    if isinstance(pos, torch.Tensor):
        pos = _host(pos)
        if pos.dim() == 2 and pos.shape[0] == 1 and B > 1:  # one row of positions for every row
            pos = pos.expand(B, -1)
        batch["position_ids"] = pos
    mask = attention_mask if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 else None
    if mask is None:  # transformers hands the layer no mask when every token is real: the call's own
        call_mask = kwargs.get("maskpack_attention_mask")
        if isinstance(call_mask, torch.Tensor) and call_mask.dim() == 2 and call_mask.shape[0] == B \
                and call_mask.shape[1] >= S:
            mask = call_mask[:, call_mask.shape[1] - S:]  # a continuation's mask covers the cache too
    if mask is not None:
        batch["attention_mask"] = _host(mask)
    given = kwargs.get("maskpack_layout")
    if given is not None:
        check_layout(given)
        grid = (1, given.q_width) if given.packed else (given.n_rows, given.q_width)
        if grid != (B, S):
            raise Error(f"maskpack_layout: expected the token grid of hidden_states {[B, S]}, found {list(grid)}",
                        "MASKPACK_ERR_SHAPE", argument="maskpack_layout")
        if len(batch) == 1:
            return given, "maskpack_layout"
    elif len(batch) == 1 and B == 1:
        raise Error("position_ids: a patched linear-attention layer cannot tell where the sequences of its one row "
                    "begin and end: the call carries no maskpack_layout, no cu_seq_lens_q / cu_seqlens / seq_idx, no "
                    "position_ids and no 2D attention mask; pass one (a packed row never runs as one sequence by "
                    "default)", "MASKPACK_ERR_NOT_FOUND", argument="position_ids")
    lay, name = _batch_layout(batch)
    if given is not None:
        ids, want = _segment_ids(lay), _segment_ids(given)
        # both number their segments in token order: equal ids = the same segments and the same padding
        bad = np.nonzero(ids != want)[0]
        if bad.size:
            t = int(bad[0])
            raise Error(f"{name}: disagrees with maskpack_layout at token {t} (sequence {int(ids[t]) - 1} vs "
                        f"{int(want[t]) - 1}; -1 = padding)", "MASKPACK_ERR_VALUE", argument=name, index=(t,))
        return given, "maskpack_layout"
    if mask is None and not tail_padding:
        real = _segment_ids(lay) != 0
        if not real.all():
            t = int(np.nonzero(~real)[0][0])
            raise Error(f"{name}: leaves {int((~real).sum())} of the call's {real.size} tokens out of every sequence, "
                        f"from token {t} (they would run as padding, their outputs 0); expected every token in a "
                        "sequence: pass a 2D attention_mask (or maskpack_layout) marking the padding, or patch with "
                        "patch_linear_attention(..., tail_padding=True)", "MASKPACK_ERR_VALUE", argument=name,
                        index=(t,))
    return lay, name


# what a compiled call's check op re-reads: every keyword argument that can describe the segments
_CHECKED = _SEGMENT_KEYS + ("position_ids", "maskpack_position_ids", "maskpack_attention_mask")


def _compiled_layout(hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor], kwargs: dict,
                     tail_padding: bool) -> Tuple[Any, Optional[torch.Tensor]]:
    """_call_layout under torch.compile -> (layout, the check's result or None). A traced graph cannot
    read boundaries out of tensor values (their count sets the state shapes), so the segments are the
    ``maskpack_layout`` the call carries, built before the compiled region; every other form the call
    carries is checked against it at run time, inside an opaque op running _call_layout's own rules
    (maskpack._compile.check_call), whose result (True) the layer's keep mask takes in, so that no
    compiler drops it."""
    given = kwargs.get("maskpack_layout")
    if given is None:
        raise Error("maskpack_layout: under torch.compile a patched linear-attention layer takes its sequences from "
                    "a maskpack_layout=<Layout> passed to the model call (built outside the compiled function, e.g. "
                    "by maskpack.prepare_batch); boundaries read from tensor values cannot be traced",
                    "MASKPACK_ERR_NOT_FOUND", argument="maskpack_layout")
    check_layout(given)
    B, S = int(hidden_states.shape[0]), int(hidden_states.shape[1])
    grid = (1, given.q_width) if given.packed else (given.n_rows, given.q_width)
    if grid != (B, S):
        raise Error(f"maskpack_layout: expected the token grid of hidden_states {[B, S]}, found {list(grid)}",
                    "MASKPACK_ERR_SHAPE", argument="maskpack_layout")
    mask = attention_mask if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 else None
    forms = [kwargs.get(k) if isinstance(kwargs.get(k), torch.Tensor) else None for k in _CHECKED]
    if mask is None and all(f is None for f in forms):
        return given, None
    return given, _above("compile").check_call(hidden_states, mask, forms, given, tail_padding)


@torch._dynamo.assume_constant_result
def _shard_key(layout: Any, cp: int, rank: int, scheme: str, tp: int, align: Optional[str]) -> int:
    """The registry key of a CP shard of ``layout`` (a constant of the layout: made once while tracing and
    kept in the layout's cache, so it lives as long as the layout)."""
    return id(layout.cp_shard(cp, rank, scheme=scheme, tp=tp, align=align))


@torch._dynamo.assume_constant_result
def _shard_width(layout: Any, cp: int, rank: int, scheme: str, tp: int, align: Optional[str]) -> int:
    return int(layout.cp_shard(cp, rank, scheme=scheme, tp=tp, align=align).q_width)


def _check_cp_offsets(layout: Any, cu: torch.Tensor) -> None:
    """A CP call's whole-batch cu_seq_lens_q given beside its maskpack_layout: the same sequences (the
    layout may hold padding after them)."""
    import numpy as np
    from ._layout import Layout

    want = _segment_ids(layout)
    cu = _host(torch.as_tensor(cu))
    ids = _segment_ids(Layout.from_cu_seqlens(cu, form="te", total=max(int(want.size), int(cu[-1]))))
    n = min(ids.size, want.size)
    bad = np.nonzero(ids[:n] != want[:n])[0]
    if bad.size or ids.size != want.size:
        t = int(bad[0]) if bad.size else n
        raise Error(f"cu_seq_lens_q: disagrees with maskpack_layout at token {t} of the whole batch",
                    "MASKPACK_ERR_VALUE", argument="cu_seq_lens_q", index=(t,))


@torch._dynamo.assume_constant_result
def _segment_rows(layout: Any) -> Tuple[int, ...]:
    """The row of each segment (a constant of the layout: computed once while tracing)."""
    return tuple(seg[0] for seg in layout.segments)


class _PatchedForward:
    """A patched layer's forward: an object rather than a bound function, so that a patched model
    still deep-copies (the copy's forward calls the copy) and pickles (torch.save of the model)."""

    def __init__(self, module: torch.nn.Module, projections: str, threads: Optional[int],
                 cp: Optional[dict] = None, tail_padding: bool = False) -> None:
        self.module, self.projections, self.threads, self.cp = module, projections, threads, cp
        self.tail_padding = tail_padding

    def _cp_call(self, hidden_states: torch.Tensor, cache_params: Any, kwargs: dict) -> torch.Tensor:
        """Context parallelism: hidden_states [1, T_local, hidden] is this rank's shard of the whole
        batch, described by ``maskpack_layout`` (a Layout passed through the model call) or by the
        whole batch's ``cu_seq_lens_q`` (as ring-attention trainers pass the global offsets)."""
        from ._layout import Layout

        if cache_params is not None and cache_params.has_previous_state(getattr(self.module, "layer_idx", None)):
            raise Error("group: a patched layer with context parallelism does not continue a cache (generation "
                        "runs without group=)", "MASKPACK_ERR_UNSUPPORTED", argument="group")
        import torch.distributed as dist

        layout = kwargs.get("maskpack_layout")
        cu = kwargs.get("cu_seq_lens_q")
        name = "maskpack_layout" if layout is not None else "cu_seq_lens_q"
        ok = None
        if layout is None and cu is not None:
            if compiling():
                raise Error("maskpack_layout: under torch.compile a patched layer with context parallelism takes the "
                            "whole batch as maskpack_layout=<Layout> (built outside the compiled function); offsets "
                            "read from tensor values cannot be traced", "MASKPACK_ERR_NOT_FOUND",
                            argument="maskpack_layout")
            layout = Layout.from_cu_seqlens(_host(torch.as_tensor(cu)), form="te")
        elif layout is not None:
            check_layout(layout)
            if cu is not None and compiling():  # checked when the graph runs, in an opaque op
                ok = _above("compile").check_cp_offsets(hidden_states, layout, cu)
            elif cu is not None:  # both: the same sequences (the layout may hold padding after them)
                _check_cp_offsets(layout, cu)
        if layout is None:
            raise Error("group: a patched layer under context parallelism needs the whole batch: pass "
                        "maskpack_layout=<Layout of the whole batch> (or the whole batch's cu_seq_lens_q) to the "
                        "model call", "MASKPACK_ERR_INVALID_ARGUMENT", argument="group")
        if hidden_states.dim() != 3 or hidden_states.shape[0] != 1:
            raise Error(f"hidden_states: under context parallelism one packed row [1, T_local, hidden], found shape "
                        f"{list(hidden_states.shape)}", "MASKPACK_ERR_SHAPE", argument="hidden_states")
        c = self.cp
        g_ = c["group"]
        world, rank = dist.get_world_size(g_), dist.get_rank(g_)
        mine = _shard_width(layout, world, rank, c["cp_scheme"], c["tp"], c["align"]) if compiling() else \
            layout.cp_shard(world, rank, scheme=c["cp_scheme"], tp=c["tp"], align=c["align"]).q_width
        if int(hidden_states.shape[1]) != mine:
            # offsets that cover fewer (or more) tokens than the ranks hold: never a silent tail of padding.
            # Every rank holds the same arguments and shapes, so every rank raises here alike.
            raise Error(f"{name}: expected the whole batch of which this rank (rank {rank} of {world}) holds "
                        f"{int(hidden_states.shape[1])} tokens; the {name} given ({layout.n_tokens} tokens in "
                        f"{layout.n_segments} sequences) gives it {mine}", "MASKPACK_ERR_SHAPE", argument=name)
        out = _layer_forward(self.module, self.projections, hidden_states[0], layout, None, None, True, self.threads,
                             self.cp, ok=ok)[0]
        return out.unsqueeze(0)

    def __call__(self, hidden_states: torch.Tensor, cache_params: Any = None,
                 attention_mask: Optional[torch.Tensor] = None, **kwargs: Any) -> torch.Tensor:
        """transformers' call of a GDN layer -> maskpack's layer with that layer's parameters, per
        sequence. The sequences come from whatever the call carries, by prepare_batch's rules (see
        :func:`_call_layout`): cu_seq_lens_q / cu_seqlens / seq_idx (one packed row [1, T, hidden]),
        the model call's position ids, the 2D keep mask, a maskpack_layout; forms that disagree, or
        tokens left out of every sequence that nothing marks as padding, raise maskpack.Error."""
        mod = self.module
        if self.cp is not None:
            return self._cp_call(hidden_states, cache_params, kwargs)
        layer_idx = getattr(mod, "layer_idx", None)
        if cache_params is not None and cache_params.has_previous_state(layer_idx):
            # a decode step or a continuation: transformers' own path reads and updates its cache
            rest = {k: v for k, v in kwargs.items() if not k.startswith("maskpack_")}
            return type(mod).forward(mod, hidden_states, cache_params=cache_params, attention_mask=attention_mask,
                                     **rest)
        B = hidden_states.shape[0]
        ok = None
        if compiling():
            layout, ok = _compiled_layout(hidden_states, attention_mask, kwargs, getattr(self, "tail_padding", False))
            rows = list(_segment_rows(layout))
        else:
            layout, _ = _call_layout(hidden_states, attention_mask, kwargs, getattr(self, "tail_padding", False))
            rows = [seg[0] for seg in layout.segments]
        if layout.packed:
            out, state, _, conv_in = _layer_forward(mod, self.projections, hidden_states[0], layout, None, None, True,
                                                    self.threads, ok=ok)
            out, conv_in = out.unsqueeze(0), conv_in.unsqueeze(0)
        else:
            out, state, _, conv_in = _layer_forward(mod, self.projections, hidden_states, layout, None, None, True,
                                                    self.threads, ok=ok)
        if cache_params is not None and len(set(rows)) == len(rows):
            # a prefill of one sequence per row: the entries transformers' own prefill writes, so
            # generation continues from them: the conv's last `kernel` inputs per row (as transformers
            # keeps them) and the final recurrent state per row (rows without a token keep zeros). A
            # row holding several sequences is no batch to continue: the cache (which transformers'
            # training forward creates by default) gets no entry for this layer.
            cache_params.update_conv_state(conv_in.transpose(1, 2), layer_idx, conv_kernel_size=mod.conv_kernel_size)
            per_row = state.new_zeros((B, *state.shape[1:]))
            per_row[rows] = state
            cache_params.update_recurrent_state(per_row, layer_idx)
        return out


# transformers model -> the number of GDN layers patched (or given back), in place
def patch_linear_attention(model: torch.nn.Module, enabled: bool = True, threads: Optional[int] = None, *,
                           group: Any = None, cp_scheme: str = "zigzag", tp: int = 1,
                           align: Optional[str] = "verl", cp_method: str = "auto", tail_padding: bool = False) -> int:
    """Routes the Gated DeltaNet layers of a transformers Qwen3-Next / Qwen3.5 model (any module of
    class Qwen3NextGatedDeltaNet, Qwen3_5GatedDeltaNet or Qwen3_5MoeGatedDeltaNet) through
    maskpack, in place; returns how many layers it set. ``enabled=False`` gives them back their
    own forward (and returns how many it gave back).

    Each patched layer keeps its parameters (the optimizer, state dict and checkpoints see no
    change) and runs per sequence, never across a boundary. It takes the sequences from whatever
    the model call carries, by the rules of :func:`maskpack.prepare_batch`: flash-attention's
    ``cu_seq_lens_q`` (DataCollatorWithFlattening(return_flash_attn_kwargs=True)), ``seq_idx``
    (``return_seq_idx=True``), ``cu_seqlens``, a ``maskpack_layout=<Layout>``, the model call's
    ``position_ids`` (the collator's default: a position that restarts at 0 starts a sequence; the
    patch hooks ``model`` so that its call's position ids reach the layers, which transformers does
    not do) or the 2D attention mask (a padded batch never reads its padding). Forms that disagree
    raise maskpack.Error naming the first token where they do, so does a description of one packed
    row given for several rows; tokens that the segments leave out (offsets that sum to fewer than
    the row's tokens, a trailing run of zero position ids) raise unless the 2D mask or a
    maskpack_layout marks them as padding or ``tail_padding=True`` says that such a tail is padding
    (its outputs are then 0). Calls that continue a cache (generation's decode steps) take
    transformers' own path.

    ``group`` (a torch.distributed ProcessGroup): context parallelism. Each layer then receives this
    rank's CP shard ``[1, T_local, hidden]`` (``layout.shard(x, cp, rank, cp_scheme, tp, align)``) and
    the whole batch through the model call, as ``maskpack_layout=<Layout>`` or as the whole batch's
    ``cu_seq_lens_q``; the conv and the recurrence run head-parallel across the group (see
    :func:`maskpack.distributed.gated_delta_rule_cp`) and the layer returns this rank's shard."""
    n = 0
    for mod in model.modules():
        if type(mod).__name__ not in _HF_GDN_LAYERS:
            continue
        if not enabled:
            if "forward" in mod.__dict__:  # the instance attribute set below shadows the class's
                del mod.forward
                n += 1
            continue
        act = getattr(mod, "activation", "silu")
        if act not in ("silu", "swish"):
            raise Error(f"hidden_act: the conv activation must be silu, found {act!r}", "MASKPACK_ERR_UNSUPPORTED",
                        argument="hidden_act")
        projections = "qwen3_next" if hasattr(mod, "in_proj_qkvz") else "qwen3_5"
        cp = None if group is None else {"group": group, "cp_scheme": cp_scheme, "tp": tp, "align": align,
                                         "cp_method": cp_method}
        mod.forward = _PatchedForward(mod, projections, threads, cp, bool(tail_padding))
        n += 1
    taps = [k for k, h in model._forward_pre_hooks.items() if isinstance(h, _CallTap)]
    if not enabled:
        for k in taps:
            del model._forward_pre_hooks[k]
            model._forward_pre_hooks_with_kwargs.pop(k, None)
    elif n and not taps:
        index = _tap_index(model)
        if index is not None:
            model.register_forward_pre_hook(_CallTap(index), with_kwargs=True)
    return n
