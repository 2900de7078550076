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
from typing import Any, Dict, Iterable, Optional

import torch

from .._errors import Error
from .._layout import Layout
from .._moves import cp_gather
from ._common import Taker, packed_seq_params, resolve_parallel

__all__ = ["get_batch_on_this_cp_rank", "get_thd_batch_on_this_cp_rank", "undo_attention_load_balancing",
           "redo_attention_load_balancing", "roll_tensor"]

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


def _resolve_cp(fn: str, cp_group: Any, cp: Optional[int], cp_size: Optional[int], cp_rank: Optional[int]):
    """(cp, cp_rank) from ``cp=`` or its Megatron spelling ``cp_size=`` (both given: they must agree), else
    ``cp_group``, else ``parallel_state``."""
    if cp_size is not None:
        if cp is not None and cp != cp_size:
            raise Error(f"{fn}: cp={cp} and cp_size={cp_size} name the same size and differ", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="cp_size")
        cp = cp_size
    if cp_group is not None and cp is None:
        cp, group_rank = _group_size_rank(cp_group)
        cp_rank = group_rank if cp_rank is None else cp_rank
    _, cp, cp_rank = resolve_parallel(fn, 1, cp, cp_rank, need=("cp", "cp_rank"))
    return cp, cp_rank


def _thd_taker(fn: str, cu: Any, width: int, cp: int, cp_rank: int, mode: str) -> Taker:
    """The rank's tokens of a packed row of ``width``: each slot of the offsets ``cu`` cut in 2 cp zigzag chunks
    (as TransformerEngine cuts them), or one contiguous run of width / cp."""
    if mode == "contiguous":
        if width % cp:
            raise Error(f"{fn}: contiguous CP needs the packed row of {width} tokens to divide by cp = {cp}",
                        "MASKPACK_ERR_SHAPE", argument="packed_seq_params")
        return Taker(torch.arange(cp_rank * (width // cp), (cp_rank + 1) * (width // cp)), width)
    g = _thd_layout(fn, cu, width)
    _check_slots(fn, g, cp)
    return Taker(torch.as_tensor(g.cp_shard_indices(cp, cp_rank, align=None)), width)


def get_batch_on_this_cp_rank(batch: Dict[str, Any], cp_group: Any = None, *, cp: Optional[int] = None,
                              cp_rank: Optional[int] = None, cp_size: Optional[int] = None,
                              dim3_keys: Iterable[str] = ("attention_mask",),
                              cp_partition_mode: Optional[str] = None) -> Dict[str, Any]:
    """Megatron's ``get_batch_on_this_cp_rank``: every tensor of ``batch`` cut to the rank's zigzag shard
    along dim 1 (the keys of ``dim3_keys``, by default ``attention_mask``: dim 2, its query rows), in place;
    returns ``batch``. The rank comes from ``cp_group`` when given, else ``cp=`` (or Megatron's spelling
    ``cp_size=``) / ``cp_rank=``, else ``parallel_state``.

    The newer Megatron forms are accepted: ``dim3_keys=`` (Megatron's multimodal models name the keys whose
    sequence is dim 2), entries that are not tensors (a ``PackedSeqParams``, lists of sizes) pass through
    untouched, and a ``packed_seq_params`` entry of format ``thd`` makes the cut per sequence, as
    TransformerEngine's ``thd_get_partitioned_indices`` cuts a packed row (on its padded offsets when it has
    them), or, with ``cp_partition_mode="contiguous"`` (the keyword, else the entry's own field), one run of
    width / cp per rank; the mode is recorded on the entry. Megatron 0.16.1 itself cuts such a row as if it
    were one sequence, mixing the sequences' chunks."""
    fn = "get_batch_on_this_cp_rank"
    cp, cp_rank = _resolve_cp(fn, cp_group, cp, cp_size, cp_rank)
    if cp <= 1:
        return batch
    dim3 = {dim3_keys} if isinstance(dim3_keys, str) else set(dim3_keys)
    psp = batch.get("packed_seq_params")
    thd = psp is not None and getattr(psp, "qkv_format", None) == "thd"
    if thd:
        mode = cp_partition_mode or getattr(psp, "cp_partition_mode", None) or "zigzag"
        if mode not in ("zigzag", "contiguous"):
            raise Error(f"{fn}: cp_partition_mode must be 'zigzag' or 'contiguous', found {mode!r}",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="cp_partition_mode")
        try:
            psp.cp_partition_mode = mode
        except (AttributeError, TypeError):  # a frozen or slotted object: the cut is still the mode's
            pass
    cols = {}
    for key, val in batch.items():
        if not isinstance(val, torch.Tensor):
            continue
        dim = 2 if key in dim3 else 1
        if val.dim() <= dim:
            raise Error(f"{fn}: {key} has shape {tuple(val.shape)}, no sequence dimension {dim} to cut",
                        "MASKPACK_ERR_SHAPE", argument=key)
        w = val.shape[dim]
        if w not in cols:
            cols[w] = _thd_taker(fn, _slot_offsets(psp), w, cp, cp_rank, mode) if thd else _columns(fn, w, cp, cp_rank, key)
        batch[key] = cols[w](val, dim)
    return batch


def get_thd_batch_on_this_cp_rank(batch: Dict[str, Any], cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor,
                                  max_seqlen: torch.Tensor, cp_size: Optional[int] = None,
                                  cp_rank: Optional[int] = None):
    """Megatron's ``get_thd_batch_on_this_cp_rank``: ``(batch, packed_seq_params)``. Every tensor of ``batch``
    but ``attention_mask``, ``cu_seqlens``, ``cu_seqlens_padded`` and ``max_seqlen`` is cut in place along dim
    1 to the rank's share of the packed row ``batch["tokens"]``: each slot of ``cu_seqlens_padded`` in 2 cp
    zigzag chunks (TransformerEngine's ``thd_get_partitioned_indices``, without TransformerEngine). The
    ``PackedSeqParams`` (thd) carries both offsets and ``max_seqlen[0]``. ``cp_size`` / ``cp_rank`` default to
    ``parallel_state``'s."""
    fn = "get_thd_batch_on_this_cp_rank"
    m = int(max_seqlen[0].item()) if isinstance(max_seqlen, torch.Tensor) else int(max_seqlen[0])
    params = packed_seq_params(qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                               cu_seqlens_q_padded=cu_seqlens_padded, cu_seqlens_kv_padded=cu_seqlens_padded,
                               max_seqlen_q=m, max_seqlen_kv=m)
    _, cp, cp_rank = resolve_parallel(fn, 1, cp_size, cp_rank, need=("cp", "cp_rank"))
    if cp > 1:
        tokens = batch.get("tokens")
        if not isinstance(tokens, torch.Tensor) or tokens.dim() < 2:
            raise Error(f"{fn}: batch['tokens'] must be the packed row [1, T] (its width is the row cut)",
                        "MASKPACK_ERR_SHAPE", argument="batch")
        width = tokens.shape[1]
        taker = _thd_taker(fn, cu_seqlens_padded, width, cp, cp_rank, "zigzag")
        for key, val in batch.items():
            if key in _THD_KEEP:
                continue
            if not isinstance(val, torch.Tensor) or val.dim() < 2 or val.shape[1] != width:
                raise Error(f"{fn}: batch[{key!r}] must have the packed row's {width} tokens in dim 1, found "
                            f"{tuple(val.shape) if isinstance(val, torch.Tensor) else type(val).__name__}",
                            "MASKPACK_ERR_SHAPE", argument=key)
            batch[key] = taker(val, 1)
    return batch, params


_THD_KEEP = frozenset({"attention_mask", "cu_seqlens", "cu_seqlens_padded", "max_seqlen"})


def _slot_offsets(packed_seq_params: Any):
    """The offsets of a PackedSeqParams' slots: its padded ones when it has them."""
    cu = packed_seq_params.cu_seqlens_q_padded
    return packed_seq_params.cu_seqlens_q if cu is None else cu


def _thd_layout(fn: str, cu: Any, total: int) -> Layout:
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


def _balanced_layout(fn: str, input_: torch.Tensor, cp_size: int, packed_seq_params: Any) -> Layout:
    """The packed layout [S] the load balancing cuts: one sequence, or packed_seq_params' sequences,
    every slot dividing by 2 * cp."""
    s = input_.shape[0]
    if packed_seq_params is not None:
        g = _thd_layout(fn, _slot_offsets(packed_seq_params), s)
        _check_slots(fn, g, cp_size)
        return g
    if s % (2 * cp_size):
        raise Error(f"{fn}: input_ has {s} tokens, which does not divide by 2*cp = {2 * cp_size}",
                    "MASKPACK_ERR_SHAPE", argument="input_")
    return Layout.from_lengths([s], "packed")


def undo_attention_load_balancing(input_: torch.Tensor, cp_size: int,
                                  packed_seq_params: Any = None) -> torch.Tensor:
    """Megatron's ``_undo_attention_load_balancing``: ``[S, ...]`` holding every rank's zigzag shard in rank
    order -> the sequence in order (packed: each sequence of ``packed_seq_params``). Differentiable."""
    fn = "undo_attention_load_balancing"
    g = _balanced_layout(fn, input_, cp_size, packed_seq_params)
    if cp_size == 1:
        return input_
    return cp_gather(list(torch.chunk(input_, cp_size, 0)), g, align=None)


def redo_attention_load_balancing(input_: torch.Tensor, cp_size: int,
                                  packed_seq_params: Any = None) -> torch.Tensor:
    """Megatron's ``_redo_attention_load_balancing``: the sequence in order -> every rank's zigzag shard in
    rank order (the inverse of :func:`undo_attention_load_balancing`). Differentiable."""
    fn = "redo_attention_load_balancing"
    g = _balanced_layout(fn, input_, cp_size, packed_seq_params)
    if cp_size == 1:
        return input_
    return torch.cat([g.shard(input_, cp_size, r, align=None) for r in range(cp_size)], 0)


def roll_tensor(tensor: torch.Tensor, shifts: int = -1, dims: int = -1, cp_group: Any = None,
                packed_seq_params: Any = None):
    """Megatron's ``roll_tensor`` (multi-token prediction): ``(rolled, rolled.sum())`` where ``rolled`` is ``tensor``
    rolled left by one along ``dims`` with the vacated last position filled with 0; with ``packed_seq_params`` the
    roll stays inside each sequence of ``cu_seqlens_q`` (each sequence's last position 0). Under CP (``cp_group``
    of more than one rank; the tensor is this rank's zigzag shard) the roll is the one of the whole sequence:
    each chunk's last position takes the first token of the chunk after it, fetched in one all-gather of the
    chunks' first tokens (Megatron sends them point to point). As in Megatron the values fetched from another
    rank carry no gradient (the last rank's own chunk does)."""
    fn = "roll_tensor"
    cp = 1 if cp_group is None else torch.distributed.get_world_size(group=cp_group)
    if packed_seq_params is not None:
        if not (dims == -1 or dims == tensor.dim() - 1):
            raise Error(f"{fn}: packed sequences roll along the last dimension only, found dims={dims}",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="dims")
        if shifts != -1:
            raise Error(f"{fn}: packed sequences roll by shifts=-1 only, found {shifts}",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="shifts")
        cu = packed_seq_params.cu_seqlens_q
        if cu is None:
            raise Error(f"{fn}: packed_seq_params must provide cu_seqlens_q", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="packed_seq_params")
        c = cu.detach().to("cpu", torch.int64)
    elif cp == 1:
        rolled = torch.roll(tensor, shifts=shifts, dims=dims)
        rolled.select(dims, shifts).fill_(0)
        return rolled, rolled.sum()
    else:
        if shifts != -1:
            raise Error(f"{fn}: under CP the roll is by shifts=-1 only, found {shifts}", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="shifts")
        c = None
    dim = dims % tensor.dim()
    n = tensor.shape[dim]
    x = tensor.movedim(dim, -1)
    if c is None:  # one sequence over the whole dimension, this rank's 2 chunks
        c = torch.tensor([0, n * cp])
    if int(c[-1]) > n * cp:
        raise Error(f"{fn}: cu_seqlens_q ends at {int(c[-1])}, past the {n * cp} positions of the CP ranks",
                    "MASKPACK_ERR_SHAPE", argument="packed_seq_params")
    if cp == 1:
        # the whole row rolled, then each sequence's last position 0 (its layout's last tokens) and the
        # positions after the last sequence as they were, as in Megatron
        lay = Layout.from_cu_seqlens(c, total=n)
        last = torch.as_tensor(lay.last_token_index())
        last = last[last >= 0]
        rolled = torch.roll(x, -1, -1).index_fill_(-1, last.to(x.device), 0)
        end = int(c[-1])
        if end < n:
            rolled[..., end:] = x[..., end:]
        rolled = rolled.movedim(-1, dim)
        return rolled, rolled.sum()
    bad = torch.nonzero(c.diff() % (2 * cp)).flatten()
    if bad.numel():
        i = int(bad[0])
        raise Error(f"{fn}: sequence {i} of cu_seqlens_q does not split into 2*cp = {2 * cp} chunks",
                    "MASKPACK_ERR_SHAPE", argument="packed_seq_params", index=(i,))
    rank = torch.distributed.get_rank(group=cp_group)
    local = c // cp  # each sequence's local slot: [chunk r | chunk 2 cp - 1 - r], halves of equal length
    half = (local[1:] - local[:-1]) // 2
    live = torch.nonzero(half > 0).flatten()
    starts0 = local[:-1][live]
    starts1 = starts0 + half[live]
    # within each chunk: the next position; a chunk's last position takes the neighbour chunk's first token
    idx = torch.arange(n)
    seq_of = torch.full((n,), -1, dtype=torch.int64)
    for j, (a, h) in enumerate(zip(starts0.tolist(), half[live].tolist())):
        seq_of[a:a + 2 * h] = j
    nxt = idx + 1
    ends0 = starts0 + half[live] - 1
    ends1 = starts1 + half[live] - 1
    firsts = torch.stack([x.index_select(-1, starts0.to(x.device)), x.index_select(-1, starts1.to(x.device))], 0)
    gathered = [torch.empty_like(firsts) for _ in range(cp)]
    torch.distributed.all_gather(gathered, firsts.detach().contiguous(), group=cp_group)
    fill0 = gathered[rank + 1][0] if rank < cp - 1 else firsts[1]  # after chunk r (the last rank: its own chunk)
    fill1 = gathered[rank - 1][1] if rank > 0 else torch.zeros_like(gathered[rank][1])  # after chunk 2cp-1-r
    inside = seq_of >= 0
    src = torch.where(inside, nxt, idx).clamp(max=n - 1)
    rolled = x.index_select(-1, src.to(x.device))
    if not bool(inside.all()):  # positions outside every sequence stay as they were, as in Megatron
        rolled = torch.where(inside.to(x.device), rolled, x)
    rolled = rolled.index_copy(-1, ends0.to(x.device), fill0).index_copy(-1, ends1.to(x.device), fill1)
    rolled = rolled.movedim(-1, dim)
    return rolled, rolled.sum()
