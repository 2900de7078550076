"""Checking a hand-written ``torch_npu.npu_fusion_attention`` call against the operator's contract."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from . import _maskpack
from ._errors import Error
from ._runtime import enum
from ._layout import NPU_LAYOUTS, Layout, _int
from ._tensors import describe

__all__ = ["validate_npu_args", "NPU_FINDING_NAMES"]

# finding code -> its constant's name (MASKPACK_NPU_BAD_LAYOUT...)
NPU_FINDING_NAMES = {v: k for k, v in enum("npu_finding").items()}

_OPERATOR_DEFAULT_TOKENS = 2147483647
_UNKNOWN_LAYOUT = 99  # an input_layout string the operator does not know: reported as a finding


def _shape(x: Any, name: str) -> Optional[List[int]]:
    if x is None:
        return None
    try:
        return [_int(d, name) for d in x]
    except TypeError:
        raise TypeError(f"{name}: expected a shape (sequence of ints), found {x!r}") from None


def _dims_from_shapes(layout: str, q: Optional[List[int]], k: Optional[List[int]],
                      head_num: Optional[int]) -> Dict[str, int]:
    """Operator shapes -> batch / lengths / heads / head_dim (0 = unknown)."""
    out = {"batch": 0, "q_len": 0, "kv_len": 0, "total_q": 0, "total_kv": 0, "heads_q": 0, "heads_kv": 0,
           "head_dim": 0}
    rank = {"BSND": 4, "BNSD": 4, "BSH": 3, "SBH": 3, "TND": 3}.get(layout)
    if rank is None:
        return out
    for name, s in (("query_shape", q), ("key_shape", k)):
        if s is not None and len(s) != rank:
            raise Error(f"{name}: input_layout {layout} expects rank {rank}, found shape {s}", "MASKPACK_ERR_SHAPE",
                        argument=name)
    if q is not None:
        if layout == "BSND":
            out.update(batch=q[0], q_len=q[1], heads_q=q[2], head_dim=q[3])
        elif layout == "BNSD":
            out.update(batch=q[0], heads_q=q[1], q_len=q[2], head_dim=q[3])
        elif layout in ("BSH", "SBH"):
            b, s = (q[0], q[1]) if layout == "BSH" else (q[1], q[0])
            out.update(batch=b, q_len=s)
            if head_num:
                if q[2] % head_num:
                    raise Error(f"query_shape: hidden size {q[2]} is not divisible by head_num {head_num}",
                                "MASKPACK_ERR_SHAPE", argument="query_shape")
                out.update(heads_q=head_num, head_dim=q[2] // head_num)
        else:  # TND
            out.update(total_q=q[0], heads_q=q[1], head_dim=q[2])
    if k is not None:
        if layout == "BSND":
            out.update(kv_len=k[1], heads_kv=k[2])
        elif layout == "BNSD":
            out.update(heads_kv=k[1], kv_len=k[2])
        elif layout in ("BSH", "SBH"):
            out.update(kv_len=k[1] if layout == "BSH" else k[0])
            if out["head_dim"]:
                out.update(heads_kv=k[2] // out["head_dim"])
        else:
            out.update(total_kv=k[0], heads_kv=k[1])
    elif q is not None:
        # self-attention call described by the query alone
        out.update(kv_len=out["q_len"], total_kv=out["total_q"], heads_kv=out["heads_q"])
    return out


def validate_npu_args(*, input_layout: str, atten_mask: Any = None, sparse_mode: int = 0,
                      pre_tockens: Optional[int] = None, next_tockens: Optional[int] = None,
                      actual_seq_qlen: Any = None, actual_seq_kvlen: Any = None, prefix: Any = None,
                      scale: Optional[float] = None, inner_precise: int = 0,
                      query_shape: Optional[Sequence[int]] = None, key_shape: Optional[Sequence[int]] = None,
                      head_num: Optional[int] = None, batch: Optional[int] = None, q_len: Optional[int] = None,
                      kv_len: Optional[int] = None, total_q: Optional[int] = None, total_kv: Optional[int] = None,
                      heads_q: Optional[int] = None, heads_kv: Optional[int] = None,
                      head_dim: Optional[int] = None, query: Any = None, key: Any = None, value: Any = None,
                      intended: Optional[Layout] = None, raise_on_error: bool = False,
                      pre_tokens: Optional[int] = None, next_tokens: Optional[int] = None,
                      keep_prob: Any = None, pse: Any = None, padding_mask: Any = None,
                      gen_mask_parallel: Any = None, sync: Any = None) -> List[Dict[str, Any]]:
    """Check the keyword arguments of an ``npu_fusion_attention`` call against the operator's contract.

    Pass the call's own keyword arguments (the operator spells ``pre_tockens`` / ``next_tockens``;
    MindSpeed's ``pre_tokens`` / ``next_tokens`` are accepted too) plus the sizes: ``query`` and
    ``key`` tensors (only their shapes are read) or ``query_shape`` / ``key_shape``, with
    ``head_num`` for the BSH/SBH layouts, or the explicit ``batch``, ``q_len``, ``kv_len``,
    ``total_q``, ``total_kv``, ``heads_q``, ``heads_kv``, ``head_dim``. ``intended``: the layout
    the call is meant to compute (adds a check that the call computes exactly its predicate).

    Returns a list of findings ``{"code": "MASKPACK_NPU_...", "value": int, "message": str}``
    (empty when the call is valid). ``raise_on_error=True`` raises maskpack.Error with every
    finding in the message (and in its ``findings`` attribute) instead.
    """
    del value, keep_prob, pse, padding_mask, gen_mask_parallel, sync  # accepted, not checked here
    if not isinstance(input_layout, str):
        raise TypeError(f"input_layout: expected a string such as 'TND' or 'BSND', found {input_layout!r}")
    if pre_tockens is not None and pre_tokens is not None:
        raise TypeError("pass pre_tockens (torch_npu) or pre_tokens (MindSpeed), not both")
    if next_tockens is not None and next_tokens is not None:
        raise TypeError("pass next_tockens (torch_npu) or next_tokens (MindSpeed), not both")
    pre = pre_tockens if pre_tockens is not None else pre_tokens
    nxt = next_tockens if next_tockens is not None else next_tokens
    pre = _OPERATOR_DEFAULT_TOKENS if pre is None else _int(pre, "pre_tockens")
    nxt = _OPERATOR_DEFAULT_TOKENS if nxt is None else _int(nxt, "next_tockens")

    if query_shape is None and query is not None:
        query_shape = tuple(query.shape)
    if key_shape is None and key is not None:
        key_shape = tuple(key.shape)
    hn = None if head_num is None else _int(head_num, "head_num")
    dims = _dims_from_shapes(input_layout, _shape(query_shape, "query_shape"), _shape(key_shape, "key_shape"), hn)
    for name, v in (("batch", batch), ("q_len", q_len), ("kv_len", kv_len), ("total_q", total_q),
                    ("total_kv", total_kv), ("heads_q", heads_q), ("heads_kv", heads_kv), ("head_dim", head_dim)):
        if v is not None:
            dims[name] = _int(v, name)

    if scale is None:
        sc = math.nan
    elif isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"scale: expected a float, found {scale!r}")
    else:
        sc = float(scale)
    if intended is not None and not isinstance(intended, Layout):
        raise TypeError(f"intended: expected a maskpack.Layout, found {type(intended).__name__}")

    def desc(x, name):
        if x is None:
            return None
        return describe(x, name, list_dtype=np.int64 if name != "atten_mask" else None)[0]

    _status, findings, n_total = _maskpack.validate_npu_args(
        NPU_LAYOUTS.get(input_layout, _UNKNOWN_LAYOUT),
        sparse_mode=_int(sparse_mode, "sparse_mode"),
        pre_tokens=pre,
        next_tokens=nxt,
        atten_mask=desc(atten_mask, "atten_mask"),
        actual_seq_qlen=desc(actual_seq_qlen, "actual_seq_qlen"),
        actual_seq_kvlen=desc(actual_seq_kvlen, "actual_seq_kvlen"),
        prefix=desc(prefix, "prefix"),
        scale=sc,
        inner_precise=_int(inner_precise, "inner_precise"),
        intended=None if intended is None else intended._h,
        **dims,
    )
    out = [{"code": NPU_FINDING_NAMES.get(c, f"MASKPACK_NPU_{c}"), "value": c, "message": m} for c, m in findings]
    if raise_on_error and out:
        lines = "\n".join(f"  - {f['code']}: {f['message']}" for f in out)
        more = f"\n  ({n_total - len(out)} more not shown)" if n_total > len(out) else ""
        err = Error(f"npu_fusion_attention arguments break the operator's contract ({n_total} finding"
                    f"{'s' if n_total != 1 else ''}):\n{lines}{more}", "MASKPACK_ERR_NPU_CONTRACT")
        err.findings = out
        raise err
    return out
