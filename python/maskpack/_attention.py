"""Fused CPU attention over a layout: forward, backward and a torch autograd wrapper.

    >>> lay = maskpack.Layout.from_lengths([300, 120], placement="packed")   # causal by default
    >>> out, lse = maskpack.attention(q, k, v, lay)        # q [T,Hq,D], k, v [T,Hkv,D]

The attention rule is the layout's (segments, causal with its alignment, windows, spans, prefix,
CP shards), so a padded batch, a packed batch and a CP shard of it give the same answer for every
real token. Tensors: q (and out, dout, dq) are ``[B,S,Hq,D]`` for padded / packed-row layouts and
``[T,Hq,D]`` for packed ones; k and v (dk, dv) the same over the key grid with Hkv heads (Hq a
multiple of Hkv); lse is float32 ``[B,Hq,S]`` or ``[Hq,T]`` (flash-attn's softmax_lse). dtypes:
float32, or bfloat16 with float32 accumulation. Torch tensors in give torch tensors out; numpy
arrays give numpy arrays. Query rows that may see nothing get out 0 and lse -inf.

When torch autograd is recording and an input requires grad, :func:`attention` runs through
:class:`AttentionFunction`, so a torch model trains through it on the CPU. The environment variable
``MASKPACK_ISA=ref|avx2|avx512|amx`` forces a kernel (see :func:`attention_isa`).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

import numpy as np

from ._maskpack import attention as _attention
from ._errors import Error
from ._tensors import (DTYPE_CODE, ISA_CODES, describe, describe_out, dtype_code, is_torch_tensor, named_dtype_code,
                       isa_code, layout_handle)
from ._runtime import cache_of as _cache_of, team as _team, threads as _threads
from ._runtime import above as _above  # the layers above this one, by name (see there)
from ._tensors import compiling

__all__ = ["attention", "attention_backward", "attention_autograd", "attention_isa", "AttentionFunction"]


def _scale(scale: Optional[float]) -> float:
    if scale is None:
        return 0.0  # the library's 1/sqrt(D)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"scale: expected a float or None, found {type(scale).__name__}")
    return float(scale)


def _softcap(softcap: Any) -> float:
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float, np.floating, np.integer)):
        raise TypeError(f"softcap: expected a float, found {type(softcap).__name__}")
    return float(softcap)


def _alias(threads: Optional[int], n_threads: Optional[int]) -> Optional[int]:
    """``threads=`` is the name every maskpack call uses; ``n_threads=`` (this module's first spelling)
    stays accepted. Both given and different: an error."""
    if threads is not None and n_threads is not None and threads != n_threads:
        raise Error(f"threads: given as threads={threads!r} and n_threads={n_threads!r}; pass one",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="threads")
    return threads if threads is not None else n_threads


def _empty_like(x: Any, shape=None, dtype=None) -> Any:
    """A contiguous uninitialised array/tensor of x's kind (the library writes every element)."""
    shape = tuple(x.shape) if shape is None else tuple(shape)
    if is_torch_tensor(x):
        import torch

        from ._alloc import fresh  # imports torch: only on this path (numpy callers need no torch)

        return fresh(shape, x.dtype if dtype is None else getattr(torch, dtype))
    return np.empty(shape, dtype=x.dtype if dtype is None else np.dtype(dtype))


def _lse_shape(layout: Any, q: Any) -> Tuple[int, ...]:
    if q.ndim == 3:  # packed [T, Hq, D]
        return (int(q.shape[1]), int(q.shape[0]))
    if q.ndim == 4:
        return (int(q.shape[0]), int(q.shape[2]), int(q.shape[1]))
    raise Error(
        f"q: expected [B,S,Hq,D] or [T,Hq,D], found {q.ndim} dimensions", "MASKPACK_ERR_SHAPE", argument="q"
    )


def _needs_grad(*xs: Any) -> bool:
    if not any(is_torch_tensor(x) for x in xs):
        return False
    import torch

    return torch.is_grad_enabled() and any(is_torch_tensor(x) and x.requires_grad for x in xs)


def _op(layout, handle, dq, dk, threads, isa):
    """The C operator of the attention for this layout, head shapes, dtype and thread count, made on
    first use and kept in the layout's cache (the kernel choice, the work items and the key groups
    are planned once per layout, and its workspace kept, not per call); None where the tensors cannot
    make one: the plain call then names the problem as it always has."""
    qs, ks = dq.shape, dk.shape
    if len(qs) < 3 or len(ks) < 3:
        return None
    # the op picks its kernel when made, MASKPACK_ISA included: a change of the variable makes another
    key = ("attention_op", int(qs[-2]), int(ks[-2]), int(qs[-1]), dtype_code(dq, "q"), threads, isa,
           os.environ.get("MASKPACK_ISA") if isa == 0 else None)
    cache = _cache_of(layout)
    op = cache.get(key)
    if op is None:
        try:
            op = _attention.op_create(handle, *key[1:7])
        except Error:
            return None
        cache[key] = op
    return op


def _forward(q, k, v, layout, scale, softcap, out, n_threads, isa=0):
    if is_torch_tensor(q):
        q, k, v = (x.detach() if is_torch_tensor(x) else x for x in (q, k, v))
    handle = layout_handle(layout)
    if out is None:
        out = _empty_like(q)
    lse = _empty_like(q, _lse_shape(layout, q), "float32")
    dq, dk, dv = (describe(x, name)[0] for x, name in ((q, "q"), (k, "k"), (v, "v")))
    do = describe_out(out, "out")[0]
    dl = describe(lse, "lse")[0]
    threads = _threads(n_threads)
    op = _op(layout, handle, dq, dk, threads, isa)
    if op is None:
        _attention.forward(handle, dq, dk, dv, _scale(scale), _softcap(softcap), do, dl, threads, isa)
    else:
        _attention.op_forward(op, _team(threads), dq, dk, dv, _scale(scale), _softcap(softcap), do, dl)
    return out, lse


# q [B,S,Hq,D] | [T,Hq,D], k, v [.., Hkv, D], layout -> (out like q, lse float32 [B,Hq,S] | [Hq,T])
def attention(q: Any, k: Any, v: Any, layout: Any, scale: Optional[float] = None, softcap: float = 0.0,
              out: Any = None, n_threads: Optional[int] = None, threads: Optional[int] = None, *,
              group: Any = None, cp_scheme: str = "zigzag", tp: int = 1, align: Optional[str] = "verl",
              cp_algorithm: str = "auto", isa: Optional[str] = None) -> Any:
    """Attention of q over k, v under the layout's rule -> ``(out, lse)``.

    scale: None (or 0) = 1/sqrt(D); softcap: 0 = none, else logits become softcap*tanh(s/softcap).
    out: an optional preallocated output (q's shape and dtype). n_threads: default = torch's thread
    count for torch tensors, else the CPUs this process may use. When autograd records and an input
    requires grad, the call is differentiable in q, k, v (lse is not). isa: the kernel for this call
    ("ref", "avx2", "avx512", "avx512_bf16", "amx"; None or "auto": MASKPACK_ISA, else the best this
    CPU runs); one this CPU lacks raises maskpack.Error naming the missing feature.

    ``group`` (a torch.distributed ProcessGroup): context parallelism; q, k, v are this rank's CP shard
    of the whole ``layout`` and the result is ``(out, lse)`` of this rank's query rows, in its shard's
    token order: lse float32 ``[Hq, T_local]`` (``[B, Hq, S_local]`` for a padded shard), the rows of
    the whole batch's lse this rank holds (a pad slot of the shard sees no key: out 0, lse -inf); out
    differentiable, lse not (see :func:`maskpack.distributed.attention_cp`); ``cp_algorithm``: "auto"
    (the ring on CPU float32, else the all-gather), "ring" or "all_gather"."""
    if group is not None:
        if out is not None:
            raise TypeError("attention(): out= cannot be combined with group=")
        if isa is not None:
            raise TypeError("attention(): isa= cannot be combined with group= (the CP algorithms choose their kernels)")
        if compiling():  # the whole CP call is one opaque op (maskpack._compile.cp_call), collectives included
            return _above("compile").cp_call("attention", [q, k, v], layout, group,
                                             dict(scale=scale, softcap=softcap, threads=_alias(threads, n_threads),
                                                  scheme=cp_scheme, tp=tp, align=align, algorithm=cp_algorithm))
        return _above("cp").attention_cp(q, k, v, layout, group, scale=scale, softcap=softcap, threads=_alias(threads, n_threads),
                                         scheme=cp_scheme, tp=tp, align=align, algorithm=cp_algorithm)
    code = isa_code(isa)
    if out is None and compiling():  # under torch.compile: one custom op (maskpack._compile), autograd included
        return _above("compile").attention(q, k, v, layout, scale, softcap, _alias(threads, n_threads), code)
    if _needs_grad(q, k, v):
        if out is not None:
            raise TypeError("attention(): out= cannot be used when autograd records (an input requires grad)")
        return _function().apply(q, k, v, layout, scale, softcap, _alias(threads, n_threads), code)
    return _forward(q, k, v, layout, scale, softcap, out, _alias(threads, n_threads), code)


# dout, q, k, v, out (like q), lse, layout -> (dq, dk, dv) like q, k, v
def attention_backward(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, layout: Any,
                       scale: Optional[float] = None, softcap: float = 0.0,
                       n_threads: Optional[int] = None, threads: Optional[int] = None, *,
                       isa: Optional[str] = None) -> Tuple[Any, Any, Any]:
    """Gradients of :func:`attention` -> ``(dq, dk, dv)`` from dout, the forward's out and lse.

    Tiles are recomputed (flash-attention 2): memory stays linear in the tokens. isa: as for
    :func:`attention`."""
    n_threads = _alias(threads, n_threads)
    code = isa_code(isa)
    xs = (dout, q, k, v, out, lse)
    xs = tuple(x.detach() if is_torch_tensor(x) else x for x in xs)
    dout, q, k, v, out, lse = xs
    handle = layout_handle(layout)
    dq, dk, dv = _empty_like(q), _empty_like(k), _empty_like(v)
    names = ("dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv")
    descs = [describe(x, name)[0] for name, x in zip(names, (dout, q, k, v, out, lse, dq, dk, dv))]
    threads = _threads(n_threads)
    op = _op(layout, handle, descs[1], descs[2], threads, code)
    if op is None:
        _attention.backward(handle, descs[0], descs[1], descs[2], descs[3], descs[4], descs[5], _scale(scale),
                            _softcap(softcap), descs[6], descs[7], descs[8], threads, code)
    else:
        _attention.op_backward(op, _team(threads), descs[0], descs[1], descs[2], descs[3], descs[4], descs[5],
                               _scale(scale), _softcap(softcap), descs[6], descs[7], descs[8])
    return dq, dk, dv


_FUNCTION = None


def _function():
    """The torch.autograd.Function, created on first use so that `import maskpack` needs no torch."""
    global _FUNCTION
    if _FUNCTION is None:
        import torch

        class _AttentionFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, layout, scale, softcap, n_threads, isa=0):
                out, lse = _forward(q, k, v, layout, scale, softcap, None, n_threads, isa)
                ctx.save_for_backward(q, k, v, out, lse)
                ctx.layout, ctx.scale, ctx.softcap, ctx.n_threads, ctx.isa = layout, scale, softcap, n_threads, isa
                ctx.mark_non_differentiable(lse)
                return out, lse

            @staticmethod
            def backward(ctx, dout, dlse):
                q, k, v, out, lse = ctx.saved_tensors
                if dout is None:
                    dout = torch.zeros_like(out)
                if dout.dim() > 0 and dout.stride(-1) != 1:
                    dout = dout.contiguous()
                names = {c: n for n, c in ISA_CODES.items()}
                dq, dk, dv = attention_backward(dout, q, k, v, out, lse, ctx.layout, ctx.scale, ctx.softcap,
                                                ctx.n_threads, isa=names[ctx.isa])
                return dq, dk, dv, None, None, None, None, None

        _FUNCTION = _AttentionFunction
    return _FUNCTION


class AttentionFunction:
    """torch.autograd.Function of :func:`attention`: ``AttentionFunction.apply(q, k, v, layout,
    scale=None, softcap=0.0, n_threads=None, isa=None) -> (out, lse)``; lse is not differentiable. (A
    stand-in that builds the real Function on first use, so importing maskpack needs no torch.)"""

    @staticmethod
    def apply(q, k, v, layout, scale=None, softcap=0.0, n_threads=None, isa=None):
        if compiling():
            return _above("compile").attention(q, k, v, layout, scale, softcap, n_threads, isa_code(isa))
        return _function().apply(q, k, v, layout, scale, softcap, n_threads, isa_code(isa))


# q, k, v, layout -> out like q (differentiable in q, k, v)
def attention_autograd(q: Any, k: Any, v: Any, layout: Any, scale: Optional[float] = None,
                       softcap: float = 0.0, n_threads: Optional[int] = None, threads: Optional[int] = None, *,
                       isa: Optional[str] = None) -> Any:
    """Differentiable attention for torch models: returns ``out`` only (gradients flow to q, k, v)."""
    n_threads = _alias(threads, n_threads)
    if compiling():
        return _above("compile").attention(q, k, v, layout, scale, softcap, n_threads, isa_code(isa))[0]
    return _function().apply(q, k, v, layout, scale, softcap, n_threads, isa_code(isa))[0]


# dtype -> the kernel name the next call on it runs ("ref", "avx2", "avx512", "amx")
def attention_isa(dtype: Any = "float32") -> str:
    """The kernel the next call on this dtype uses: "ref", "avx2", "avx512" or "amx" (the best this
    CPU has, in the order amx (bfloat16 only) > avx512 > avx2 > ref; MASKPACK_ISA honoured, and
    forcing one this CPU lacks raises maskpack.Error). "avx2" is AVX2 + FMA for CPUs without
    AVX-512 (bfloat16 widened to float32); it gives the "avx512" float32 kernel's results bitwise.
    For bfloat16, "avx512" converts once to float32 as rows are loaded, except on CPUs whose
    AVX512-BF16 dot products outrun f32 FMA (AMD's), where its forward runs on them; "amx" runs the
    forward and the backward on tiles (the backward rounds P and dS to bf16 as operands, as
    flash-attention's bf16 backward does; MASKPACK_ISA=avx512 keeps it widened). "avx512_bf16" (asked for by name) runs forward and
    backward on the dot products (docs/kernels.md, the attention's dtypes)."""
    return _attention.isa(named_dtype_code(dtype))
