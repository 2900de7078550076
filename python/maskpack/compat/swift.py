"""Drop-in twins of ms-swift's batch functions, pinned to **ms-swift 4.6.0** (``swift/utils/transformers_utils.py``,
``swift/megatron/utils/utils.py``, ``swift/megatron/utils/megatron_lm_utils.py``,
``swift/megatron/trainers/utils.py``). They import nothing from ms-swift or Megatron; ``cp=`` / ``cp_rank=``
/ ``group=`` are keyword-only (falling back to an initialized ``parallel_state``), ``npu=`` replaces
``is_torch_npu_available()``.

Differences, on purpose:

* ``get_batch_on_this_cp_rank`` also splits ``attention_mask_2d`` (the ``[B, S]`` keep mask the Gated DeltaNet
  layers and ``get_last_tokens`` read) along the sequence under CP, like every other per-token tensor;
  ms-swift 4.6.0 leaves it whole, so its GDN layers read a mask of the wrong length.
* ms-swift counts its CP tail filler (``arange(2 cp)`` position ids repeated) as sequences in
  ``get_packed_seq_params``; the twin does too (that is what its consumers expect), while maskpack's own
  ``prepare_batch`` declares one pad segment there.
* Where ms-swift silently builds a wrong batch the twin raises ``maskpack.Error``: position ids whose first
  token is not a sequence start (ms-swift's cu_seqlens would not start at 0), sequences that do not divide by
  ``2 cp`` under zigzag CP.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from .._errors import Error
from .._layout import Layout
from .._moves import cp_gather
from . import _common
from ._common import resolve_group, resolve_parallel, Taker
from .mcore_bridge import _npu, shard_index

__all__ = ["get_packed_seq_params", "get_megatron_packed_seq_params", "get_padding_to", "get_batch_on_this_cp_rank",
           "prepare_npu_attention_mask", "reconstruct_tensor_cp", "get_last_tokens"]

UPSTREAM = "ms-swift==4.6.0"

_NPU_2D_MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")


def _starts_layout(fn: str, position_ids: torch.Tensor) -> Layout:
    if position_ids.shape[0] != 1:
        raise Error(f"{fn}: position_ids must be one packed row [1, T], found shape {tuple(position_ids.shape)}",
                    "MASKPACK_ERR_SHAPE", argument="position_ids")
    p = position_ids.detach().reshape(-1).cpu()
    if p.numel() == 0 or int(p[0]) != 0:
        raise Error(f"{fn}: the first position id must be 0 (a sequence start); found "
                    f"{int(p[0]) if p.numel() else 'no tokens'}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="position_ids", index=(0,))
    starts = torch.nonzero(p == 0).flatten()
    cu = torch.cat([starts, torch.tensor([p.numel()])])
    return Layout.from_cu_seqlens(cu)  # every position-0 token opens a sequence, as in ms-swift


def get_packed_seq_params(position_ids: torch.Tensor) -> Dict[str, Any]:
    """ms-swift's transformers-side ``get_packed_seq_params``: ``cu_seq_lens_q/k`` (int32, a sequence starting at
    every position 0, the CP tail filler included) and ``max_length_q/k`` (0-dim int32 tensors) of a packed row."""
    lay = _starts_layout("get_packed_seq_params", position_ids)
    dev = position_ids.device
    cu = torch.as_tensor(lay.cu_seqlens(dtype="int32")).to(dev)
    m = torch.tensor(lay.max_seqlen, dtype=torch.int32, device=dev)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": m, "max_length_k": m}


def get_megatron_packed_seq_params(args: Any, position_ids: torch.Tensor, *, npu: Optional[bool] = None):
    """ms-swift's Megatron-side ``get_packed_seq_params(args, position_ids)``: a ``PackedSeqParams`` (thd,
    ``max_seqlen_*`` Python ints) of the packed row; ``cp_partition_mode`` from ``args`` where the class has
    the field; on an NPU the padded offsets equal the real ones, as in ms-swift."""
    d = get_packed_seq_params(position_ids)
    params = _common.packed_seq_params(cu_seqlens_q=d["cu_seq_lens_q"], cu_seqlens_kv=d["cu_seq_lens_k"],
                                       max_seqlen_q=int(d["max_length_q"]), max_seqlen_kv=int(d["max_length_k"]),
                                       qkv_format="thd")
    if hasattr(params, "total_tokens"):
        params.total_tokens = position_ids.numel()
    if hasattr(params, "cp_partition_mode"):
        params.cp_partition_mode = args.cp_partition_mode
    if _npu(npu):
        params.cu_seqlens_q_padded = d["cu_seq_lens_q"]
        params.cu_seqlens_kv_padded = d["cu_seq_lens_k"]
    return params


def get_padding_to(args: Any) -> Optional[int]:
    """ms-swift's ``get_padding_to``: the multiple a packed batch's total is padded to: tp under sequence
    parallelism, times cp; times 128 (FP8 blockwise), 32 (MXFP8: each TP shard a multiple of 32) or 16 (any
    other FP8/FP4 format); at least 64 (times tp*cp) for the fused attention backend; None when nothing is
    needed."""
    from ..padding import swift_padding_to

    return swift_padding_to(tp=args.tensor_model_parallel_size, sequence_parallel=args.sequence_parallel,
                            cp=args.context_parallel_size, fp8_recipe=args.fp8_recipe,
                            fp8=(getattr(args, "fp8_format", None) or getattr(args, "fp8", None)),
                            fp4=(getattr(args, "fp4_format", None) or getattr(args, "fp4", None)),
                            attention_backend=args.attention_backend)


def get_batch_on_this_cp_rank(args: Any, batch: Dict[str, Any], *, cp: Optional[int] = None,
                              cp_rank: Optional[int] = None, npu: Optional[bool] = None) -> Dict[str, Any]:
    """ms-swift's ``get_batch_on_this_cp_rank``: ``labels``, ``position_ids``, ``loss_scale``, ``input_ids``
    (text models) and, unlike ms-swift, ``attention_mask_2d`` cut to the rank's CP part along the last
    dimension (per sequence of ``packed_seq_params.cu_seqlens_q`` when packed; ``args.cp_partition_mode``);
    on an NPU a 4D ``attention_mask`` along its query rows. In place; returns ``batch``."""
    fn = "get_batch_on_this_cp_rank"
    _, cp, cp_rank = resolve_parallel(fn, 1, cp, cp_rank, need=("cp", "cp_rank"))
    if cp > 1:
        keys = ["labels", "position_ids", "loss_scale", "attention_mask_2d"]
        if not args.is_multimodal:
            keys.append("input_ids")
        psp = batch.get("packed_seq_params")
        cu = getattr(psp, "cu_seqlens_q", None)
        mode = getattr(args, "cp_partition_mode", "zigzag")
        mode = "contiguous" if mode == "contiguous" else "zigzag"
        cache = {}

        def split(val, dim):
            dim = dim % val.ndim
            n = val.shape[dim]
            if n not in cache:
                cache[n] = Taker(shard_index(fn, n, cu, cp, cp_rank, mode), n)
            return cache[n](val, dim)

        for key, val in batch.items():
            if key not in keys:
                continue
            if args.task_type in ("seq_cls", "embedding", "generative_reranker") and key == "labels":
                continue
            if val is not None:
                batch[key] = split(val, -1)
        mask = batch.get("attention_mask")
        if _npu(npu) and mask is not None and mask.ndim >= 4:
            batch["attention_mask"] = split(mask, -2)
    return batch


def prepare_npu_attention_mask(batch: Dict[str, Any], keep_attention_mask_2d: bool) -> None:
    """ms-swift's ``_prepare_npu_generated_attention_mask``: on an NPU with flash attention the dense causal mask is
    dropped (the kernel builds its own); ``attention_mask_2d`` is kept (derived from the 4D masked mask when
    missing, by maskpack's 4D-to-2D rule) for the models whose GDN layers need it, else removed. In place."""
    if keep_attention_mask_2d:
        mask = batch.get("attention_mask")
        if "attention_mask_2d" not in batch and mask is not None:
            from .mcore_bridge import resolve_gdn_attention_mask

            batch["attention_mask_2d"] = resolve_gdn_attention_mask({"attention_mask": mask}, npu=False)
    else:
        batch.pop("attention_mask_2d", None)
    batch["attention_mask"] = None


def reconstruct_tensor_cp(cp_size: int, tensor: torch.Tensor, packed_seq_params: Any, num_samples: int,
                          cp_partition_mode: str = "zigzag", *, cp_rank: Optional[int] = None, group: Any = None):
    """ms-swift's ``reconstruct_tensor_cp`` (trainers/utils.py): the rank's ``[B, S/cp]`` (or packed ``[1, T/cp]``)
    per-token values -> every rank's gathered and put back in sequence order: packed, the first
    ``num_samples`` sequences of ``cu_seqlens_q`` (``[1, cu[num_samples]]``); padded, ``[B, S]``. The other
    ranks' parts are gathered detached, as in ms-swift (each rank keeps its own part's gradient)."""
    fn = "reconstruct_tensor_cp"
    _, _, cp_rank = resolve_parallel(fn, 1, cp_size, cp_rank, need=("cp_rank",))
    group = resolve_group(group)
    parts = [torch.empty_like(tensor) for _ in range(cp_size)]
    torch.distributed.all_gather(parts, tensor.contiguous(), group=group)
    parts[cp_rank] = tensor
    if cp_partition_mode == "contiguous":
        full = torch.cat(parts, dim=1)
        if packed_seq_params is not None:
            full = full[:, :int(packed_seq_params.cu_seqlens_q[num_samples])]
        return full
    if packed_seq_params is not None:
        cu = packed_seq_params.cu_seqlens_q.detach().to("cpu", torch.int64)
        n = tensor.shape[1] * cp_size
        if int(cu[-1]) != n:
            raise Error(f"{fn}: cu_seqlens_q ends at {int(cu[-1])}, the ranks hold {n} tokens", "MASKPACK_ERR_SHAPE",
                        argument="packed_seq_params")
        shard_index(fn, n, cu, cp_size, 0, "zigzag")  # every sequence splits into 2 cp chunks
        g = Layout.from_cu_seqlens(cu)
        whole = cp_gather([p[0] for p in parts], g, align=None)
        return whole[:int(cu[num_samples])].unsqueeze(0)
    n = tensor.shape[1] * cp_size
    shard_index(fn, n, None, cp_size, 0, "zigzag")
    rows = Layout.from_lengths([n] * tensor.shape[0])
    return cp_gather(parts, rows, align=None)


def get_last_tokens(args: Any, output_tensor: torch.Tensor, packed_seq_params: Any = None, attention_mask: Any = None,
                    *, cp_rank: Optional[int] = None, group: Any = None) -> torch.Tensor:
    """ms-swift's ``BaseMegatronTrainer.get_last_tokens`` (a method reading ``self.args``; here ``args`` first): each
    sequence's last token of ``output_tensor`` (gathered over CP first). Padded: the last valid column of the 2D
    keep mask (a 4D masked mask is read by maskpack's 4D-to-2D rule); packed: ``cu_seqlens_q[i] + seq_lens[i] - 1``."""
    fn = "get_last_tokens"
    if args.context_parallel_size > 1:
        output_tensor = _reconstruct_dim(fn, output_tensor, packed_seq_params, args.context_parallel_size,
                                         args.cp_partition_mode, cp_rank, group)
    if packed_seq_params is None:
        mask = attention_mask
        if mask.dim() > 2:
            from .mcore_bridge import resolve_gdn_attention_mask

            mask = resolve_gdn_attention_mask({"attention_mask": mask}, npu=False)
        m = mask.detach().cpu().long()
        b, s = m.shape
        # the last valid column of each row (ms-swift's get_last_valid_indices); an empty row has no last
        # token (ms-swift would return its last column, a pad)
        col = torch.arange(s).expand(b, s)
        last = torch.where(m.bool(), col, -1).max(dim=1).values
        empty = torch.nonzero(last < 0).flatten()
        if empty.numel():
            raise Error(f"{fn}: row {int(empty[0])} of attention_mask has no token, so no last token",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="attention_mask", index=(int(empty[0]),))
        return output_tensor[torch.arange(output_tensor.shape[0]), last.to(output_tensor.device)]
    num = packed_seq_params.seq_lens.shape[0]
    idx = packed_seq_params.cu_seqlens_q[:num] + packed_seq_params.seq_lens - 1
    return output_tensor[0, idx]


def _reconstruct_dim(fn, tensor, packed_seq_params, cp, mode, cp_rank, group):
    """ms-swift's utils.reconstruct_tensor_cp(tensor, packed_seq_params, dim=1, mode): all ranks' parts in order."""
    _, _, cp_rank = resolve_parallel(fn, 1, cp, cp_rank, need=("cp_rank",))
    group = resolve_group(group)
    parts = [torch.empty_like(tensor) for _ in range(cp)]
    torch.distributed.all_gather(parts, tensor.contiguous(), group=group)
    parts[cp_rank] = tensor
    full = torch.cat(parts, dim=1)
    if mode == "contiguous":
        return full
    n = full.shape[1]
    cu = None if packed_seq_params is None else (packed_seq_params.cu_seqlens_q_padded
                                                 if packed_seq_params.cu_seqlens_q_padded is not None
                                                 else packed_seq_params.cu_seqlens_q)
    idx = torch.cat([shard_index(fn, n, cu, cp, r, "zigzag") for r in range(cp)])
    inv = torch.empty_like(idx)
    inv[idx] = torch.arange(n)
    return full.index_select(1, inv.to(full.device))
