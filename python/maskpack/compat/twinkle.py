"""Drop-in twins of twinkle's batch steps, pinned to **twinkle-kit 0.5.1** (``twinkle/processor/base.py``,
methods of ``InputProcessor``; here plain functions of the inputs, with what the processor reads from its
device mesh and platform as keyword-only arguments: ``cp=``, ``cp_rank=``, ``tp=``, ``sequence_parallel=``,
``npu=``, ``attention_mask_type=``). They import nothing from twinkle.

Differences, on purpose:

* ``split_cp`` splits ``attention_mask`` with the tokens (a ``[B, T]`` keep mask along its last dimension, a 4D
  mask along its query rows); twinkle 0.5.1 leaves it whole, so a Gated DeltaNet layer reading it under CP
  sees a mask of the wrong length.
* ``get_packed_seq_params`` returns Megatron's ``PackedSeqParams`` (or maskpack's stand-in) with twinkle's
  values (``max_seqlen_*`` 0-dim int32 tensors, as twinkle leaves them).
* Where twinkle silently builds a wrong batch the twin raises ``maskpack.Error``: position ids whose first
  token is not a sequence start (twinkle's cu_seqlens would not start at 0 and ``pad_cp`` would drop the
  tokens before it), a 4D ``attention_mask`` in ``pad_cp`` (twinkle pads only its key columns), sequences that
  do not divide by ``2 cp`` in ``split_cp``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from .._errors import Error
from .._layout import Layout
from .._moves import relayout
from . import _common
from ._common import resolve_parallel, Taker
from .mcore_bridge import _npu, shard_index

__all__ = ["drop_causal_4d_mask", "get_packed_seq_params", "pad_cp", "split_cp", "PADDING_MAP"]

UPSTREAM = "twinkle-kit==0.5.1"

# twinkle's InputProcessor.padding_map: the fill of each key's padding
PADDING_MAP = {"input_ids": 0, "mm_token_type_ids": 0, "inputs_embeds": 0.0, "attention_mask": 0, "labels": -100,
               "completion_mask": 0, "loss_scale": 0.0, "position_ids": -1, "length": -1, "pixel_values": 0.0,
               "image_grid_thw": 0, "pixel_values_videos": 0.0, "video_grid_thw": 0, "input_features": 0.0,
               "feature_attention_mask": 0, "routed_experts": 0}

_PAD_KEYS = ("input_ids", "position_ids", "attention_mask", "labels", "completion_mask", "mm_token_type_ids")


def drop_causal_4d_mask(inputs: List[Dict[str, Any]], *, npu: Optional[bool] = None,
                        attention_mask_type: Optional[str] = None,
                        keep_attention_mask_2d: bool = False) -> List[Dict[str, Any]]:
    """twinkle's ``drop_causal_4d_mask``: on an NPU with a causal mask type, a dense 4D ``attention_mask`` is
    dropped (MindSpeed builds its compressed causal mask). ``keep_attention_mask_2d=True`` (not in twinkle)
    first keeps the ``[B, S]`` keep mask the Gated DeltaNet layers need as ``attention_mask_2d``. In place;
    returns ``inputs``."""
    if not _npu(npu) or attention_mask_type != "causal":
        return inputs
    for inp in inputs:
        mask = inp.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 4:
            if keep_attention_mask_2d and "attention_mask_2d" not in inp:
                from .mcore_bridge import resolve_gdn_attention_mask

                inp["attention_mask_2d"] = resolve_gdn_attention_mask({"attention_mask": mask}, npu=False)
            inp["attention_mask"] = None
    return inputs


def _cu_from_positions(fn: str, position_ids: torch.Tensor) -> torch.Tensor:
    p = position_ids
    if p.dim() >= 2 and p.shape[0] > 1:
        p = p[:1]
    f = p.detach().reshape(-1).cpu()
    if f.numel() == 0 or int(f[0]) != 0:
        raise Error(f"{fn}: the first position id must be 0 (a sequence start), found "
                    f"{int(f[0]) if f.numel() else 'no tokens'}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="position_ids", index=(0,))
    starts = torch.nonzero(f == 0).flatten()
    return torch.cat([starts, torch.tensor([f.numel()])])


def get_packed_seq_params(position_ids: torch.Tensor, *, npu: Optional[bool] = None):
    """twinkle's ``InputProcessor._get_packed_seq_params``: a sequence starts at every position 0 of the first row
    of ``position_ids``; thd ``PackedSeqParams`` with int32 ``cu_seqlens_q/kv`` and 0-dim int32 ``max_seqlen_*``; on
    an NPU the padded offsets equal the real ones."""
    fn = "get_packed_seq_params"
    lay = Layout.from_cu_seqlens(_cu_from_positions(fn, position_ids))
    dev = position_ids.device
    cu = torch.as_tensor(lay.cu_seqlens(dtype="int32")).to(dev)
    m = torch.tensor(lay.max_seqlen, dtype=torch.int32, device=dev)
    params = _common.packed_seq_params(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=m, max_seqlen_kv=m,
                                       qkv_format="thd")
    if _npu(npu):
        params.cu_seqlens_q_padded = cu
        params.cu_seqlens_kv_padded = cu
    return params


def pad_cp(inputs: List[Dict[str, Any]], *, cp: Optional[int] = None, tp: Optional[int] = None,
           sequence_parallel: bool = False, padding_map: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    """twinkle's ``pad_cp`` (Megatron framework): under CP each sequence of the packed row (a sequence starts at
    every position 0) padded at its end to a multiple of ``2 cp`` in ``input_ids``, ``position_ids``,
    ``attention_mask``, ``labels``, ``completion_mask``, ``mm_token_type_ids`` (fills from ``padding_map``:
    position ids -1, labels -100, else 0); without CP but with sequence parallelism (tp > 1) the whole row to a
    multiple of tp. In place; returns ``inputs``."""
    fn = "pad_cp"
    tp, cp, _ = resolve_parallel(fn, tp, cp, 0, need=("tp", "cp"))
    fills = PADDING_MAP if padding_map is None else padding_map
    for inp in inputs:
        if cp > 1:
            pos = inp.get("position_ids")
            src = Layout.from_cu_seqlens(_cu_from_positions(fn, pos))
            dst = src.pad_to_multiple(2 * cp)
            for key in _PAD_KEYS:
                v = inp.get(key)
                if v is None:
                    continue
                if key == "attention_mask" and v.dim() > 2:
                    raise Error(f"{fn}: attention_mask is {v.dim()}D; twinkle pads only its last (key) dimension: pass "
                                "the [B, T] keep mask", "MASKPACK_ERR_SHAPE", argument="attention_mask")
                if v.shape[-1] != src.q_width:
                    raise Error(f"{fn}: {key} holds {v.shape[-1]} tokens, position_ids {src.q_width}",
                                "MASKPACK_ERR_SHAPE", argument=key)
                moved = relayout(v.movedim(-1, 0).contiguous(), src, dst, pad_value=fills.get(key, 0))
                inp[key] = moved.movedim(0, -1).contiguous()
        elif sequence_parallel and tp > 1:
            for key in _PAD_KEYS:
                v = inp.get(key)
                if v is not None and v.shape[-1] % tp:
                    inp[key] = torch.nn.functional.pad(v, (0, tp - v.shape[-1] % tp), value=fills.get(key, 0))
    return inputs


def split_cp(inputs: List[Dict[str, Any]], *, cp: Optional[int] = None,
             cp_rank: Optional[int] = None) -> List[Dict[str, Any]]:
    """twinkle's ``split_cp`` (Megatron framework): each input's rank part under CP, zigzag per sequence of
    ``packed_seq_params.cu_seqlens_q`` (or over the whole row): ``input_ids``, ``labels`` along dim 1,
    ``position_ids``, ``completion_mask``, ``mm_token_type_ids`` along the last dim and, unlike twinkle,
    ``attention_mask`` (``[B, T]``: its last dim; 4D: its query rows). In place; returns ``inputs``."""
    fn = "split_cp"
    _, cp, cp_rank = resolve_parallel(fn, 1, cp, cp_rank, need=("cp", "cp_rank"))
    for inp in inputs:
        ids, pos, mask, labels = (inp.get(k) for k in ("input_ids", "position_ids", "attention_mask", "labels"))
        psp = inp.get("packed_seq_params")
        cu = getattr(psp, "cu_seqlens_q", None) if psp is not None else None
        if cp > 1:
            cache = {}

            def split(v, dim, name):
                if v is None:
                    return v
                dim = dim % v.ndim
                n = v.shape[dim]
                if n not in cache:
                    cache[n] = Taker(shard_index(fn, n, cu, cp, cp_rank, "zigzag"), n)
                return cache[n](v, dim)

            ids = split(ids, 1, "input_ids")
            pos = split(pos, -1, "position_ids")
            labels = split(labels, 1, "labels")
            if mask is not None:
                mask = split(mask, -2 if mask.dim() == 4 else -1, "attention_mask")
            for key in ("completion_mask", "mm_token_type_ids"):
                if inp.get(key) is not None:
                    inp[key] = split(inp[key], -1, key)
        inp["input_ids"] = ids
        inp["position_ids"] = pos
        inp["attention_mask"] = mask
        inp["labels"] = labels
    return inputs
