"""Drop-in twins of TransformerEngine's context-parallel batch helpers, pinned to **TransformerEngine 2.11.0**
(the newest release megatron-core 0.16.1 accepts: ``transformer-engine<2.12``), from
``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py`` and the CUDA extension's
``thd_get_partitioned_indices``. They run on the CPU and on any torch device (TransformerEngine's own
``thd_get_partitioned_indices`` is a CUDA kernel, and its ``pad_thd_sequences_for_cp`` builds its fill on
the CPU whatever the input's device); they import nothing from TransformerEngine.

Differences, on purpose:

* ``generate_positional_ids_for_cp`` continues the positions through each sequence's padding, as
  TransformerEngine does (the twin keeps that); maskpack's own ``Layout.position_ids()`` writes 0 there.
* Where TransformerEngine silently drops tokens (a slot that does not divide by ``2 cp``: its chunk size is
  floored) or computes indices past the end (``total_tokens`` beyond ``cu_seqlens[-1]``), the twin raises
  ``maskpack.Error`` naming the argument.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from .._errors import Error
from .._layout import Layout
from .._moves import relayout
from ._common import Taker

__all__ = ["thd_get_partitioned_indices", "get_cu_seqlens_on_cp_rank", "pad_thd_sequences_for_cp",
           "generate_positional_ids_for_cp", "get_batch_on_this_cp_rank"]

UPSTREAM = "transformer-engine==2.11.0"


def _packed(fn: str, cu: torch.Tensor, name: str = "cu_seqlens", total: Optional[int] = None) -> Layout:
    c = cu.detach().to("cpu", torch.int64)
    if c.dim() != 1 or c.numel() < 1:
        raise Error(f"{fn}: {name} must be 1D with a leading 0, found shape {tuple(cu.shape)}", "MASKPACK_ERR_SHAPE",
                    argument=name)
    if total is not None and int(c[-1]) != total:
        raise Error(f"{fn}: {name} ends at {int(c[-1])}, total_tokens is {total}: cu_seqlens must cover the tokens",
                    "MASKPACK_ERR_SHAPE", argument="total_tokens")
    try:
        return Layout.from_cu_seqlens(c)
    except Error as e:
        raise Error(f"{fn}: {name}: {e.message}", e.status, argument=name, index=e.index) from None


def _check_split(fn: str, cu: torch.Tensor, cp: int, name: str) -> None:
    slots = cu.detach().to("cpu", torch.int64).diff()
    bad = torch.nonzero(slots % (2 * cp)).flatten()
    if bad.numel():
        i = int(bad[0])
        raise Error(f"{fn}: sequence {i}'s slot of {int(slots[i])} tokens does not divide by 2*cp = {2 * cp} "
                    "(TransformerEngine would drop tokens); pad it first (pad_thd_sequences_for_cp)",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument=name, index=(i,))


def thd_get_partitioned_indices(cu_seqlens: torch.Tensor, total_tokens: int, world_size: int,
                                rank: int) -> torch.Tensor:
    """``tex.thd_get_partitioned_indices``: int32 ``[total_tokens / world_size]``, the index of each token
    of rank ``rank``'s zigzag shard in the packed stream (each sequence of ``cu_seqlens`` in ``2 world_size``
    chunks, chunks r and ``2 world_size - 1 - r``), on ``cu_seqlens``' device."""
    fn = "thd_get_partitioned_indices"
    if not (world_size > 0 and 0 <= rank < world_size):
        raise Error(f"{fn}: rank {rank} outside world_size {world_size}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="rank")
    if cu_seqlens.dtype != torch.int32:
        raise Error(f"{fn}: cu_seqlens must be int32, found {cu_seqlens.dtype}", "MASKPACK_ERR_DTYPE",
                    argument="cu_seqlens")
    if total_tokens <= 0 or total_tokens % (2 * world_size):
        raise Error(f"{fn}: total_tokens {total_tokens} must be > 0 and divide by 2*world_size = {2 * world_size}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="total_tokens")
    g = _packed(fn, cu_seqlens, total=int(total_tokens))
    _check_split(fn, cu_seqlens, world_size, "cu_seqlens")
    idx = g.cp_shard_indices(world_size, rank, align=None, dtype="int32")
    return torch.as_tensor(idx).to(cu_seqlens.device)


def get_cu_seqlens_on_cp_rank(cu_seqlens: torch.Tensor, cu_seqlens_padded_on_cp_rank: torch.Tensor, cp_size: int,
                              cp_rank: int, first_half: bool, second_half: bool) -> torch.Tensor:
    """TransformerEngine's ``get_cu_seqlens_on_cp_rank``: cu_seqlens (``cu_seqlens``' dtype and device) of the
    real tokens rank ``cp_rank`` holds in its first and/or second chunk of each sequence, the chunks being
    half of each slot of ``cu_seqlens_padded_on_cp_rank`` (the padded offsets divided by cp)."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    half = (cu_seqlens_padded_on_cp_rank[1:] - cu_seqlens_padded_on_cp_rank[:-1]) // 2
    zero = torch.zeros_like(lens)
    out = torch.zeros_like(cu_seqlens)
    n = out[1:]
    if first_half:  # the rank's chunk cp_rank: its real tokens, between 0 and half
        n.add_((lens - cp_rank * half).clamp_(zero, half))
    if second_half:  # its chunk 2 cp - 1 - cp_rank
        n.add_((lens - (2 * cp_size - cp_rank - 1) * half).clamp_(zero, half))
    return out.cumsum_(0)


def pad_thd_sequences_for_cp(input_ids: torch.Tensor, labels: torch.Tensor, cu_seqlens: torch.Tensor,
                             divisibility_factor: int, padding_token_id: int = 0,
                             padding_label_id: int = -100) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TransformerEngine's ``pad_thd_sequences_for_cp``: a packed ``[N]`` or ``[1, N]`` stream -> each sequence
    padded up to a multiple of ``divisibility_factor`` (``input_ids`` with ``padding_token_id``, ``labels`` with
    ``padding_label_id``), 1D, and ``cu_seqlens_padded`` (int64, as upstream's cumsum gives)."""
    fn = "pad_thd_sequences_for_cp"
    if input_ids.dim() == 2:
        input_ids = input_ids.squeeze(0)
    if labels.dim() == 2:
        labels = labels.squeeze(0)
    if int(divisibility_factor) < 1:
        raise Error(f"{fn}: divisibility_factor must be >= 1, found {divisibility_factor}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="divisibility_factor")
    p = _packed(fn, cu_seqlens, total=None)
    for name, x in (("input_ids", input_ids), ("labels", labels)):
        if x.shape[0] != p.q_width:
            raise Error(f"{fn}: {name} holds {x.shape[0]} tokens, cu_seqlens describes {p.q_width}",
                        "MASKPACK_ERR_SHAPE", argument=name)
    g = p.pad_to_multiple(int(divisibility_factor))
    ids = relayout(input_ids, p, g, pad_value=padding_token_id)
    lab = relayout(labels, p, g, pad_value=padding_label_id)
    cu_padded = torch.as_tensor(g.cu_seqlens_padded(dtype="int64")).to(cu_seqlens.device)  # int64 (torch.cumsum's)
    return ids, lab, cu_padded


def generate_positional_ids_for_cp(cu_seqlens: torch.Tensor, divisibility_factor: int,
                                   dtype: torch.dtype = torch.long) -> torch.Tensor:
    """TransformerEngine's ``generate_positional_ids_for_cp``: positions 0, 1, ... over each sequence's padded
    slot (``divisibility_factor``), continuing through the padding as TransformerEngine does (maskpack's
    ``position_ids()`` of the padded layout writes 0 there). On the CPU, as upstream."""
    fn = "generate_positional_ids_for_cp"
    p = _packed(fn, cu_seqlens)
    g = p.pad_to_multiple(int(divisibility_factor))
    cu = torch.as_tensor(g.cu_seqlens_padded(dtype="int64"))
    total = int(cu[-1])
    # positions as a running sum: +1 per token, minus the previous slot's length at each slot start
    step = torch.ones(total, dtype=torch.int64)
    inner = cu[1:-1] < total
    step.index_add_(0, cu[1:-1][inner], -cu.diff()[:-1][inner])
    if total:
        step[0] = 0
    return step.cumsum_(0).to(dtype)


def get_batch_on_this_cp_rank(cu_seqlens_padded: torch.Tensor, input_ids_padded: torch.Tensor,
                              labels_padded: torch.Tensor, position_ids_padded: torch.Tensor,
                              cp_group: Any = None, qvk_format: str = "thd", *, cp: Optional[int] = None,
                              cp_rank: Optional[int] = None):
    """TransformerEngine's ``get_batch_on_this_cp_rank`` (THD): the rank's zigzag shard (chunks r and
    ``2 cp - 1 - r`` of each slot of ``cu_seqlens_padded``) of the three tensors, along dim 0 of a 1D tensor,
    else dim 1 (or dim 0) whichever equals the padded total. ``cp`` / ``cp_rank`` default to ``cp_group``'s
    size and rank."""
    fn = "get_batch_on_this_cp_rank"
    if qvk_format != "thd":  # TransformerEngine itself refuses every other format here (ValueError alike)
        raise Error(f"{fn}: qvk_format: expected 'thd' (the only format this function shards), found "
                    f"{qvk_format!r}", "MASKPACK_ERR_UNSUPPORTED", argument="qvk_format")
    if cp is None:
        cp = torch.distributed.get_world_size(group=cp_group)
    if cp <= 1:
        return input_ids_padded, labels_padded, position_ids_padded
    if cp_rank is None:
        cp_rank = torch.distributed.get_rank(group=cp_group)
    g = _packed(fn, cu_seqlens_padded, "cu_seqlens_padded")
    _check_split(fn, cu_seqlens_padded, cp, "cu_seqlens_padded")
    total = g.q_width
    taker = Taker(torch.as_tensor(g.cp_shard_indices(cp, cp_rank, align=None)), total)

    def part(name, val):
        if val is None:
            return val
        if val.ndim == 1:
            if val.shape[0] != total:
                raise ValueError("1D tensor shape doesn't match expected sequence length. Make sure the"
                                 " inputs are in THD format and padded correctly.")
            dim = 0
        elif val.ndim >= 2:
            if val.shape[1] == total:
                dim = 1
            elif val.shape[0] == total:
                dim = 0
            else:
                raise ValueError("Make sure the inputs are in THD format and padded correctly.")
        else:
            raise ValueError("Tensor must be at least 1D")
        return taker(val, dim)

    return (part("input_ids_padded", input_ids_padded), part("labels_padded", labels_padded),
            part("position_ids_padded", position_ids_padded))
