"""Drop-in twins of verl's batch functions, pinned to **verl 0.9.1** (``verl/models/mcore/util.py``,
``verl/utils/ulysses.py``, ``verl/utils/seqlen_balancing.py``).

Each twin has the upstream name, positional signature and return types, and is computed from
maskpack's own layout engine (a :class:`maskpack.Layout` per batch, its CP shard, and maskpack's moves);
it imports nothing from verl. Where verl reads Megatron's ``parallel_state`` the twin takes keyword-only
``tp=``, ``cp=``, ``cp_rank=`` (and ``group=`` where it communicates) and falls back to
``parallel_state`` when it is initialized; where verl reads ``is_npu_available`` the twin takes
``npu=`` (default: whether ``torch.npu`` is available).

Conventions kept on purpose, because verl's consumers rely on them (see docs/interop.md):

* ``cu_seqlens_q`` / ``cu_seqlens_kv`` hold the **padded** offsets under CP, as verl does (TransformerEngine
  issue 1930, open); maskpack's native ``Batch.megatron_packed_seq_params()`` keeps the real offsets there.
* ``postprocess_*`` all-gather the other ranks' outputs **detached** (``grad="own"``, the default): each
  rank's output gets only the gradient of its own tokens. ``grad="sum"`` sums every rank's gradient
  (maskpack's ``cp_all_gather``): the same loss on every rank then gives cp times verl's gradient.

Refused with ``maskpack.Error`` where verl crashes or builds a silently wrong batch: an
``attention_mask`` that is not a bool mask (verl would index with its 0/1 values), a row with holes,
CP slots that do not divide by ``2 cp`` (zigzag) or a total that does not divide by cp (contiguous),
``forced_max_seqlen`` below the longest sequence, a call without ``tp``/``cp``/``cp_rank`` and without an
initialized ``parallel_state``.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple

import torch

from .._errors import Error
from .._layout import Layout, mask2d_from_mask4d
from .._moves import relayout
from . import _common
from ._common import check_bool_mask2d, resolve_group, resolve_parallel, rows_layout, take

__all__ = ["preprocess_packed_seqs", "postprocess_packed_seqs", "preprocess_thd_engine", "postprocess_thd_engine",
           "preprocess_bshd_engine", "postprocess_bshd_engine", "build_vlm_attn_mask_thd", "build_vlm_attn_mask_bshd",
           "ulysses_pad_and_slice_inputs", "gather_outputs_and_unpad", "get_seqlen_balanced_partitions",
           "rearrange_micro_batches",
           "preprocess_bshd", "postprocess_bshd", "postprocess_packed_seqs_for_dict_output"]

UPSTREAM = "verl==0.9.1"


# ---- helpers ---------------------------------------------------------------------------------------

def _fp8_align(align: int) -> Tuple[int, int]:
    return math.lcm(16, align), align * 128


def _slots(lens: torch.Tensor, align: int) -> torch.Tensor:
    """int64 slot lengths: each length padded up to a multiple of ``align`` (verl's per-sequence padding)."""
    return lens + (-lens) % align


def _cum(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(x.numel() + 1, dtype=torch.int64)
    torch.cumsum(x, 0, out=out[1:])
    return out


def _global_layout(fn: str, cu: torch.Tensor, cu_padded: torch.Tensor) -> Layout:
    """The packed layout verl lays its THD buffer out in: sequence i's tokens at cu_padded[i], its slot
    up to cu_padded[i + 1]."""
    try:
        return Layout.from_cu_seqlens(cu, cu_padded=cu_padded)
    except Error as e:
        raise Error(f"{fn}: cu_seqlens_padded does not cover the sequences: {e.message}", e.status,
                    argument="cu_seqlens_padded", index=e.index) from None


def _shard(fn: str, g: Layout, cp: int, rank: int, scheme: str = "zigzag") -> Layout:
    if cp == 1:
        return g
    try:
        return g.cp_shard(cp, rank, scheme=scheme, align=None)
    except Error as e:
        raise Error(f"{fn}: the padded batch does not split over cp = {cp} ({scheme}): {e.message}", e.status,
                    argument="cp", index=e.index) from None


def _npu_default(npu: Optional[bool]) -> bool:
    if npu is not None:
        return bool(npu)
    mod = getattr(torch, "npu", None)
    try:
        return bool(mod is not None and mod.is_available())
    except Exception:
        return False


def _check_grad(fn: str, grad: str) -> None:
    if grad not in ("own", "sum"):
        raise Error(f"{fn}: grad must be 'own' (verl: each rank keeps its own tokens' gradient) or 'sum' "
                    f"(every rank's gradient summed), found {grad!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="grad")


def _gather_parts(output: torch.Tensor, cp: int, rank: int, group: Any) -> List[torch.Tensor]:
    """verl's all-gather: the other ranks' outputs detached, this rank's own output in its place."""
    parts = [torch.empty_like(output) for _ in range(cp)]
    torch.distributed.all_gather(parts, output.detach(), group=group)
    parts[rank] = output
    return parts


def _nested_offsets(fn: str, x: Any, name: str = "input_ids") -> torch.Tensor:
    if not (isinstance(x, torch.Tensor) and x.is_nested):
        raise Error(f"{fn}: {name} must be a jagged nested tensor (torch.nested, layout=torch.jagged)",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument=name)
    try:
        off = x.offsets()
    except Exception:
        raise Error(f"{fn}: {name} must be a jagged nested tensor (layout=torch.jagged), not a strided one",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument=name) from None
    return off


def _from_jagged(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return torch.nested.nested_tensor_from_jagged(values, offsets.to(values.device))


# ---- verl/models/mcore/util.py: the padded-batch pair -------------------------------------------------

def preprocess_packed_seqs(input_ids: torch.Tensor, attention_mask: torch.Tensor, pre_process: bool = True,
                           use_fp8_padding: bool = False, *, tp: Optional[int] = None, cp: Optional[int] = None,
                           cp_rank: Optional[int] = None):
    """verl's ``preprocess_packed_seqs``: a right- or left-padded ``[B, S, ...]`` batch with its bool keep
    mask -> ``(input_ids_rmpad [1, T/cp, ...], PackedSeqParams)``, the rank's zigzag shard of the packed
    batch (each sequence padded to ``tp*cp*2`` under CP, else ``tp``; FP8: ``lcm(16, align)`` and the last
    slot padded so the total divides by ``align*128``). ``cu_seqlens_q/kv`` are the padded offsets, as in
    verl; ``max_seqlen_*`` the longest slot (a Python int)."""
    fn = "preprocess_packed_seqs"
    tp, cp, cp_rank = resolve_parallel(fn, tp, cp, cp_rank)
    check_bool_mask2d(fn, attention_mask)
    mask = attention_mask if attention_mask.device.type == "cpu" else attention_mask.cpu()
    if input_ids.shape[:2] != mask.shape:
        raise Error(f"{fn}: input_ids {tuple(input_ids.shape)} and attention_mask {tuple(mask.shape)} disagree on "
                    "[batch, seq]", "MASKPACK_ERR_SHAPE", argument="attention_mask")
    src = rows_layout(mask)
    lens = mask.sum(dim=-1, dtype=torch.int64)
    align = tp * cp * 2 if cp > 1 else tp
    total_align = None
    if use_fp8_padding:
        align, total_align = _fp8_align(align)
    slots = _slots(lens, align)
    cu_padded = _cum(slots)
    if total_align is not None and slots.numel():
        extra = int(-cu_padded[-1]) % total_align
        cu_padded[-1] += extra
        slots[-1] += extra
    max_seqlen = int(slots.max()) if slots.numel() else 0
    dev = input_ids.device
    cu_padded_t = cu_padded.to(device=dev, dtype=torch.int32)
    params = _common.packed_seq_params(qkv_format="thd", cu_seqlens_q=cu_padded_t, max_seqlen_q=max_seqlen,
                                       cu_seqlens_kv=cu_padded_t, max_seqlen_kv=max_seqlen,
                                       cu_seqlens_q_padded=cu_padded_t, cu_seqlens_kv_padded=cu_padded_t)
    if not pre_process:
        return input_ids, params
    g = _global_layout(fn, _cum(lens), cu_padded)
    if int(cu_padded[-1]) % cp:
        raise Error(f"{fn}: the padded total {int(cu_padded[-1])} does not divide by cp = {cp}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="cp")
    if int(cu_padded[-1]) == 0:
        return input_ids.new_zeros((1, 0) + tuple(input_ids.shape[2:])), params
    out = relayout(input_ids, src, _shard(fn, g, cp, cp_rank), pad_value=0)
    return out.unsqueeze(0), params


def postprocess_packed_seqs(output: torch.Tensor, packed_seq_params: Any, attention_mask: torch.Tensor,
                            batch_size: int, seq_len: int, post_process: bool = True, *, grad: str = "own",
                            cp: Optional[int] = None, cp_rank: Optional[int] = None, group: Any = None):
    """verl's ``postprocess_packed_seqs``: the rank's ``[1, T/cp, ...]`` model output -> ``[B, S, ...]``
    padded like ``attention_mask``, every rank's part gathered. ``grad="own"`` (verl): the other ranks'
    parts are gathered detached, so this rank's output gets only its own tokens' gradient; ``grad="sum"``:
    maskpack's ``cp_all_gather``, whose backward sums every rank's gradient (the same loss on every rank
    then gives cp times verl's gradient)."""
    fn = "postprocess_packed_seqs"
    _check_grad(fn, grad)
    if not post_process:
        return output
    _, cp, cp_rank = resolve_parallel(fn, 1, cp, cp_rank)
    check_bool_mask2d(fn, attention_mask)
    mask = attention_mask if attention_mask.device.type == "cpu" else attention_mask.cpu()
    if tuple(mask.shape) != (int(batch_size), int(seq_len)):
        raise Error(f"{fn}: attention_mask {tuple(mask.shape)} is not [batch_size, seq_len] = "
                    f"[{batch_size}, {seq_len}]", "MASKPACK_ERR_SHAPE", argument="attention_mask")
    if output.dim() < 2 or output.shape[0] != 1:
        raise Error(f"{fn}: output must be [1, packed tokens, ...], found {tuple(output.shape)}",
                    "MASKPACK_ERR_SHAPE", argument="output")
    cu_padded = packed_seq_params.cu_seqlens_q_padded.to("cpu", torch.int64)
    lens = mask.sum(dim=1, dtype=torch.int64)
    if cu_padded.numel() != lens.numel() + 1:
        raise Error(f"{fn}: cu_seqlens_q_padded has {cu_padded.numel()} entries for {lens.numel()} sequences",
                    "MASKPACK_ERR_SHAPE", argument="packed_seq_params")
    dst = rows_layout(mask)
    g = _global_layout(fn, _cum(lens), cu_padded)
    if output.shape[1] * cp != g.q_width:
        raise Error(f"{fn}: output holds {output.shape[1]} tokens per rank; cu_seqlens_q_padded describes "
                    f"{g.q_width} over cp = {cp}", "MASKPACK_ERR_SHAPE", argument="output")
    if cp == 1:
        return relayout(output[0], g, dst)
    shards = [_shard(fn, g, cp, r) for r in range(cp)]  # checks every slot splits before any communication
    group = resolve_group(group)
    if grad == "sum":
        from ..distributed import cp_all_gather

        return relayout(cp_all_gather(output[0], g, group, align=None), g, dst)
    parts = _gather_parts(output, cp, cp_rank, group)
    return relayout([p[0] for p in parts], shards, dst)


# ---- the model engine's nested-tensor pair (THD) -------------------------------------------------------

def _chunk_info(g: Layout, cu_padded: torch.Tensor, lens: torch.Tensor, slots: torch.Tensor, cp: int,
                rank: int, scheme: str):
    """Per local token: its sequence, its position in the slot, and its local index in the slot."""
    if cp == 1:
        gidx = torch.arange(g.q_width, dtype=torch.int64)
    else:
        gidx = torch.as_tensor(g.cp_shard_indices(cp, rank, scheme=scheme, align=None), dtype=torch.int64)
    seq = torch.searchsorted(cu_padded, gidx, right=True) - 1
    p = gidx - cu_padded[seq]
    return gidx, seq, p


def preprocess_thd_engine(input_ids: torch.Tensor, pre_process: bool = True, need_roll: bool = False,
                          use_fp8_padding: bool = False, local_cp_size: Optional[int] = None,
                          min_local_rows: Optional[int] = None, pad_to_length_bucket: Optional[int] = None,
                          cp_layout: str = "zigzag", *, tp: Optional[int] = None, cp: Optional[int] = None,
                          cp_rank: Optional[int] = None, group: Any = None):
    """verl's ``preprocess_thd_engine``: a jagged nested ``[B, j, ...]`` batch -> ``(input_ids_rmpad [1, T/cp,
    ...], PackedSeqParams, position_ids [1, T/cp])`` (``(input_ids, params, None)`` without pre_process).
    ``cp_layout`` "zigzag" (each slot in 2 cp chunks) or "contiguous" (cp pieces of the whole padded
    stream); ``need_roll`` rolls the tokens by one as verl does (zigzag: within each slot; cp = 1: the
    whole buffer; contiguous: within each sequence). ``local_cp_size`` (verl's dynamic CP) takes
    ``cp_rank=`` and ``group=`` for that group. The params carry ``cp_partition_mode`` (set on the
    instance where the installed megatron-core's class lacks the field)."""
    fn = "preprocess_thd_engine"
    if cp_layout not in ("zigzag", "contiguous"):
        raise ValueError(f"Unsupported context parallel layout: {cp_layout}")
    extra = {}
    if local_cp_size is not None:
        if cp_rank is None or group is None:
            raise Error(f"{fn}: with local_cp_size pass cp_rank= and group= (the dynamic CP group)",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="cp_rank" if cp_rank is None else "group")
        tp, cp, cp_rank = resolve_parallel(fn, tp, int(local_cp_size), cp_rank)
        extra["local_cp_size"] = local_cp_size
        extra["cp_group"] = group
    else:
        tp, cp, cp_rank = resolve_parallel(fn, tp, cp, cp_rank)
    extra["cp_partition_mode"] = cp_layout
    offsets = _nested_offsets(fn, input_ids).to("cpu", torch.int64)
    lens = offsets.diff()
    align = tp * cp * (2 if cp_layout == "zigzag" and cp > 1 else 1)
    total_align = None
    if use_fp8_padding:
        align, total_align = _fp8_align(align)
    slots = _slots(lens, align)
    cu_padded = _cum(slots)
    extra_last = 0
    if total_align is not None:
        extra_last += int(-cu_padded[-1]) % total_align
        cu_padded[-1] += extra_last
    if min_local_rows is not None and int(cu_padded[-1]) < cp * min_local_rows:
        d = cp * min_local_rows - int(cu_padded[-1])
        cu_padded[-1] += d
        extra_last += d
    if pad_to_length_bucket is not None:
        if pad_to_length_bucket <= 0:
            raise ValueError("pad_to_length_bucket must be a positive integer")
        t = math.lcm(pad_to_length_bucket, cp)
        if total_align is not None:
            t = math.lcm(t, total_align)
        d = int(-cu_padded[-1]) % t
        cu_padded[-1] += d
        extra_last += d
    slots[-1] += extra_last
    max_seqlen = int(slots.max())
    dev = input_ids.device
    cu_padded_t = cu_padded.to(device=dev, dtype=torch.int32)
    params = _common.packed_seq_params(qkv_format="thd", cu_seqlens_q=cu_padded_t, max_seqlen_q=max_seqlen,
                                       cu_seqlens_kv=cu_padded_t, max_seqlen_kv=max_seqlen,
                                       cu_seqlens_q_padded=cu_padded_t, cu_seqlens_kv_padded=cu_padded_t, **extra)
    if not pre_process:
        return input_ids, params, None
    total = int(cu_padded[-1])
    if total % cp:
        raise Error(f"{fn}: the padded total {total} does not divide by cp = {cp}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="cp")
    if cp_layout == "zigzag" and cp > 1:
        bad = torch.nonzero(slots % (2 * cp)).flatten()
        if bad.numel():
            i = int(bad[0])
            raise Error(f"{fn}: sequence {i}'s slot of {int(slots[i])} tokens does not split into 2*cp = {2 * cp} "
                        "chunks (min_local_rows or pad_to_length_bucket padded the last slot to that)",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="min_local_rows", index=(i,))
    values = input_ids.values()
    src = Layout.from_cu_seqlens(offsets)
    g = _global_layout(fn, offsets, cu_padded)
    scheme = "contiguous" if cp_layout == "contiguous" else "zigzag"
    _, seq, p = _chunk_info(g, cu_padded, lens, slots, cp, cp_rank, scheme)
    n = seq.numel()
    ln = lens[seq]
    valid = p < ln
    if need_roll and cp_layout == "contiguous":
        q = torch.where(valid, (p + 1) % ln.clamp(min=1), 0)
        tok = values[(offsets[seq] + q).to(values.device)]
        tok = tok * valid.to(tok.device).view((-1,) + (1,) * (tok.dim() - 1)).to(tok.dtype)
        pos = torch.where(valid, q, 0)
    elif need_roll and cp > 1:
        sl = slots[seq]
        q = (p + 1) % sl
        ok = q < ln
        tok = values[(offsets[seq] + torch.where(ok, q, 0)).to(values.device)]
        tok = tok * ok.to(tok.device).view((-1,) + (1,) * (tok.dim() - 1)).to(tok.dtype)
        half = sl // (2 * cp)
        j = torch.arange(n, dtype=torch.int64) - cu_padded[seq] // cp
        base = torch.where((j < half) | valid, p, 0)
        pos = torch.roll(base, -1)
        first_end = j == half - 1
        pos[first_end] = base[first_end]
        second_end = j == 2 * half - 1
        pos[second_end] = 0 if cp_rank == 0 else base[second_end]
    else:
        tok = relayout(values, src, _shard(fn, g, cp, cp_rank, scheme), pad_value=0)
        if cp > 1 and cp_layout == "zigzag":
            half = slots[seq] // (2 * cp)
            j = torch.arange(n, dtype=torch.int64) - cu_padded[seq] // cp
            pos = torch.where((j < half) | valid, p, 0)
        else:
            pos = torch.where(valid, p, 0)
        if need_roll:  # cp = 1, zigzag: verl rolls the whole buffer
            tok = torch.roll(tok, -1, 0)
            pos = torch.roll(pos, -1, 0)
    return tok.unsqueeze(0), params, pos.to(dev).unsqueeze(0)


def postprocess_thd_engine(output: torch.Tensor, packed_seq_params: Any, input_ids: torch.Tensor, batch_size: int,
                           post_process: bool = True, local_cp_size: Optional[int] = None,
                           cp_layout: str = "zigzag", *, grad: str = "own", cp: Optional[int] = None,
                           cp_rank: Optional[int] = None, group: Any = None):
    """verl's ``postprocess_thd_engine``: the rank's ``[1, T/cp, ...]`` output -> a jagged nested tensor of the
    real tokens of every sequence (``input_ids``' offsets), every rank's part gathered (``grad`` as in
    :func:`postprocess_packed_seqs`)."""
    fn = "postprocess_thd_engine"
    if cp_layout not in ("zigzag", "contiguous"):
        raise ValueError(f"Unsupported context parallel layout: {cp_layout}")
    _check_grad(fn, grad)
    if not post_process:
        return output
    if local_cp_size is not None:
        cp = int(local_cp_size)
        group = group if group is not None else getattr(packed_seq_params, "cp_group", None)
        if cp_rank is None:
            cp_rank = torch.distributed.get_rank(group=group)
    _, cp, cp_rank = resolve_parallel(fn, 1, cp, cp_rank)
    offsets = _nested_offsets(fn, input_ids).to("cpu", torch.int64)
    if offsets.numel() - 1 != int(batch_size):
        raise Error(f"{fn}: input_ids holds {offsets.numel() - 1} sequences, batch_size is {batch_size}",
                    "MASKPACK_ERR_SHAPE", argument="batch_size")
    cu_padded = packed_seq_params.cu_seqlens_q_padded.to("cpu", torch.int64)
    g = _global_layout(fn, offsets, cu_padded)
    if output.dim() < 2 or output.shape[0] != 1 or output.shape[1] * cp != g.q_width:
        raise Error(f"{fn}: output must be [1, {g.q_width // max(cp, 1)}, ...] (cu_seqlens_q_padded over cp = {cp}), "
                    f"found {tuple(output.shape)}", "MASKPACK_ERR_SHAPE", argument="output")
    dst = Layout.from_cu_seqlens(offsets)
    scheme = "contiguous" if cp_layout == "contiguous" else "zigzag"
    if cp == 1:
        values = relayout(output[0], g, dst)
    else:
        group = resolve_group(group)
        if grad == "sum":
            from ..distributed import cp_all_gather

            values = relayout(cp_all_gather(output[0], g, group, scheme=scheme, align=None), g, dst)
        else:
            parts = _gather_parts(output, cp, cp_rank, group)
            values = relayout([p[0] for p in parts], [_shard(fn, g, cp, r, scheme) for r in range(cp)], dst)
    return _from_jagged(values, offsets)


# ---- the model engine's nested-tensor pair (BSHD) ------------------------------------------------------

def _row_layout(fn: str, offsets: torch.Tensor, width: int) -> Layout:
    lens = offsets.diff()
    if lens.numel() and int(lens.max()) > width:
        i = int(torch.argmax(lens))
        raise Error(f"{fn}: sequence {i} has {int(lens[i])} tokens, more than the padded length {width} "
                    "(forced_max_seqlen is below the longest sequence)", "MASKPACK_ERR_SHAPE",
                    argument="forced_max_seqlen", index=(i,))
    return Layout.from_segments([(b, 0, int(n)) for b, n in enumerate(lens.tolist())], lens.numel(), width)


def _zigzag_columns(width: int, cp: int, rank: int) -> torch.Tensor:
    return torch.as_tensor(Layout.from_lengths([width]).cp_shard_indices(cp, rank, align=None), dtype=torch.int64)


def preprocess_bshd_engine(input_ids: torch.Tensor, pre_process: bool = True, need_roll: bool = False,
                           use_fp8_padding: bool = False, forced_max_seqlen: Optional[int] = None, *,
                           tp: Optional[int] = None, cp: Optional[int] = None, cp_rank: Optional[int] = None,
                           npu: Optional[bool] = None):
    """verl's ``preprocess_bshd_engine``: a jagged nested batch -> ``(input_ids [B, S/cp, ...], attention_mask,
    position_ids)``, right-padded to the longest (or ``forced_max_seqlen``) rounded to ``tp*cp*2`` (cp > 1,
    else tp; FP8: ``B*S`` a multiple of ``128*tp*cp``), each row zigzag-split over cp. ``attention_mask`` is
    the ``[B, S/cp]`` bool keep mask, or on an NPU (``npu=True``) the ``[B, 1, S/cp, S/cp]`` bool masked mask
    verl builds (causal over the rank's local columns, as verl does). ``pre_process`` is ignored, as in
    verl."""
    fn = "preprocess_bshd_engine"
    tp, cp, cp_rank = resolve_parallel(fn, tp, cp, cp_rank)
    on_npu = _npu_default(npu)
    offsets = _nested_offsets(fn, input_ids).to("cpu", torch.int64)
    lens = offsets.diff()
    b = lens.numel()
    max_seqlen = int(forced_max_seqlen) if forced_max_seqlen is not None else int(lens.max())
    align = tp * cp * 2 if cp > 1 else tp
    if align > 1:
        max_seqlen += (-max_seqlen) % align
    if use_fp8_padding:
        t = 128 * tp * cp
        a = math.lcm(t // math.gcd(b, t), align)
        max_seqlen = -(-max_seqlen // a) * a
    rows = _row_layout(fn, offsets, max_seqlen)
    values = input_ids.values()
    src = Layout.from_cu_seqlens(offsets)
    dev = input_ids.device
    if cp == 1:
        x = relayout(values, src, rows, pad_value=0)
        mask = torch.as_tensor(rows.mask2d()).to(dev)
        pos = torch.arange(max_seqlen, dtype=torch.long, device=dev).unsqueeze(0).expand_as(mask)
        if need_roll:
            x = torch.roll(x, shifts=-1, dims=1)
    else:
        shard = rows.cp_shard(cp, cp_rank, align=None)
        cols = _zigzag_columns(max_seqlen, cp, cp_rank)
        if need_roll:
            x = relayout(values, src, rows, pad_value=0)[:, ((cols + 1) % max_seqlen).to(dev)]
        else:
            x = relayout(values, src, shard, pad_value=0)
        mask = torch.as_tensor(shard.mask2d()).to(dev)
        pos = cols.to(dev).unsqueeze(0).expand_as(mask)
    if on_npu:
        mask = Layout.from_mask2d(mask.cpu()).mask4d("masked").to(dev) if b else mask.new_zeros((0, 1) + (mask.shape[1],) * 2)
    return x, mask, pos


def postprocess_bshd_engine(output: torch.Tensor, attention_mask: torch.Tensor, post_process: bool = True, *,
                            grad: str = "own", cp: Optional[int] = None, cp_rank: Optional[int] = None,
                            group: Any = None, npu: Optional[bool] = None):
    """verl's ``postprocess_bshd_engine``: the rank's ``[B, S/cp, ...]`` output and the mask
    :func:`preprocess_bshd_engine` returned -> a jagged nested tensor of each row's real tokens, every
    rank's part gathered (``grad`` as in :func:`postprocess_packed_seqs`). An NPU mask (``[B, 1, S, S]``,
    masked) is read by maskpack's 4D-to-2D rule (a column is a token iff some query sees it), which
    agrees with verl's diagonal on every mask verl builds."""
    fn = "postprocess_bshd_engine"
    _check_grad(fn, grad)
    if not post_process:
        return output
    _, cp, cp_rank = resolve_parallel(fn, 1, cp, cp_rank)
    if _npu_default(npu):
        attention_mask = mask2d_from_mask4d(attention_mask.cpu(), "masked").to(attention_mask.device)
    if tuple(output.shape[:2]) != tuple(attention_mask.shape):
        raise Error(f"{fn}: output {tuple(output.shape)} and attention_mask {tuple(attention_mask.shape)} disagree "
                    "on [batch, seq]", "MASKPACK_ERR_SHAPE", argument="attention_mask")
    mask = attention_mask.bool().cpu()
    width = mask.shape[1] * cp
    if cp == 1:
        full = mask
        lay = rows_layout(full)
        values = lay.pack(output)
    else:
        if mask.shape[1] % 2:
            raise Error(f"{fn}: the local sequence length {mask.shape[1]} is odd; a zigzag shard holds two equal "
                        "chunks", "MASKPACK_ERR_SHAPE", argument="attention_mask")
        group = resolve_group(group)
        masks = [torch.empty_like(attention_mask) for _ in range(cp)]
        torch.distributed.all_gather(masks, attention_mask, group=group)
        full = torch.zeros(mask.shape[0], width, dtype=torch.bool)
        for r in range(cp):
            full[:, _zigzag_columns(width, cp, r)] = masks[r].bool().cpu()
        lay = rows_layout(full)
        shards = [lay.cp_shard(cp, r, align=None) for r in range(cp)]
        if grad == "sum":
            from ..distributed import cp_all_gather

            values = lay.pack(cp_all_gather(output, lay, group, align=None))
        else:
            parts = _gather_parts(output, cp, cp_rank, group)
            values = relayout(parts, shards, lay.packed_of())
    lens = full.sum(dim=1, dtype=torch.int64)
    return _from_jagged(values, _cum(lens))


# ---- VLM masks ---------------------------------------------------------------------------------------

def _padded_ids(fn: str, input_ids: torch.Tensor, width: int, pad_token_id: Any):
    if pad_token_id is None:
        raise Error(f"{fn}: pass pad_token_id (torch's to_padded_tensor needs a fill value)",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="pad_token_id")
    offsets = _nested_offsets(fn, input_ids).to("cpu", torch.int64)
    rows = _row_layout(fn, offsets, width)
    x = relayout(input_ids.values(), Layout.from_cu_seqlens(offsets), rows, pad_value=pad_token_id)
    return x, torch.as_tensor(rows.mask2d()).to(x.device)


def build_vlm_attn_mask_thd(input_ids: torch.Tensor, pad_token_id: int = None, *, tp: Optional[int] = None,
                            cp: Optional[int] = None):
    """verl's ``build_vlm_attn_mask_thd``: a jagged nested batch -> ``(input_ids [B, S], attention_mask [B, S]
    bool)``, right-padded with ``pad_token_id`` to the longest rounded to ``tp*cp*2`` (cp > 1, else tp)."""
    fn = "build_vlm_attn_mask_thd"
    tp, cp, _ = resolve_parallel(fn, tp, cp, 0, need=("tp", "cp"))
    lens = _nested_offsets(fn, input_ids).diff()
    align = tp * cp * 2 if cp > 1 else tp
    width = int(lens.max())
    if align > 1:
        width += (-width) % align
    return _padded_ids(fn, input_ids, width, pad_token_id)


def build_vlm_attn_mask_bshd(input_ids: torch.Tensor, batch_size: int, pad_token_id: int = None,
                             forced_max_seqlen: Optional[int] = None, *, tp: Optional[int] = None,
                             cp: Optional[int] = None, npu: Optional[bool] = None):
    """verl's ``build_vlm_attn_mask_bshd``: as :func:`build_vlm_attn_mask_thd` with ``forced_max_seqlen``; on an NPU
    the mask is None, as in verl."""
    fn = "build_vlm_attn_mask_bshd"
    tp, cp, _ = resolve_parallel(fn, tp, cp, 0, need=("tp", "cp"))
    lens = _nested_offsets(fn, input_ids).diff()
    if lens.numel() != int(batch_size):
        raise Error(f"{fn}: input_ids holds {lens.numel()} sequences, batch_size is {batch_size}",
                    "MASKPACK_ERR_SHAPE", argument="batch_size")
    width = int(forced_max_seqlen) if forced_max_seqlen is not None else int(lens.max())
    align = tp * cp * 2 if cp > 1 else tp
    if align > 1:
        width += (-width) % align
    x, mask = _padded_ids(fn, input_ids, width, pad_token_id)
    return (x, None) if _npu_default(npu) else (x, mask)


# ---- verl/utils/ulysses.py ----------------------------------------------------------------------------

def _sp_rank(fn: str, sp_rank: Optional[int], group: Any) -> int:
    if sp_rank is not None:
        return int(sp_rank)
    if group is not None:
        return torch.distributed.get_rank(group=group)
    raise Error(f"{fn}: pass sp_rank= (or group=, the Ulysses group; verl reads a module global)",
                "MASKPACK_ERR_INVALID_ARGUMENT", argument="sp_rank")


def ulysses_pad_and_slice_inputs(input_ids_rmpad: torch.Tensor, position_ids_rmpad: Optional[torch.Tensor] = None,
                                 sp_size: int = 1, skip_position_ids_rmpad: bool = False, pad_value: Any = 0, *,
                                 sp_rank: Optional[int] = None, group: Any = None):
    """verl's ``ulysses_pad_and_slice_inputs``: the packed row ``[bsz, T]`` padded at its end to a multiple of
    ``sp_size`` (``pad_value``; position ids ``0 .. pad-1``) and cut into ``sp_size`` contiguous pieces: the piece of
    ``sp_rank`` (maskpack's ``cp_shard(scheme="ulysses")``); returns ``(input_ids, position_ids, pad_size)``.
    ``position_ids_rmpad``: ``[1, T]`` or M-RoPE ``[3, 1, T]`` (sliced along its tokens; verl 0.9.1 slices dim 1 of
    the M-RoPE form, its batch dimension, and returns an empty tensor there)."""
    fn = "ulysses_pad_and_slice_inputs"
    if position_ids_rmpad is not None:
        if position_ids_rmpad.size(-2) != 1 or input_ids_rmpad.size(-1) != position_ids_rmpad.size(-1):
            raise Error(f"{fn}: position_ids_rmpad {tuple(position_ids_rmpad.shape)} does not match input_ids_rmpad "
                        f"{tuple(input_ids_rmpad.shape)}", "MASKPACK_ERR_SHAPE", argument="position_ids_rmpad")
    if sp_size <= 1:
        return input_ids_rmpad, position_ids_rmpad, 0
    rank = _sp_rank(fn, sp_rank, group)
    t = input_ids_rmpad.shape[1]
    lay = Layout.from_lengths([t], "packed")
    idx = torch.as_tensor(lay.cp_shard_indices(sp_size, rank, scheme="ulysses"))
    pad_size = (-t) % sp_size
    real = idx[:int(torch.searchsorted(idx, t))]  # idx increases: the real tokens first, then the padding
    n_pad = idx.numel() - real.numel()  # the rank's share of the end padding
    ids = take(input_ids_rmpad, 1, real)
    if n_pad:
        ids = torch.cat([ids, ids.new_full((ids.shape[0], n_pad), pad_value)], 1)
    pos = position_ids_rmpad
    if pos is not None and not skip_position_ids_rmpad:
        p = take(pos, pos.dim() - 1, real)
        if n_pad:
            fill = (idx[real.numel():] - t).to(p.device, p.dtype).expand(*p.shape[:-1], n_pad)
            p = torch.cat([p, fill], -1)
        pos = p
    elif pos is not None and pad_size:  # verl pads the position ids without slicing them
        pad_pos = torch.arange(pad_size, device=pos.device).unsqueeze(0)
        if pos.dim() == 3:
            pad_pos = pad_pos.unsqueeze(0).repeat(pos.size(0), 1, 1)
        pos = torch.cat((pos, pad_pos), dim=-1)
    return ids, pos, pad_size


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


def gather_outputs_and_unpad(x: torch.Tensor, gather_dim: int, unpad_dim: Optional[int] = None, padding_size: int = 0,
                             grad_scaler: bool = True, group: Any = None, *, sp_rank: Optional[int] = None,
                             sp_size: Optional[int] = None):
    """verl's ``gather_outputs_and_unpad``: the Ulysses pieces along ``gather_dim`` gathered in rank order, then
    ``padding_size`` removed from the end of ``unpad_dim``. Without a group (and ``sp_size`` 1 or None) ``x`` is
    returned, as in verl. Backward as verl's: this rank's piece of the gradient, times the group size when
    ``grad_scaler``."""
    fn = "gather_outputs_and_unpad"
    if group is None and not sp_size:
        return x
    n = int(sp_size) if sp_size else torch.distributed.get_world_size(group=group)
    rank = _sp_rank(fn, sp_rank, group)
    gd = gather_dim % x.dim()
    parts = [torch.empty_like(x) for _ in range(n)]
    torch.distributed.all_gather(parts, x.detach().contiguous(), group=group)
    parts[rank] = _ScaleGrad.apply(x, float(n) if grad_scaler else 1.0)
    piece = x.shape[gd]
    lay = Layout.from_lengths([piece * n], "packed")
    shards = [lay.cp_shard(n, r, scheme="contiguous", align=None) for r in range(n)]
    whole = relayout([p.movedim(gd, 0).contiguous() for p in parts], shards, lay).movedim(0, gd)
    if unpad_dim is not None:
        if not isinstance(padding_size, int):
            raise Error(f"{fn}: padding_size must be an int, found {padding_size!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="padding_size")
        if padding_size:
            whole = whole.narrow(unpad_dim, 0, whole.shape[unpad_dim] - padding_size)
    return whole


# ---- verl/utils/seqlen_balancing.py ---------------------------------------------------------------------

def _differencing(values: List[int], k: int, equal_size: bool) -> List[List[int]]:
    """k-way largest differencing: partial partitions (k sets each) are combined two at a time, the two with
    the largest spread first, the heaviest set of one joined with the lightest of the other."""
    import heapq

    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    heap = []
    tick = 0

    def push(sets):
        nonlocal tick
        sets.sort(key=lambda s: (s[0], len(s[1])), reverse=True)  # ties: the fuller set first
        heapq.heappush(heap, (-(sets[0][0] - sets[-1][0]), -sets[0][0], tick, sets))
        tick += 1

    if equal_size:
        for off in range(0, len(order), k):
            push([[values[i], [i]] for i in order[off:off + k]])
    else:
        for i in order:
            push([[values[i], [i]]] + [[0, []] for _ in range(k - 1)])
    while len(heap) > 1:
        a = heapq.heappop(heap)[3]
        b = heapq.heappop(heap)[3]
        push([[a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]] for j in range(k)])
    return [s[1] for s in heap[0][3]]


def _improve(parts: List[List[int]], values: List[int], equal_size: bool, budget: int) -> List[List[int]]:
    """Lower the heaviest partition while a single move (not under equal_size) or a swap with a lighter one
    lowers it; never empties a partition."""
    sums = [sum(values[i] for i in p) for p in parts]
    for _ in range(budget):
        h = max(range(len(parts)), key=lambda j: sums[j])
        done = False
        for l in sorted(range(len(parts)), key=lambda j: sums[j]):
            gap = sums[h] - sums[l]
            if l == h or gap <= 1:
                continue
            best = None  # (|2 d - gap|, a, b): d = values moved from h to l, 0 < d < gap
            if not equal_size and len(parts[h]) > 1:
                for a in parts[h]:
                    d = values[a]
                    if 0 < d < gap and (best is None or abs(2 * d - gap) < best[0]):
                        best = (abs(2 * d - gap), a, None)
            for a in parts[h]:
                for b in parts[l]:
                    d = values[a] - values[b]
                    if 0 < d < gap and (best is None or abs(2 * d - gap) < best[0]):
                        best = (abs(2 * d - gap), a, b)
            if best is not None:
                _, a, b = best
                parts[h].remove(a)
                parts[l].append(a)
                d = values[a]
                if b is not None:
                    parts[l].remove(b)
                    parts[h].append(b)
                    d -= values[b]
                sums[h] -= d
                sums[l] += d
                done = True
                break
        if not done:
            break
    return parts


def _check_partitioning(fn: str, values: List[int], k: int, equal_size: bool) -> None:
    n = len(values)
    if k < 1 or n < k:
        raise Error(f"{fn}: {n} items cannot fill {k} partitions", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="k_partitions")
    if equal_size and n % k:
        raise Error(f"{fn}: {n} items do not split into {k} partitions of equal size", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="equal_size")
    if any(v < 0 for v in values):
        raise Error(f"{fn}: lengths must be >= 0", "MASKPACK_ERR_INVALID_ARGUMENT", argument="seqlen_list",
                    index=(next(i for i, v in enumerate(values) if v < 0),))


def _candidates(values: List[int], k: int, equal_size: bool) -> List[List[List[int]]]:
    """Partitions of ``values`` into k non-empty parts, each polished by single moves and swaps: a
    largest-differencing one, and (unequal sizes) maskpack's planner's."""
    n = len(values)
    budget = 4 * n + 16
    out = [_improve(_differencing(values, k, equal_size), values, equal_size, budget)]
    if not equal_size and sum(values) > 0:
        from .._plan import plan

        p = plan(values, capacity=sum(values), dp=k)
        parts: List[List[int]] = [[] for _ in range(k)]
        for r, row in zip(list(p.rank_of_row), p.rows.tolist()):
            parts[int(r)].extend(int(i) for i in row)
        if all(parts):
            out.append(_improve(parts, values, False, budget))
    for parts in out:  # zero-length items can leave a part empty: it takes the smallest item of the fullest part
        for q in parts:
            if not q:
                donor = max(parts, key=len)
                i = min(donor, key=lambda j: values[j])
                donor.remove(i)
                q.append(i)
    return out


def _balance_key(values: List[int]):
    def key(parts):
        s = [sum(values[i] for i in q) for q in parts]
        return max(s), max(s) - min(s)
    return key


def _sorted_parts(parts: List[List[int]], values: List[int]) -> List[List[int]]:
    return sorted((sorted(q) for q in parts), key=lambda q: (-sum(values[i] for i in q), q))


def get_seqlen_balanced_partitions(seqlen_list: List[int], k_partitions: int, equal_size: bool) -> List[List[int]]:
    """verl's ``get_seqlen_balanced_partitions``: ``k_partitions`` sorted index lists covering ``seqlen_list``
    once, none empty, of equal sizes when ``equal_size``, with balanced sums. maskpack's planner
    (``maskpack.plan``: sequences dealt largest first, then moves and swaps) and a largest-differencing
    partition are both built and polished by single moves and swaps; the one with the lighter heaviest part
    is returned, so it is never less balanced than verl's Karmarkar-Karp (checked by the conformance
    tests). Partitions are in decreasing order of their sums."""
    values = [int(v) for v in seqlen_list]
    k = int(k_partitions)
    _check_partitioning("get_seqlen_balanced_partitions", values, k, equal_size)
    return _sorted_parts(min(_candidates(values, k, equal_size), key=_balance_key(values)), values)


def _workload(n: int) -> int:
    """verl's ``calculate_workload``: relative FLOPs of a sequence of n tokens in a dense block calibrated on a
    7B model (12 h^2 n + 2 h n^2 with h = 4096, divided by 2 h)."""
    return 24576 * n + n * n


def _effective_lengths(fn: str, batch: Any) -> Tuple[List[int], int, Any]:
    """(tokens per row, the longest row a micro-batch must hold, the device): from a nested ``input_ids``'
    offsets, else the bool/0-1 ``attention_mask``'s row sums and width, as verl reads them."""
    try:
        ids = batch["input_ids"]
    except (KeyError, TypeError):
        ids = None
    if isinstance(ids, torch.Tensor) and ids.is_nested:
        lens = ids.offsets().diff().tolist()
        return [int(v) for v in lens], max(lens) if lens else 0, ids.device
    try:
        mask = batch["attention_mask"]
    except (KeyError, TypeError):
        raise Error(f"{fn}: batch must hold attention_mask [B, S] (or a nested input_ids)",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="batch") from None
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise Error(f"{fn}: attention_mask must be a [B, S] tensor, found "
                    f"{tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__}",
                    "MASKPACK_ERR_SHAPE", argument="attention_mask")
    return [int(v) for v in mask.sum(dim=1).tolist()], int(mask.shape[-1]), mask.device


def _all_reduce(values: List[int], op, group: Any, device) -> List[int]:
    t = torch.tensor(values, dtype=torch.long, device=device)
    torch.distributed.all_reduce(t, op=op, group=group)
    return [int(v) for v in t.tolist()]


def _select_rows(value: Any, rows: List[int], idx: torch.Tensor, n_rows: int) -> Any:
    """One entry of the batch, rows ``rows`` (verl's ``index_select_tensor_dict``): tensors indexed, nested
    tensors rebuilt from their components, batched non-tensors (a NonTensorStack, a numpy array, a list of
    one item per row) indexed, anything else (scalar metadata) kept."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            parts = value.unbind()
            picked = [parts[i] for i in rows]
            ragged = getattr(value, "_ragged_idx", value.dim() - 1)
            cat = ragged - 1
            lens = torch.tensor([t.shape[cat] for t in picked], dtype=torch.long, device=value.device)
            offsets = torch.zeros(len(picked) + 1, dtype=torch.long, device=value.device)
            torch.cumsum(lens, 0, out=offsets[1:])
            return torch.nested.nested_tensor_from_jagged(torch.cat(picked, cat), offsets, jagged_dim=ragged)
        return value.index_select(0, idx if idx.device == value.device else idx.to(value.device))
    shape = getattr(value, "shape", None)
    if shape is not None:
        if not len(shape):
            return value
        try:
            import numpy as np

            if isinstance(value, np.ndarray):
                return value[rows]
        except ImportError:  # numpy absent: nothing here is a numpy array
            pass
        return value[idx]
    if isinstance(value, (list, tuple)) and len(value) == n_rows:
        return type(value)(value[i] for i in rows)
    return value


def _select(batch: Any, rows: List[int], n_rows: int) -> Any:
    idx = torch.tensor(rows, dtype=torch.long)
    data = {key: _select_rows(val, rows, idx, n_rows) for key, val in batch.items()}
    if isinstance(batch, dict):
        return data
    return type(batch)(data, batch_size=[len(rows)])  # a TensorDict (or one of its kind): the same class


def rearrange_micro_batches(batch: Any, max_token_len: int, dp_group: Any = None,
                            num_batches_divided_by: Optional[int] = None, same_micro_num_in_dp: bool = True,
                            min_num_micro_batch: Optional[int] = None, use_dynamic_bsz_balance: bool = True,
                            force_group_size: int = 1):
    """verl's ``rearrange_micro_batches`` (``verl/utils/seqlen_balancing.py``): ``(micro_batches, index_lists)``,
    the rows of ``batch`` (a TensorDict, or a dict of tensors) split into micro-batches of at most
    ``max_token_len`` real tokens, balanced by verl's attention workload, ``force_group_size`` consecutive rows
    kept together, the count agreed over ``dp_group`` (all-reduced on the batch's device) and rounded up to
    ``num_batches_divided_by``, at least ``min_num_micro_batch``. With ``use_dynamic_bsz_balance`` the
    micro-batches are ordered heaviest in the middle, lighter at both ends, as verl orders them.

    The partition is maskpack's (the candidates of :func:`get_seqlen_balanced_partitions`; among them the best
    balanced one within the token limit): never more micro-batches than verl's, and at verl's count never a
    heavier heaviest micro-batch (checked by the conformance tests). Without ``use_dynamic_bsz_balance`` the
    micro-batches come heaviest first. Bad input is a ``maskpack.Error`` (a ``ValueError``, as verl raises for
    the limit it cannot meet; verl asserts the others); a batch with no tokens gives one micro-batch, where
    verl asks its partitioner for zero."""
    fn = "rearrange_micro_batches"
    lens, longest, device = _effective_lengths(fn, batch)
    n_rows = len(lens)
    if isinstance(force_group_size, bool) or not isinstance(force_group_size, int) or force_group_size < 1:
        raise Error(f"{fn}: force_group_size must be an int >= 1, found {force_group_size!r}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="force_group_size")
    if max_token_len < longest:
        raise Error(f"{fn}: max_token_len {max_token_len} is below the sequence length {longest}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="max_token_len")
    if n_rows == 0 or n_rows % force_group_size:
        raise Error(f"{fn}: the batch's {n_rows} rows do not split into groups of force_group_size = "
                    f"{force_group_size}", "MASKPACK_ERR_INVALID_ARGUMENT", argument="force_group_size")
    fg = force_group_size
    n_groups = n_rows // fg
    group_tokens = [sum(lens[g * fg:(g + 1) * fg]) for g in range(n_groups)]
    workloads = [sum(_workload(n) for n in lens[g * fg:(g + 1) * fg]) for g in range(n_groups)]
    k = max(1, min(n_groups, -(-sum(lens) // max_token_len)))
    if min_num_micro_batch is not None:
        k = max(int(min_num_micro_batch), k)
    sync = (same_micro_num_in_dp and dp_group is not None and torch.distributed.is_available()
            and torch.distributed.is_initialized())
    if sync:
        k = _all_reduce([k], torch.distributed.ReduceOp.MAX, dp_group, device)[0]
    step = int(num_batches_divided_by) if num_batches_divided_by else 1
    k = -(-k // step) * step
    widest, fewest = max(group_tokens), n_groups
    if sync:  # every rank learns the fatal constraints before any raises, so none hangs in a collective
        widest, neg = _all_reduce([widest, -n_groups], torch.distributed.ReduceOp.MAX, dp_group, device)
        fewest = -neg
    if widest > max_token_len:
        raise Error(f"{fn}: a group of force_group_size = {fg} rows holds {widest} tokens, more than max_token_len "
                    f"{max_token_len}; a group is never split", "MASKPACK_ERR_INVALID_ARGUMENT", argument="max_token_len")
    key = _balance_key(workloads)
    while True:
        if k > fewest:
            raise Error(f"{fn}: max_token_len {max_token_len} needs {k} micro-batches, but a rank has only {fewest} "
                        f"groups of force_group_size = {fg} rows", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="max_token_len")
        fits = []
        for parts in _candidates(workloads, k, False):
            over = any(sum(group_tokens[g] for g in q) > max_token_len for q in parts)
            fits.append((over, key(parts), parts))
        over, _, parts = min(fits, key=lambda c: (c[0], c[1]))
        within = not over
        if sync:
            within = bool(_all_reduce([int(within)], torch.distributed.ReduceOp.MIN, dp_group, device)[0])
        if within:
            break
        k += step
    parts = _sorted_parts(parts, workloads)
    index_lists = [[g * fg + j for g in q for j in range(fg)] for q in parts]
    if use_dynamic_bsz_balance:
        index_lists.sort(key=lambda q: (sum(workloads[i // fg] for i in q[::fg]), q[0]), reverse=True)
        index_lists = index_lists[::2][::-1] + index_lists[1::2]
    return [_select(batch, q, n_rows) for q in index_lists], index_lists


# ---- verl/models/mcore/util.py: the padded (BSHD) pair and the fused-kernel output ---------------------------

def preprocess_bshd(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                    sequence_parallel: bool = False, pre_process: bool = True, *, tp: Optional[int] = None,
                    cp: Optional[int] = None):
    """verl's ``preprocess_bshd``: left (or any) padding moved to the right of rows as wide as the longest
    sequence (rounded up to tp under ``sequence_parallel``): ``(input_ids, attention_mask, position_ids)``
    (``input_ids`` untouched without pre_process). No context parallelism (cp must be 1, as in verl)."""
    fn = "preprocess_bshd"
    tp, cp, _ = resolve_parallel(fn, tp if sequence_parallel else (tp or 1), cp, 0, need=("tp", "cp"))
    if cp != 1:
        raise Error(f"{fn}: context parallelism without sequence packing is not supported (cp = {cp})",
                    "MASKPACK_ERR_UNSUPPORTED", argument="cp")
    check_bool_mask2d(fn, attention_mask)
    if position_ids.dim() != 2:
        raise Error(f"{fn}: position_ids must be [batch, seq], found {tuple(position_ids.shape)}", "MASKPACK_ERR_SHAPE",
                    argument="position_ids")
    mask = attention_mask if attention_mask.device.type == "cpu" else attention_mask.cpu()
    src = rows_layout(mask)
    lens = mask.sum(dim=1)
    width = int(lens.max()) if lens.numel() else 0
    if sequence_parallel:
        width += (-width) % tp
    dst = Layout.from_segments([(b, 0, int(n)) for b, n in enumerate(lens.tolist())], mask.shape[0], width)
    new_mask = relayout(attention_mask, src, dst, pad_value=0)
    new_pos = relayout(position_ids, src, dst, pad_value=0)
    new_ids = relayout(input_ids, src, dst, pad_value=0) if pre_process else input_ids
    return new_ids, new_mask, new_pos


def postprocess_bshd(result: torch.Tensor, attention_mask: torch.Tensor, original_attention_mask: torch.Tensor,
                     origin_seqlen: int, post_process: bool = True):
    """verl's ``postprocess_bshd``: the right-padded ``result`` of :func:`preprocess_bshd` back to the rows of
    ``original_attention_mask`` (``[B, origin_seqlen, ...]``, zeros elsewhere). Differentiable."""
    fn = "postprocess_bshd"
    if not post_process:
        return result
    check_bool_mask2d(fn, attention_mask)
    check_bool_mask2d(fn, original_attention_mask, "original_attention_mask")
    if original_attention_mask.shape[1] != int(origin_seqlen):
        raise Error(f"{fn}: original_attention_mask has {original_attention_mask.shape[1]} columns, origin_seqlen is "
                    f"{origin_seqlen}", "MASKPACK_ERR_SHAPE", argument="origin_seqlen")
    src = rows_layout(attention_mask.cpu(), "attention_mask")
    dst = rows_layout(original_attention_mask.cpu(), "original_attention_mask")
    return relayout(result, src, dst, pad_value=0)


def postprocess_packed_seqs_for_dict_output(labels_mask: torch.Tensor, output: Any, packed_seq_params: Any,
                                            attention_mask: torch.Tensor, batch_size: int, seq_len: int,
                                            post_process: bool = True, **kw: Any) -> dict:
    """verl's ``postprocess_packed_seqs_for_dict_output`` (fused kernels): ``output.entropy`` and
    ``output.log_probs`` (log-probs 0 where ``labels_mask`` is False; both viewed ``[1, -1]`` on ``output``, as
    verl does) each through :func:`postprocess_packed_seqs` (``kw``: its keywords)."""
    output.entropy = output.entropy.view(1, -1)
    output.log_probs = output.log_probs.view(1, -1)
    output.log_probs = output.log_probs.masked_fill(~labels_mask, 0.0)
    return {"entropy": postprocess_packed_seqs(output.entropy, packed_seq_params, attention_mask, batch_size, seq_len,
                                               post_process=post_process, **kw),
            "log_probs": postprocess_packed_seqs(output.log_probs, packed_seq_params, attention_mask, batch_size,
                                                 seq_len, post_process=post_process, **kw)}
