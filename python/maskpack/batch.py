"""maskpack.prepare_batch: from a dataloader's batch and a training target, everything the model step
needs, derived from one layout so that no two consumers can disagree (SEMANTICS.md sections 7, 8, 11).

    bundle = maskpack.prepare_batch(batch, backend="sdpa", padding_free=True, cp=2, cp_rank=rank)
    out = model(bundle.input_ids, attention_mask=bundle.attention_mask, position_ids=bundle.position_ids)
    loss = (per_token_loss * bundle.loss_weights).sum()      # all-reduce(sum) over CP ranks = exact mean
    logits = bundle.to_padded(out.logits, parts=all_ranks_logits)   # back to the dataloader's layout
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ._errors import Error
from ._layout import Layout
from ._moves import cp_multiple, relayout
from ._tensors import is_torch_tensor

BACKENDS = ("flash_attn", "sdpa", "eager", "npu", "megatron")


@dataclass
class Batch:
    """The per-step bundle. Per-token tensors are this CP rank's, in the target layout's token order
    ([B, S_local] padded or [T_local] packed). Keys mirror what the consumers call them."""

    backend: str
    padding_free: bool
    cp: int
    cp_rank: int
    layout: Layout                 # this rank's layout (queries = its tokens, keys = the whole batch)
    global_layout: Layout          # the unsharded target layout, CP-aligned
    source_layout: Layout          # the dataloader's layout
    input_ids: Any
    position_ids: Any              # global positions within each sequence (RoPE)
    attention_mask: Any            # what the attention kernel takes (None where it takes cu_seqlens)
    attention_mask_2d: Any         # keep mask of this rank's tokens: GDN layers, RoPE, get_last_tokens
    labels: Any = None             # the labels as given, moved to this rank
    shift_labels: Any = None       # next-token labels shifted inside each sequence (model must not re-shift)
    loss_weights: Any = None       # sum(loss * w) over all ranks = the mean loss
    loss_denominator: float = 0.0
    cu_seqlens: Any = None         # TE/flash-attn form, of the global layout (TE's THD CP convention)
    cu_seqlens_padded: Any = None
    max_seqlen: int = 0
    local_cu_seqlens: Any = None   # cu_seqlens_padded / cp: the rank's own token offsets per sequence
    npu: Optional[Dict[str, Any]] = None  # npu_fusion_attention keyword arguments
    last_token_index: Any = None   # this rank's flattened index of each sequence's last token, -1 elsewhere
    last_token_rank: Any = None    # the rank holding each sequence's last token
    extras: Dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, Any]:
        """The model-facing fields as a dict (None fields dropped)."""
        keys = ("input_ids", "position_ids", "attention_mask", "attention_mask_2d", "labels", "shift_labels",
                "loss_weights", "cu_seqlens", "cu_seqlens_padded", "max_seqlen", "local_cu_seqlens",
                "last_token_index")
        d = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        if self.npu is not None:
            d["npu"] = self.npu
        return d

    def to(self, device: Any, non_blocking: bool = False) -> "Batch":
        """The bundle with every tensor on ``device`` (numpy arrays become torch tensors there; dicts
        such as ``npu`` and ``extras`` are walked; layouts and scalars are kept). ``non_blocking``
        as torch's ``Tensor.to`` (asynchronous from pinned host memory)."""
        import dataclasses

        return dataclasses.replace(self, **{f.name: _to_device(getattr(self, f.name), device, non_blocking)
                                            for f in dataclasses.fields(self)})

    def to_padded(self, x: Any, parts: Optional[List[Any]] = None, pad_value: Any = 0):
        """Output of the model step (per-token, this rank's layout) -> the dataloader's layout. Under CP,
        pass every rank's output in rank order as ``parts`` (e.g. from an all_gather) to reassemble the
        whole batch; without ``parts`` only this rank's tokens are placed and the rest is pad_value."""
        if self.cp == 1 or parts is None:
            return relayout(x, self.layout, self.source_layout, pad_value=pad_value)
        if len(parts) != self.cp:
            raise Error(f"parts: expected {self.cp} rank outputs, found {len(parts)}", "MASKPACK_ERR_SHAPE",
                        argument="parts")
        shards = [self.global_layout.cp_shard(self.cp, r, scheme=self.extras["cp_scheme"], align=None)
                  for r in range(self.cp)]
        return relayout(list(parts), shards, self.source_layout, pad_value=pad_value)

    def hf_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments for a transformers model's forward (``model(**bundle.hf_kwargs())``),
        one rank (cp = 1: transformers models do no context parallelism). Padded: input_ids and
        position_ids ``[B, S]`` and the 2D keep mask, whatever the backend (transformers builds its
        attention masks from it, and its Gated DeltaNet / Mamba layers need exactly that 2D mask: a
        4D one reaches them as no mask at all). Padding-free: one packed row ``[1, T]`` with
        flash-attention's ``cu_seq_lens_q/k`` and ``max_length_q/k`` (which the flash kernels and
        maskpack-patched GDN layers read; sdpa/eager separate the sequences by the restarting
        position ids) and ``use_cache=False`` (with a cache transformers stops detecting packed
        sequences). Labels are left out: pass ``shift_labels`` and ``loss_weights`` to the loss."""
        if self.cp != 1:
            raise Error(f"cp: transformers models run no context parallelism; hf_kwargs needs cp = 1, found {self.cp}",
                        "MASKPACK_ERR_UNSUPPORTED", argument="cp")
        if not self.padding_free:
            return {"input_ids": self.input_ids, "position_ids": self.position_ids,
                    "attention_mask": self.layout.mask2d("int64")}
        import torch

        cu = torch.as_tensor(self.cu_seqlens).to(torch.int32)
        return {"input_ids": self.input_ids[None], "position_ids": self.position_ids[None], "cu_seq_lens_q": cu,
                "cu_seq_lens_k": cu, "max_length_q": int(self.max_seqlen), "max_length_k": int(self.max_seqlen),
                "use_cache": False}


def _to_device(v: Any, device: Any, non_blocking: bool) -> Any:
    import numpy as np
    import torch

    if isinstance(v, torch.Tensor):
        return v.to(device, non_blocking=non_blocking)
    if isinstance(v, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(v)).to(device, non_blocking=non_blocking)
    if isinstance(v, dict):
        return {k: _to_device(x, device, non_blocking) for k, x in v.items()}
    if isinstance(v, (list, tuple)) and any(isinstance(x, (torch.Tensor, np.ndarray)) for x in v):
        return type(v)(_to_device(x, device, non_blocking) for x in v)
    return v


def _source_layout(batch: Dict[str, Any], mask_convention: Optional[str], cu_form: str, position_rule: str,
                   rule: Dict[str, Any]) -> Layout:
    mask = batch.get("attention_mask")
    if mask is not None:
        ndim = len(mask.shape)
        if ndim == 2:
            return Layout.from_mask2d(mask, convention=mask_convention or "keep", **rule)
        if ndim == 4:
            if mask_convention not in ("keep", "masked", "additive"):
                raise Error("mask_convention: a 4D attention_mask needs its convention stated ('keep', 'masked' or "
                            f"'additive'); found {mask_convention!r} (an unannotated mask is never guessed)",
                            "MASKPACK_ERR_CONVENTION", argument="mask_convention")
            lay = Layout.from_mask4d(mask, convention=mask_convention)
            return lay.with_rule(**rule) if rule else lay
        raise Error(f"attention_mask: expected [B,S] or [B,1,S,S], found {ndim} dimensions", "MASKPACK_ERR_SHAPE",
                    argument="attention_mask")
    if batch.get("cu_seqlens") is not None:
        ids = batch["input_ids"]
        total = int(ids.shape[-1]) if len(ids.shape) else 0
        return Layout.from_cu_seqlens(batch["cu_seqlens"], form=cu_form, total=total,
                                      cu_padded=batch.get("cu_seqlens_padded"), **rule)
    if batch.get("position_ids") is not None:
        pos = batch["position_ids"]
        if len(pos.shape) == 2 and pos.shape[0] == 1:
            pos = pos[0]
        return Layout.from_position_ids(pos, rule=position_rule, **rule)
    ids = batch["input_ids"]
    if len(ids.shape) != 2:
        raise Error("input_ids: without attention_mask, cu_seqlens or position_ids expected [B,S]",
                    "MASKPACK_ERR_SHAPE", argument="input_ids")
    lay = Layout.from_lengths([int(ids.shape[1])] * int(ids.shape[0]), placement="right", **rule)
    return lay.with_outputs("torch") if is_torch_tensor(ids) else lay


def _tokens_of(x: Any, layout: Layout) -> Any:
    """Accept [1,T] for packed inputs (HF's padding-free batches) as [T]."""
    if x is None:
        return None
    if layout.packed and len(x.shape) >= 2 and x.shape[0] == 1 and x.shape[1] == layout.q_width:
        return x[0]
    return x


def prepare_batch(batch: Dict[str, Any], backend: str = "flash_attn", padding_free: bool = False, tp: int = 1,
                  cp: int = 1, cp_rank: int = 0, *, cp_scheme: str = "zigzag", align: str = "verl",
                  input_layout: Optional[str] = None, head_dim: Optional[int] = None, scale: Optional[float] = None,
                  mask_convention: Optional[str] = None, cu_form: str = "te", position_rule: str = "reset",
                  ignore_index: int = -100, loss_mode: str = "token", pad_token_id: int = 0,
                  mask_dtype: Any = "float32", **rule: Any) -> Batch:
    """A dataloader batch dict (input_ids with attention_mask, or cu_seqlens, or position_ids; labels
    optional) and a target -> :class:`Batch`.

    backend: "flash_attn" (CUDA flash-attn: no dense mask; cu_seqlens when padding_free, the 2D keep mask
    otherwise), "sdpa" (bool keep mask [B,1,S,Skv]), "eager" (additive mask in ``mask_dtype`` with the
    dtype's minimum), "npu" (npu_fusion_attention arguments; input_layout TND when padding_free, BSND
    otherwise), "megatron" (bool masked-convention [B,1,S,S] when padded, cu_seqlens when padding_free).
    The rule (causal=True, window=..., spans=..., prefix=...) applies to every backend alike."""
    if backend not in BACKENDS:
        raise Error(f"backend: expected one of {', '.join(BACKENDS)}, found {backend!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="backend")
    if "input_ids" not in batch:
        raise Error("batch: expected an 'input_ids' entry", "MASKPACK_ERR_NOT_FOUND", argument="input_ids")
    cp, tp, cp_rank = int(cp), int(tp), int(cp_rank)
    if cp < 1 or not 0 <= cp_rank < cp:
        raise Error(f"cp_rank: expected in [0, {cp}), found {cp_rank}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="cp_rank")
    src = _source_layout(batch, mask_convention, cu_form, position_rule, rule)
    target = src.packed_of() if padding_free else src
    if cp > 1:
        glob = target.pad_to_multiple(cp_multiple(cp, tp, align))
        local = glob.cp_shard(cp, cp_rank, scheme=cp_scheme, align=None)
    else:
        glob = target.pad_to_multiple(tp) if (tp > 1 and padding_free) else target
        local = glob

    input_ids = _tokens_of(batch["input_ids"], src)
    ids_local = relayout(input_ids, src, local, pad_value=pad_token_id)
    labels = _tokens_of(batch.get("labels"), src)
    base = labels if labels is not None else input_ids
    shifted = src.shift_labels(base, ignore_index=ignore_index)
    weights, denom = src.loss_weights(loss_mode, labels=shifted, ignore_index=ignore_index, dtype="float32",
                                      return_denominator=True)
    out = Batch(
        backend=backend, padding_free=bool(padding_free), cp=cp, cp_rank=cp_rank, layout=local, global_layout=glob,
        source_layout=src, input_ids=ids_local, position_ids=local.position_ids(),
        attention_mask=None, attention_mask_2d=local.mask2d(),
        labels=relayout(labels, src, local, pad_value=ignore_index) if labels is not None else None,
        shift_labels=relayout(shifted, src, local, pad_value=ignore_index),
        loss_weights=relayout(weights, src, local), loss_denominator=denom,
        extras={"cp_scheme": cp_scheme, "tp": tp, "align": align})
    if padding_free:
        out.cu_seqlens = glob.cu_seqlens("te")
        out.cu_seqlens_padded = glob.cu_seqlens_padded()
        out.max_seqlen = int(glob.max_seqlen)
        if cp > 1:
            cup = glob.cu_seqlens_padded()
            out.local_cu_seqlens = cup // cp
    if backend == "sdpa":
        out.attention_mask = local.mask4d("keep")
    elif backend == "eager":
        out.attention_mask = local.mask4d("additive", dtype=mask_dtype, fill="min")
    elif backend == "megatron":
        out.attention_mask = None if padding_free else local.mask4d("masked")
    elif backend == "flash_attn":
        out.attention_mask = None if padding_free else local.mask2d("int64")
    elif backend == "npu":
        layout_name = input_layout or ("TND" if padding_free else "BSND")
        if head_dim is None and scale is None:
            raise Error("head_dim: the NPU operator defaults scale to 1.0; pass head_dim (for 1/sqrt(head_dim)) "
                        "or scale", "MASKPACK_ERR_INVALID_ARGUMENT", argument="head_dim")
        out.npu = local.npu_args(layout_name, scale=scale, head_dim=head_dim)
        out.attention_mask = out.npu["atten_mask"]
    if cp > 1:
        rank, loc = glob.cp_last_token(cp, scheme=cp_scheme, align=None)
        out.last_token_rank = rank
        mine = loc.clone() if is_torch_tensor(loc) else loc.copy()
        mine[rank != cp_rank] = -1
        out.last_token_index = mine
    else:
        out.last_token_index = local.last_token_index()
    return out
