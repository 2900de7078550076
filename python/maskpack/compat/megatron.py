"""Drop-in twins of Megatron-core's batch functions, pinned to **megatron-core 0.16.1**
(``megatron/core/utils.py``, ``megatron/core/ssm/mamba_context_parallel.py``,
``megatron/core/transformer/multi_token_prediction.py``). They import nothing from Megatron: where it reads
``parallel_state`` the twin takes keyword-only ``cp=`` / ``cp_rank=`` (or the ``cp_group=`` it already
accepts) and falls back to ``parallel_state`` when it is initialized. The zigzag split is maskpack's
(``Layout.cp_shard_indices`` / ``Layout.shard`` / ``maskpack.cp_gather``).

Where Megatron silently gets a batch wrong the twin raises ``maskpack.Error`` naming the argument: a sequence
length that does not divide by ``2 cp`` (Megatron's ``view`` fails with a bare RuntimeError; its
``torch.chunk`` in the load-balancing helpers cuts uneven chunks).
"""

from __future__ import annotations

import functools
from typing import Any, Dict, Optional

import torch

from .._errors import Error
from .._layout import Layout
from .._moves import cp_gather
from ._common import Taker, resolve_parallel

__all__ = ["get_batch_on_this_cp_rank", "undo_attention_load_balancing", "redo_attention_load_balancing",
           "roll_tensor"]

UPSTREAM = "megatron-core==0.16.1"


def _group_size_rank(group):
    return torch.distributed.get_world_size(group=group), torch.distributed.get_rank(group=group)


@functools.lru_cache(maxsize=256)
def _row_taker(width: int, cp: int, rank: int) -> Taker:
    """The zigzag columns of rank ``rank`` in a row of ``width`` (maskpack's shard of one full row), kept per
    (width, cp, rank) as layouts keep their plans."""
    return Taker(torch.as_tensor(Layout.from_lengths([width]).cp_shard_indices(cp, rank, align=None)), width)


def _columns(fn: str, width: int, cp: int, rank: int, name: str) -> Taker:
    if width % (2 * cp):
        raise Error(f"{fn}: {name} has sequence length {width}, which does not divide by 2*cp = {2 * cp}; pad it "
                    "explicitly first (Layout.pad_to_multiple)", "MASKPACK_ERR_SHAPE", argument=name)
    return _row_taker(width, cp, rank)


def get_batch_on_this_cp_rank(batch: Dict[str, Any], cp_group: Any = None, *, cp: Optional[int] = None,
                              cp_rank: Optional[int] = None) -> Dict[str, Any]:
    """Megatron's ``get_batch_on_this_cp_rank``: every tensor of ``batch`` cut to the rank's zigzag shard
    along dim 1 (``attention_mask``: dim 2, its query rows), in place; returns ``batch``. The rank comes
    from ``cp_group`` when given, else ``cp=`` / ``cp_rank=``, else ``parallel_state``."""
    fn = "get_batch_on_this_cp_rank"
    if cp_group is not None and cp is None:
        cp, cp_rank = _group_size_rank(cp_group)
    _, cp, cp_rank = resolve_parallel(fn, 1, cp, cp_rank, need=("cp", "cp_rank"))
    if cp > 1:
        cols = {}
        for key, val in batch.items():
            if val is not None:
                dim = 1 if key != "attention_mask" else 2
                w = val.shape[dim]
                if w not in cols:
                    cols[w] = _columns(fn, w, cp, cp_rank, key)
                batch[key] = cols[w](val, dim)
    return batch


def _thd_layout(fn: str, packed_seq_params: Any, total: int) -> Layout:
    cu = packed_seq_params.cu_seqlens_q_padded
    if cu is None:
        cu = packed_seq_params.cu_seqlens_q
    c = cu.detach().to("cpu", torch.int64)
    if int(c[-1]) != total:
        raise Error(f"{fn}: cu_seqlens end at {int(c[-1])}, the input holds {total} tokens", "MASKPACK_ERR_SHAPE",
                    argument="packed_seq_params")
    return Layout.from_cu_seqlens(c)


def _check_slots(fn, g: Layout, cp: int):
    for i, n in enumerate(g.seqlens.tolist() if hasattr(g.seqlens, "tolist") else list(g.seqlens)):
        if n % (2 * cp):
            raise Error(f"{fn}: sequence {i} has {n} tokens, which does not divide by 2*cp = {2 * cp}",
                        "MASKPACK_ERR_SHAPE", argument="packed_seq_params", index=(i,))


def undo_attention_load_balancing(input_: torch.Tensor, cp_size: int,
                                  packed_seq_params: Any = None) -> torch.Tensor:
    """Megatron's ``_undo_attention_load_balancing``: ``[S, ...]`` holding every rank's zigzag shard in rank
    order -> the sequence in order (packed: each sequence of ``packed_seq_params``). Differentiable."""
    fn = "undo_attention_load_balancing"
    s = input_.shape[0]
    if packed_seq_params is None:
        if s % (2 * cp_size):
            raise Error(f"{fn}: input_ has {s} tokens, which does not divide by 2*cp = {2 * cp_size}",
                        "MASKPACK_ERR_SHAPE", argument="input_")
        g = Layout.from_lengths([s], "packed")
    else:
        g = _thd_layout(fn, packed_seq_params, s)
        _check_slots(fn, g, cp_size)
    if cp_size == 1:
        return input_
    return cp_gather(list(torch.chunk(input_, cp_size, 0)), g, align=None)


def redo_attention_load_balancing(input_: torch.Tensor, cp_size: int,
                                  packed_seq_params: Any = None) -> torch.Tensor:
    """Megatron's ``_redo_attention_load_balancing``: the sequence in order -> every rank's zigzag shard in
    rank order (the inverse of :func:`undo_attention_load_balancing`). Differentiable."""
    fn = "redo_attention_load_balancing"
    s = input_.shape[0]
    if packed_seq_params is None:
        if s % (2 * cp_size):
            raise Error(f"{fn}: input_ has {s} tokens, which does not divide by 2*cp = {2 * cp_size}",
                        "MASKPACK_ERR_SHAPE", argument="input_")
        g = Layout.from_lengths([s], "packed")
    else:
        g = _thd_layout(fn, packed_seq_params, s)
        _check_slots(fn, g, cp_size)
    if cp_size == 1:
        return input_
    return torch.cat([g.shard(input_, cp_size, r, align=None) for r in range(cp_size)], 0)


def roll_tensor(tensor: torch.Tensor, shifts: int = -1, dims: int = -1, cp_group: Any = None,
                packed_seq_params: Any = None):
    """Megatron's ``roll_tensor`` (multi-token prediction) without context parallelism: ``(rolled, rolled.sum())``
    where ``rolled`` is ``tensor`` rolled left by one along ``dims`` with the vacated last position filled with
    0; with ``packed_seq_params`` the roll stays inside each sequence of ``cu_seqlens_q`` (each sequence's last
    position 0). A CP group of more than one rank is not supported by this twin yet (maskpack.Error)."""
    fn = "roll_tensor"
    if cp_group is not None and torch.distributed.get_world_size(group=cp_group) > 1:
        raise Error(f"{fn}: the twin does not roll across CP ranks yet; pass cp_group=None or a group of one",
                    "MASKPACK_ERR_UNSUPPORTED", argument="cp_group")
    if packed_seq_params is None:
        rolled = torch.roll(tensor, shifts=shifts, dims=dims)
        rolled.select(dims, shifts).fill_(0)
        return rolled, rolled.sum()
    if not (dims == -1 or dims == tensor.dim() - 1):
        raise Error(f"{fn}: packed sequences roll along the last dimension only, found dims={dims}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="dims")
    if shifts != -1:
        raise Error(f"{fn}: packed sequences roll by shifts=-1 only, found {shifts}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="shifts")
    cu = packed_seq_params.cu_seqlens_q
    if cu is None:
        raise Error(f"{fn}: packed_seq_params must provide cu_seqlens_q", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="packed_seq_params")
    c = cu.detach().to("cpu", torch.int64)
    n = tensor.shape[-1]
    if int(c[-1]) > n:
        raise Error(f"{fn}: cu_seqlens_q ends at {int(c[-1])}, past the tensor's {n} positions",
                    "MASKPACK_ERR_SHAPE", argument="packed_seq_params")
    lay = Layout.from_cu_seqlens(c, total=n)
    # each position takes the next one of its sequence; a sequence's last position and positions outside
    # any sequence: the next index is "none" (0 is written, as Megatron's roll does)
    nxt = torch.as_tensor(lay._shift_index()).to(torch.int64)
    src = torch.where(nxt >= 0, nxt, 0)
    keep = (nxt >= 0)
    outside = ~torch.as_tensor(lay.mask2d()).reshape(-1).bool()
    rolled = tensor.index_select(-1, src.to(tensor.device))
    rolled = torch.where(keep.to(tensor.device), rolled, torch.zeros((), dtype=tensor.dtype, device=tensor.device))
    if bool(outside.any()):  # Megatron leaves positions outside every sequence as they were
        rolled = torch.where(outside.to(tensor.device), tensor, rolled)
    return rolled, rolled.sum()
