"""maskpack.prepare_batch: from a dataloader's batch and a training target, everything the model step
needs, derived from one layout so that no two consumers can disagree (docs/conventions.md).

    bundle = maskpack.prepare_batch(batch, padding_free=True, cp=2, cp_rank=rank)
    out = model(**bundle.hf_kwargs())                        # or flash_attn_kwargs(), sdpa_mask(), ...
    loss = (per_token_loss * bundle.loss_weights).sum()      # all-reduce(sum) over CP ranks = exact mean
    logits = bundle.to_padded(out.logits, parts=all_ranks_logits)   # back to the dataloader's layout

What the batch hands over is read in every form dataloaders use (attention_mask 2D or 4D, cu_seqlens,
transformers' cu_seq_lens_q/k, seq_idx, position_ids [T], [1,T], [B,S] and M-RoPE [3,B,S] / [3,1,T] /
[3,T], input_ids or inputs_embeds); where two of them describe the segments differently, an error names
the first token where they disagree. Every per-token key moves with the tokens (labels, shift_labels and
the keys named in ``per_token_keys`` must fit the token grid, or an error names them); a key that is not
per-token passes through and is listed. Fields a consumer reads (dense masks, NPU arguments, offsets) are derived
on first access: nothing is built that nobody reads.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._errors import Error
from ._layout import Layout
from ._moves import cp_multiple, relayout
from ._tensors import is_torch_tensor
from ._runtime import above as _above  # the layers above this one, by name (see there)

BACKENDS = ("flash_attn", "sdpa", "eager", "npu", "megatron", "mindspeed")

# keys that describe the layout (read, checked against each other, never moved as data)
_LAYOUT_KEYS = ("attention_mask", "cu_seqlens", "cu_seqlens_padded", "cu_seq_lens_q", "cu_seq_lens_k", "seq_idx",
                "max_length_q", "max_length_k", "max_seqlen", "position_ids")
# per-token keys whose padding is a label to ignore rather than zero
_LABEL_KEYS = ("labels", "shift_labels")


class Batch:
    """The per-step bundle of one CP rank. Per-token tensors are in this rank's layout ([B, S_local]
    padded or [T_local] packed); derived fields are built on first access and kept. Methods return
    exactly what each consumer takes: :meth:`hf_kwargs`, :meth:`flash_attn_kwargs`,
    :meth:`megatron_packed_seq_params`, :meth:`fla_kwargs`, :meth:`sdpa_mask`, :meth:`eager_mask`,
    :meth:`flex_block_mask`, :meth:`npu_kwargs`.

    Attributes: ``tokens`` (every per-token key of the batch moved to this rank, with the derived
    ``shift_labels``, ``loss_weights`` and ``position_ids``), ``passthrough`` (the keys that are not
    per-token, untouched; :func:`prepare_batch` says how the split is made), ``layout`` (this rank's
    layout: its tokens as queries, the whole batch as keys), ``global_layout`` (the unsharded target
    layout, CP / tp aligned), ``source_layout`` (the dataloader's layout), ``loss_denominator``."""

    def __init__(self, *, backend: str, padding_free: bool, cp: int, cp_rank: int, layout: Layout,
                 global_layout: Layout, source_layout: Layout, tokens: Dict[str, Any], passthrough: Dict[str, Any],
                 loss_denominator: float, options: Dict[str, Any]) -> None:
        self.backend = backend
        self.padding_free = bool(padding_free)
        self.cp = cp
        self.cp_rank = cp_rank
        self.layout = layout                  # this rank's layout (queries = its tokens, keys = the whole batch)
        self.global_layout = global_layout    # the unsharded target layout, CP-aligned
        self.source_layout = source_layout    # the dataloader's layout
        self.tokens = tokens                  # every per-token key of the batch, moved to this rank
        self.passthrough = passthrough        # keys that are not per-token: handed over untouched
        self.loss_denominator = loss_denominator
        self.extras = dict(options)
        self._device = options.get("device")

    # ---- per-token tensors (moved at construction) ---------------------------------------------

    @property
    def input_ids(self):
        """The batch's input_ids moved to this rank (pads: ``pad_token_id``); None for inputs_embeds."""
        return self.tokens.get("input_ids")

    @property
    def inputs_embeds(self):
        """The batch's inputs_embeds moved to this rank (pads: 0), or None."""
        return self.tokens.get("inputs_embeds")

    @property
    def labels(self):
        """The labels as given, moved to this rank (pads: ignore_index)."""
        return self.tokens.get("labels")

    @property
    def shift_labels(self):
        """Next-token labels shifted inside each sequence (the model must not shift again)."""
        return self.tokens["shift_labels"]

    @property
    def loss_weights(self):
        """sum(loss * w) over all ranks = the mean loss (loss_mode "token" or "sequence")."""
        return self.tokens["loss_weights"]

    @property
    def position_ids(self):
        """The position ids the batch gave (M-RoPE [3, ...] included), moved to this rank; derived
        (0, 1, ... restarting per sequence) when the batch had none or ``recompute_position_ids``."""
        return self.tokens["position_ids"]

    @property
    def passthrough_keys(self) -> List[str]:
        """The batch's keys that are not per-token (sorted): handed over untouched in :attr:`passthrough`."""
        return sorted(self.passthrough)

    # ---- derived on first access ---------------------------------------------------------------

    def _place(self, x):
        return x if self._device is None else _to_device(x, self._device, False)

    @functools.cached_property
    def attention_mask_2d(self):
        """Keep mask of this rank's tokens: for GDN layers, RoPE and last-token lookups."""
        return self._place(self.layout.mask2d())

    @functools.cached_property
    def attention_mask(self):
        """What the ``backend`` attention takes: sdpa a bool keep mask [B,1,S,Skv], eager an additive
        one, megatron a bool masked one (padded), flash_attn the 2D keep mask (padded); None where
        cu_seqlens carry the segments (padding-free), the NPU mask for "npu"."""
        b = self.backend
        if b == "sdpa":
            return self.sdpa_mask()
        if b == "eager":
            return self.eager_mask(self.extras.get("mask_dtype", "float32"))
        if b == "megatron":
            return None if self.padding_free else self._place(self.layout.mask4d("masked"))
        if b == "flash_attn":
            return None if self.padding_free else self._place(self.layout.mask2d("int64"))
        if b == "mindspeed":
            return self._mindspeed_mask()
        return self.npu["atten_mask"]

    @functools.cached_property
    def cu_seqlens(self):
        """TE / flash-attn cu_seqlens of the global layout (TE's THD CP convention); None when padded."""
        return self._place(self.global_layout.cu_seqlens("te")) if self.padding_free else None

    @functools.cached_property
    def cu_seqlens_padded(self):
        """TE's cu_seqlens_padded of the global layout: each sequence's slot offsets [0, s1, ..., sN]
        once padded for CP / tp alignment (equal to :attr:`cu_seqlens` where nothing was padded); divided
        by cp it gives this rank's offsets (:attr:`local_cu_seqlens`). None when padded."""
        return self._place(self.global_layout.cu_seqlens_padded()) if self.padding_free else None

    @functools.cached_property
    def max_seqlen(self) -> int:
        """The longest sequence a kernel must size for: the longest real sequence at cp = 1 and tp = 1;
        under context parallelism (zigzag / contiguous) or tp > 1 the longest *padded* slot of the global
        layout (each sequence is padded to the cp / tp alignment; TransformerEngine divides it by cp and
        2cp to size per-rank work; verl, Megatron-Bridge and TE's own default use the padded slot);
        under Ulysses the longest real sequence (each rank attends over whole sequences); or the value
        ``max_seqlen=`` forced."""
        forced = self.extras.get("max_seqlen")
        if forced is not None:
            return int(forced)
        if self.extras.get("cp_scheme") == "ulysses":  # whole sequences per head group: the real longest
            return int(self.global_layout.max_seqlen)
        if self.cp > 1 or self.extras.get("tp", 1) > 1:
            return _max_slot(self.global_layout)
        return int(self.global_layout.max_seqlen)

    @functools.cached_property
    def local_cu_seqlens(self):
        """This rank's token offsets per sequence: cu_seqlens_padded / cp (equals cu_seqlens_padded at
        cp = 1); None when padded."""
        if not self.padding_free:
            return None
        return self._place(self.global_layout.cu_seqlens_padded() // self.cp)

    @functools.cached_property
    def npu(self) -> Optional[Dict[str, Any]]:
        """npu_fusion_attention keyword arguments with maskpack's diagnostics (backend "npu" only)."""
        if self.backend != "npu":
            return None
        return self._npu_args()

    def _npu_args(self) -> Dict[str, Any]:
        o = self.extras
        if o.get("head_dim") is None and o.get("scale") is None:
            raise Error("head_dim: npu_fusion_attention's scale defaults to 1.0; pass head_dim= (for 1/sqrt(head_dim)) "
                        "or scale= to prepare_batch", "MASKPACK_ERR_INVALID_ARGUMENT", argument="head_dim")
        name = o.get("input_layout") or ("TND" if self.padding_free else "BSND")
        args = self.layout.npu_args(name, scale=o.get("scale"), head_dim=o.get("head_dim"))
        return {k: (self._place(v) if is_torch_tensor(v) or isinstance(v, np.ndarray) else v) for k, v in args.items()}

    @functools.cached_property
    def _last_tokens(self) -> Tuple[Any, Any]:
        if self.cp > 1:
            rank, loc = self.global_layout.cp_last_token(self.cp, scheme=self.extras["cp_scheme"], align=None)
            mine = loc.clone() if is_torch_tensor(loc) else loc.copy()
            mine[rank != self.cp_rank] = -1
            return self._place(mine), self._place(rank)
        return self._place(self.layout.last_token_index()), None

    @property
    def last_token_index(self):
        """This rank's flattened index of each sequence's last token ([N], one per sequence), -1 where
        another rank holds it. A row of the batch with no token (an all-zero mask row) holds no sequence
        and so has no entry: :attr:`empty_rows` lists those rows."""
        return self._last_tokens[0]

    @property
    def last_token_rank(self):
        """Under CP: the rank holding each sequence's last token ([N], one per sequence, the same on every
        rank), so the rank where :attr:`last_token_index` is not -1; None at cp = 1 (this rank holds
        them all)."""
        return self._last_tokens[1]

    @property
    def empty_rows(self) -> List[int]:
        """Rows of the dataloader's padded batch that hold no token (no sequence, no last token)."""
        src = self.source_layout
        if src.packed:
            return []
        used = {row for row, *_ in src.segments}
        return [r for r in range(src.n_rows) if r not in used]

    # ---- one method per consumer ---------------------------------------------------------------

    def sdpa_mask(self):
        """torch SDPA's bool keep mask [B, 1, S, Skv] (True = attend) of this rank's queries."""
        return self._place(self.layout.mask4d("keep"))

    def eager_mask(self, dtype: Any = "float32"):
        """transformers' eager additive mask [B, 1, S, Skv] in ``dtype`` (0 / the dtype's minimum)."""
        return self._place(self.layout.mask4d("additive", dtype=dtype, fill="min"))

    def flex_block_mask(self, block_q: int = 128, block_k: int = 128):
        """A torch FlexAttention ``BlockMask`` of this rank's layout."""
        return self.layout.flex_block_mask(block_q, block_k)

    def _mindspeed_mask(self):
        """MindSpeed (backend "mindspeed"): no dense mask for plain causal attention (its TE backend builds its
        own compressed causal mask; a dense [B,1,S,S] mask handed to that path is wrong); otherwise the masked
        [B,1,S,Skv] mask of this rank (padded). A padding-free batch under another rule is refused: MindSpeed's
        THD path would run it causal."""
        r = self.layout.rule
        if r["causal"] and tuple(r["window"]) == (-1, -1) and not r["spans"] and r["prefix"] is None:
            return None
        if self.padding_free:
            raise Error("backend: MindSpeed's THD attention takes no mask and runs causal; this rule "
                        f"(causal={r['causal']}, window={tuple(r['window'])}, spans, prefix) needs backend='npu'",
                        "MASKPACK_ERR_UNSUPPORTED", argument="backend")
        return self._place(self.layout.mask4d("masked"))

    def mindspeed_kwargs(self) -> Dict[str, Any]:
        """What MindSpeed reads beside the tokens (backend "mindspeed"): ``attention_mask`` (None for plain causal
        attention), ``attention_mask_2d`` (the keep mask of this rank's tokens, for the Gated DeltaNet layers),
        ``position_ids``, and, padding-free, the NPU-form sequence ends (no leading 0) of the padded slots:
        ``actual_seq_len`` (global, as ``set_actual_seq_len`` takes them) and ``actual_seq_len_local`` (this
        rank's, the padded ends divided by cp, for MindSpeed's P2P ring); None when padded."""
        ends = ends_local = None
        if self.padding_free:
            cup = self.global_layout.cu_seqlens_padded()
            ends = self._place(cup[1:])
            ends_local = self._place(cup[1:] // self.cp)
        return {"attention_mask": self.attention_mask if self.backend == "mindspeed" else self._mindspeed_mask(),
                "attention_mask_2d": self.attention_mask_2d, "position_ids": self.position_ids,
                "actual_seq_len": ends, "actual_seq_len_local": ends_local}

    def npu_kwargs(self) -> Dict[str, Any]:
        """Exactly the keyword arguments of ``torch_npu.npu_fusion_attention`` (no diagnostics), spelled
        as torch_npu spells them (``pre_tockens``, ``next_tockens``). Needs ``head_dim=`` or ``scale=``
        given to :func:`prepare_batch` (the operator's own default scale is 1.0, not 1/sqrt(head_dim))."""
        args = self.npu if self.npu is not None else self._npu_args()
        return {k: v for k, v in args.items() if not k.startswith("maskpack_")}

    def flash_attn_kwargs(self) -> Dict[str, Any]:
        """flash_attn_varlen_func's segment arguments: cu_seqlens_q/k (int32) and max_seqlen_q/k
        (padding-free); the 2D keep mask for the padded path (flash-attn's unpad_input).

        Under cp > 1 flash-attn itself runs no context parallelism: with ``cp_scheme="ulysses"``
        (padding-free) every rank attends over the whole stream after the heads all-to-all, so these are
        the whole stream's offsets (``cu_seqlens``, the real longest sequence); a zigzag or contiguous
        rank holds pieces of sequences whose attention needs the other ranks' keys, and is refused
        (use :func:`maskpack.attention` with ``group=``, or TransformerEngine with
        :meth:`megatron_packed_seq_params`)."""
        if self.cp > 1 and not (self.padding_free and self.extras.get("cp_scheme") == "ulysses"):
            raise Error(f"cp: flash-attn runs no context parallelism: this rank holds part of each sequence "
                        f"(cp = {self.cp}, cp_scheme {self.extras.get('cp_scheme')!r}, "
                        f"{'padding-free' if self.padding_free else 'padded'}); use maskpack.attention(group=), "
                        f"TransformerEngine (megatron_packed_seq_params) or cp_scheme='ulysses' padding-free",
                        "MASKPACK_ERR_UNSUPPORTED", argument="cp")
        if not self.padding_free:
            return {"attention_mask": self._place(self.layout.mask2d("int64"))}
        cu = _as_int32(self.cu_seqlens)
        return {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": self.max_seqlen,
                "max_seqlen_k": self.max_seqlen}

    def megatron_packed_seq_params(self, as_object: bool = False, cu_seqlens_q: str = "real"):
        """The fields of Megatron-core's ``PackedSeqParams`` for THD (padding-free): qkv_format "thd",
        cu_seqlens_q/kv, cu_seqlens_q/kv_padded (slots), max_seqlen_q/kv (the longest padded slot, as
        Megatron-Bridge sets it). ``cu_seqlens_q="real"`` (the default, TransformerEngine's documented
        contract) puts the real offsets in cu_seqlens_q/kv; ``"padded"`` puts the slot offsets there too, as
        verl and Megatron's packed loader do under CP on purpose (TransformerEngine issue 1930; equal to
        maskpack.compat.verl's). ``as_object=True`` builds the class itself (needs megatron.core)."""
        if cu_seqlens_q not in ("real", "padded"):
            raise Error(f"cu_seqlens_q: expected 'real' (TransformerEngine's contract) or 'padded' (verl's and "
                        f"Megatron's packed loader's), found {cu_seqlens_q!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="cu_seqlens_q")
        if not self.padding_free:
            raise Error("padding_free: PackedSeqParams describe a THD (padding-free) batch; this bundle is padded",
                        "MASKPACK_ERR_UNSUPPORTED", argument="padding_free")
        cu, cup = _as_int32(self.cu_seqlens), _as_int32(self.cu_seqlens_padded)
        if cu_seqlens_q == "padded":
            cu = cup
        m = _max_slot(self.global_layout) if self.extras.get("max_seqlen") is None else int(self.extras["max_seqlen"])
        fields = {"qkv_format": "thd", "cu_seqlens_q": cu, "cu_seqlens_kv": cu, "cu_seqlens_q_padded": cup,
                  "cu_seqlens_kv_padded": cup, "max_seqlen_q": m, "max_seqlen_kv": m}
        if not as_object:
            return fields
        from megatron.core.packed_seq_params import PackedSeqParams

        return PackedSeqParams(**fields)

    def fla_kwargs(self, group: Any = None, conv1d_kernel_size: Optional[int] = None) -> Dict[str, Any]:
        """What flash-linear-attention's ``chunk_gated_delta_rule`` and ``causal_conv1d`` take for packed
        rows: ``cu_seqlens`` (int64, the one packed row of this rank's tokens; inputs shaped [1, T, ...]);
        padded: the 2D keep mask its layers unpad with. Under context parallelism (cp > 1, padding-free,
        ``cp_scheme="ulysses"``: flash-linear-attention cuts the whole packed stream contiguously, which is
        maskpack's Ulysses split) with ``group=``: the keyword arguments of its ``build_cp_context`` for this
        rank (:func:`maskpack.gdn.fla_cp_kwargs`); without ``group`` an error naming it, and a per-sequence
        split (zigzag, contiguous) an error naming ``cp_scheme`` (reshard with
        :func:`maskpack.distributed.cp_reshard` first)."""
        if not self.padding_free:
            if self.cp != 1:
                raise Error(f"padding_free: flash-linear-attention's context parallelism takes one packed stream; "
                            f"this bundle is padded at cp = {self.cp}", "MASKPACK_ERR_UNSUPPORTED",
                            argument="padding_free")
            return {"attention_mask": self._place(self.layout.mask2d("int64"))}
        if self.cp != 1:
            scheme = self.extras["cp_scheme"]
            if scheme != "ulysses":
                raise Error(f"cp_scheme: flash-linear-attention's context parallelism cuts the whole packed stream "
                            f"contiguously (maskpack's 'ulysses' split); this bundle's ranks hold the {scheme!r} "
                            "split (reshard with maskpack.distributed.cp_reshard, or prepare it with "
                            "cp_scheme='ulysses')", "MASKPACK_ERR_UNSUPPORTED", argument="cp_scheme")
            if group is None:
                raise Error(f"group: under cp = {self.cp} flash-linear-attention's context needs the process group "
                            "(bundle.fla_kwargs(group=...))", "MASKPACK_ERR_INVALID_ARGUMENT", argument="group")
            return _above("gdn").fla_cp_kwargs(self.global_layout, group, scheme="ulysses", align=None,
                                               conv1d_kernel_size=conv1d_kernel_size, cp=self.cp, device=self._device)
        return {"cu_seqlens": self.global_layout.cu_seqlens_padded("int64", device=self._device or "cpu")}

    def as_dict(self) -> Dict[str, Any]:
        """The model-facing fields as a dict (None fields dropped); builds every derived field."""
        keys = ("input_ids", "inputs_embeds", "position_ids", "attention_mask", "attention_mask_2d", "labels",
                "shift_labels", "loss_weights", "cu_seqlens", "cu_seqlens_padded", "max_seqlen", "local_cu_seqlens",
                "last_token_index")
        d = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        for k, v in self.tokens.items():
            d.setdefault(k, v)
        if self.npu is not None:
            d["npu"] = self.npu
        return d

    def to(self, device: Any, non_blocking: bool = False) -> "Batch":
        """The bundle with every tensor on ``device`` (numpy arrays become torch tensors there; dicts
        such as ``npu`` are walked; layouts and scalars are kept). Fields not yet derived are built there
        when read. ``non_blocking`` as torch's ``Tensor.to``."""
        new = object.__new__(Batch)
        new.__dict__.update(self.__dict__)
        new.tokens = _to_device(self.tokens, device, non_blocking)
        new.passthrough = _to_device(self.passthrough, device, non_blocking)
        for k in ("attention_mask_2d", "attention_mask", "cu_seqlens", "cu_seqlens_padded", "local_cu_seqlens", "npu",
                  "_last_tokens"):
            if k in self.__dict__:
                new.__dict__[k] = _to_device(self.__dict__[k], device, non_blocking)
        new._device = device
        new.extras = dict(self.extras, device=device)
        return new

    def mtp_labels(self, depth: int):
        """Labels of a multi-token-prediction head at ``depth`` (1 = the first extra head): the batch's
        labels rolled by depth + 1 tokens inside each sequence (never across one), on this rank (the
        batch's own shift_labels, when it gave them, rolled by depth)."""
        base = self.extras["label_source"]
        shift = int(depth) + self.extras.get("label_shift", 1)
        rolled = self.source_layout.shift_labels(base, ignore_index=self.extras["ignore_index"], shift=shift)
        moved = rolled if self.layout is self.source_layout else relayout(
            rolled, self.source_layout, self.layout, pad_value=self.extras["ignore_index"])
        return self._place(moved)

    def to_padded(self, x: Any, parts: Optional[List[Any]] = None, pad_value: Any = 0, group: Any = None):
        """Output of the model step (per-token, this rank's layout) -> the dataloader's layout.
        Differentiable.

        cp = 1: ``x`` alone. Under CP the other ranks' tokens are needed, from one of:

        * ``group`` (a torch.distributed ProcessGroup): the gather is done here
          (:func:`maskpack.cp_all_gather`: its backward reduce-scatters, summing every rank's gradient);
        * ``parts``: every rank's output in rank order (e.g. from ``torch.distributed.all_gather``, whose
          results are detached). This rank's slot always takes the live ``x``, so the gradient reaches
          ``x`` whatever ``parts`` hold; ``parts[cp_rank]`` only has to have ``x``'s shape (its values,
          usually the gather's detached copy of ``x``, are not read). The other ranks' parts must have
          their shard's shape (their tokens, then ``x``'s trailing dims) and carry no gradient back
          unless they are live themselves (verl's post-processing: each rank trains its own tokens).
          A ``None`` part puts ``pad_value`` in that rank's tokens (``parts=[x if r == rank else None
          ...]`` places this rank's tokens only).

        Without ``parts`` or ``group`` under CP: :class:`maskpack.Error` naming ``parts`` (the result
        would hold only this rank's tokens)."""
        if group is not None and self.cp > 1:
            whole = _above("cp").cp_all_gather(x, self.global_layout, group, scheme=self.extras["cp_scheme"], align=None)
            return relayout(whole, self.global_layout, self.source_layout, pad_value=pad_value)
        if self.cp == 1:
            return relayout(x, self.layout, self.source_layout, pad_value=pad_value)
        if parts is None:
            raise Error(f"parts: under cp = {self.cp} this rank holds only its own tokens; pass parts= (every rank's "
                        f"output in rank order, e.g. from all_gather) or group= (a ProcessGroup: gathered here); "
                        f"parts=[x if r == rank else None, ...] places this rank's tokens only",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="parts")
        parts = list(parts)
        if len(parts) != self.cp:
            raise Error(f"parts: expected {self.cp} rank outputs, found {len(parts)}", "MASKPACK_ERR_SHAPE",
                        argument="parts")
        shards = [self.global_layout.cp_shard(self.cp, r, scheme=self.extras["cp_scheme"], align=None)
                  for r in range(self.cp)]
        local = self.layout._per_token_shape()
        xs = _shape(x)
        if xs[:len(local)] != local:
            raise Error(f"x: expected this rank's tokens {list(local)} leading, found {list(xs)}", "MASKPACK_ERR_SHAPE",
                        argument="x")
        trail = xs[len(local):]
        for r, p in enumerate(parts):
            want = shards[r]._per_token_shape() + trail
            if p is None:
                if r != self.cp_rank:
                    parts[r] = _full_like(x, want, pad_value)
                continue
            if _shape(p) != want:
                mine = " (this rank's slot, where x goes: x's shape)" if r == self.cp_rank else ""
                raise Error(f"parts: part {r}{mine} expected shape {list(want)}, found {list(_shape(p))}",
                            "MASKPACK_ERR_SHAPE", argument="parts", index=(r,))
        parts[self.cp_rank] = x  # the live output: its gradient flows whatever the gathered copy is
        return relayout(parts, shards, self.source_layout, pad_value=pad_value)

    def hf_kwargs(self, labels: bool = False, model: Any = None) -> Dict[str, Any]:
        """Keyword arguments for a transformers model's forward (``model(**bundle.hf_kwargs())``).
        Padded: input_ids (or inputs_embeds) and position_ids ``[B, S]`` and the 2D keep mask, whatever the
        backend (transformers builds its attention masks from it, and its Gated DeltaNet / Mamba layers need
        exactly that 2D mask: a 4D one reaches them as no mask at all). Padding-free: one packed row
        ``[1, T]`` with flash-attention's ``cu_seq_lens_q/k`` and ``max_length_q/k`` (which the flash
        kernels, maskpack's attention and maskpack-patched GDN layers read; sdpa/eager separate the
        sequences by the restarting position ids) and ``use_cache=False``. ``labels=True`` adds ``labels``
        and the bundle's ``shift_labels`` (transformers' loss then takes the shifted labels as they are,
        never shifting across a packed sequence boundary). Every other per-token key of the batch is passed
        on in the same shape.

        cp > 1 (padding-free): this rank's shard as one packed row ``[1, T_local]`` with the whole batch's
        layout (``maskpack_layout``) and the shard it is (``maskpack_cp``), for a model prepared with
        :func:`maskpack.hf.prepare_model` and a group of cp ranks (see :func:`maskpack.hf.cp_kwargs`);
        transformers' own attention runs no context parallelism, so without such a model (``model``, or
        when None any live model of the process) :class:`maskpack.Error` names ``cp``."""
        if self.cp != 1:
            return _above("hf").cp_kwargs(self, labels=labels, model=model)
        skip = {"labels", "shift_labels", "loss_weights"}
        if not self.padding_free:
            kw = {k: v for k, v in self.tokens.items() if k not in skip}
            kw["attention_mask"] = self._place(self.layout.mask2d("int64"))
            if labels:
                kw["labels"] = self.labels if self.labels is not None else self.shift_labels
                kw["shift_labels"] = self.shift_labels
            return kw
        import torch

        def row(v):  # [T, ...] -> [1, T, ...]; M-RoPE [3, T] -> [3, 1, T]
            return v[:, None] if v is self.position_ids and v.dim() == 2 and self.extras.get("mrope") else v[None]

        kw = {k: row(torch.as_tensor(v)) for k, v in self.tokens.items() if k not in skip}
        cu = _as_int32(self.cu_seqlens)
        kw.update({"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": self.max_seqlen,
                   "max_length_k": self.max_seqlen, "use_cache": False})
        if labels:
            lab = self.labels if self.labels is not None else self.shift_labels
            kw["labels"] = torch.as_tensor(lab)[None]
            kw["shift_labels"] = torch.as_tensor(self.shift_labels)[None]
        return kw


def _full_like(x: Any, shape: Tuple[int, ...], value: Any):
    """A tensor of ``shape`` filled with ``value``, of x's kind, dtype and device."""
    if is_torch_tensor(x):
        import torch

        return torch.full(shape, value, dtype=x.dtype, device=x.device)
    return np.full(shape, value, dtype=np.asarray(x).dtype)


def _max_slot(layout: Layout) -> int:
    cup = np.asarray(layout.cu_seqlens_padded("int64"))
    return int(np.diff(cup).max()) if cup.size > 1 else 0


def _as_int32(x):
    import torch

    return torch.as_tensor(x).to(torch.int32)


def _to_device(v: Any, device: Any, non_blocking: bool) -> Any:
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


# ---- reading the batch ------------------------------------------------------------------------


def _shape(x) -> Tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


def _host(x) -> np.ndarray:
    return np.asarray(x.detach().cpu() if is_torch_tensor(x) else x)


def _is_array(x: Any) -> bool:
    return is_torch_tensor(x) or isinstance(x, np.ndarray)


def _refuse_meta(key: str, x: Any) -> None:
    if is_torch_tensor(x) and x.device.type == "meta":
        raise Error(f"{key}: expected a tensor with values (on the host or an accelerator), found one on the meta "
                    f"device (a shape without values): prepare_batch reads and moves the batch's values",
                    "MASKPACK_ERR_UNSUPPORTED", argument=key)


def _is_integer(x: Any) -> bool:
    if is_torch_tensor(x):
        import torch

        return not (x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool)
    return x.dtype.kind in "iu"


def _token_grid(batch: Dict[str, Any]) -> Tuple[str, Tuple[int, ...], bool]:
    """(the key that carries the tokens, the token grid [B, S] or [T], whether the batch is one packed
    row) from input_ids (integer token ids), else inputs_embeds (whose last dim is the hidden size)."""
    if batch.get("input_ids") is not None:
        key = "input_ids"
    elif batch.get("inputs_embeds") is not None:
        key = "inputs_embeds"
    else:
        raise Error("batch: expected an 'input_ids' or an 'inputs_embeds' entry", "MASKPACK_ERR_NOT_FOUND",
                    argument="input_ids")
    x = batch[key]
    if not _is_array(x):
        raise Error(f"{key}: expected a torch tensor or a numpy array, found {type(x).__name__}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument=key)
    _refuse_meta(key, x)
    if key == "input_ids":
        if not _is_integer(x):
            raise Error(f"input_ids: expected integer token ids, found dtype {str(x.dtype).replace('torch.', '')}",
                        "MASKPACK_ERR_DTYPE", argument="input_ids")
        shape = _shape(x)
    else:
        shape = _shape(x)[:-1]
    if len(shape) == 1:
        return key, shape, True
    if len(shape) != 2:
        raise Error(f"{key}: expected token dims [B, S] or [T], found {list(shape)}", "MASKPACK_ERR_SHAPE", argument=key)
    return key, shape, shape[0] == 1


def _lengths_from_seq_idx(seq_idx) -> List[int]:
    s = _host(seq_idx).reshape(-1)
    if s.size == 0:
        return []
    starts = np.concatenate([[0], np.nonzero(np.diff(s) != 0)[0] + 1, [s.size]])
    return [int(n) for n in np.diff(starts)]


def _explicit_layouts(batch: Dict[str, Any], total: int, cu_form: str, rule: Dict[str, Any]) -> List[Tuple[str, Layout]]:
    """Every explicit description of packed segments the batch holds, as (key, layout)."""
    out = []
    if batch.get("cu_seqlens") is not None:
        out.append(("cu_seqlens", Layout.from_cu_seqlens(batch["cu_seqlens"], form=cu_form, total=total,
                                                         cu_padded=batch.get("cu_seqlens_padded"), **rule)))
    if batch.get("cu_seq_lens_q") is not None:
        q = batch["cu_seq_lens_q"]
        k = batch.get("cu_seq_lens_k")
        if k is not None and not np.array_equal(_host(q), _host(k)):
            qa, ka = _host(q).reshape(-1), _host(k).reshape(-1)
            n = min(qa.size, ka.size)
            i = int(np.nonzero(qa[:n] != ka[:n])[0][0]) if (qa[:n] != ka[:n]).any() else n
            raise Error(f"cu_seq_lens_k: expected the queries' offsets (a self-attention batch), found entry {i} = "
                        f"{ka[i] if i < ka.size else 'missing'} where cu_seq_lens_q has "
                        f"{qa[i] if i < qa.size else 'none'}", "MASKPACK_ERR_VALUE", argument="cu_seq_lens_k", index=(i,))
        out.append(("cu_seq_lens_q", Layout.from_cu_seqlens(q, form="te", total=total, **rule)))
    if batch.get("seq_idx") is not None:
        out.append(("seq_idx", Layout.from_lengths(_lengths_from_seq_idx(batch["seq_idx"]), placement="packed",
                                                   **rule)))
    return out


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
    d = np.nonzero(a != b)[0]
    return int(d[0]) if d.size else -1


def _check_positions(lay: Layout, text, what: str, mrope: bool) -> None:
    """Given position ids agree with a layout's segments when they advance by one inside every segment
    and do not run on across a boundary between two segments of a row. M-RoPE ids (``text``: the first
    plane, temporal) stand still over an image and jump after it: inside a segment they only never
    decrease."""
    p = _host(text).reshape(lay._per_token_shape()).astype(np.int64)
    grid = p.reshape(lay.n_rows, -1) if not lay.packed else p.reshape(1, -1)
    width = grid.shape[1]
    segs = lay.segments
    for k, (row, qs, ql, _ks, _kl) in enumerate(segs):
        adjacent = k > 0 and segs[k - 1][0] == row and segs[k - 1][1] + segs[k - 1][2] == qs
        if not mrope and adjacent and ql and grid[row, qs] == grid[row, qs - 1] + 1:
            t = row * width + qs
            raise Error(f"position_ids: disagree with {what} at token {t}: {what} starts sequence {k} there, the "
                        f"position ids run on ({int(grid[row, qs - 1])} -> {int(grid[row, qs])})",
                        "MASKPACK_ERR_VALUE", argument="position_ids", index=(t,))
        seg = grid[row, qs:qs + ql]
        step = np.diff(seg)
        bad = np.nonzero(step < 0 if mrope else step != 1)[0]
        if bad.size:
            t = row * width + qs + int(bad[0]) + 1
            raise Error(f"position_ids: disagree with {what} at token {t}: position {int(seg[bad[0] + 1])} follows "
                        f"{int(seg[bad[0]])} inside sequence {k}", "MASKPACK_ERR_VALUE", argument="position_ids",
                        index=(t,))


def _source_layout(batch: Dict[str, Any], mask_convention: Optional[str], cu_form: str, position_rule: str,
                   rule: Dict[str, Any], pos: Any = None, mrope: bool = False,
                   tail_padding: bool = True) -> Tuple[Layout, str]:
    """The dataloader's layout and the key that described it. Explicit segment offsets (cu_seqlens,
    cu_seq_lens_q, seq_idx) come first; then, for one packed row, the position ids; then the attention
    mask; then position ids of a padded batch; else every row is one sequence. Every other description
    present is checked against the chosen one. ``pos``: the position ids' text row (the first M-RoPE
    plane) in the token grid's shape ([T] for one row), from :func:`_positions`. ``tail_padding``:
    explicit offsets that end before the row does leave the tail as padding; otherwise that is an error
    unless an attention_mask or cu_seqlens_padded says so (prepare_batch's default)."""
    key, grid, one_row = _token_grid(batch)
    total = grid[-1]
    torch_in = is_torch_tensor(batch[key])
    explicit = _explicit_layouts(batch, total, cu_form, rule)
    mask = batch.get("attention_mask")
    if explicit:
        name, lay = explicit[0]
        if not one_row:
            raise Error(f"{name}: describes one packed row, but {key} has {grid[0]} rows", "MASKPACK_ERR_SHAPE",
                        argument=name)
        seg = np.asarray(lay.with_outputs("numpy").segment_ids())
        for other, lay2 in explicit[1:]:
            s2 = np.asarray(lay2.with_outputs("numpy").segment_ids())
            t = _first_difference(seg, s2) if s2.shape == seg.shape else min(seg.size, s2.size)
            if t >= 0:
                raise Error(f"{other}: disagrees with {name} at token {t} (sequence {int(s2[t]) - 1 if t < s2.size else '?'} "
                            f"vs {int(seg[t]) - 1 if t < seg.size else '?'}; -1 = padding)", "MASKPACK_ERR_VALUE",
                            argument=other, index=(t,))
        if not tail_padding and mask is None and batch.get("cu_seqlens_padded") is None:
            # offsets that stop short of the row would silently make its tail padding: a dataloader
            # that dropped a sequence's offsets must not train on a batch missing it
            covered = int(lay.n_tokens)
            if covered < total:
                raise Error(f"{name}: the offsets cover tokens [0, {covered}) of the row's {total}; tokens from "
                            f"{covered} on belong to no sequence (pass tail_padding=True if they are padding, or an "
                            f"attention_mask)", "MASKPACK_ERR_VALUE", argument=name, index=(covered,))
        if pos is not None:
            _check_positions(lay, pos, name, mrope)
        source = lay, name
    elif pos is not None and one_row and (mask is None or (len(mask.shape) == 2 and _host(mask).astype(bool).all())):
        # one packed row (a mask, if any, marks every token real: it carries no segments); M-RoPE
        # [3, 1, T] / [3, T]: the boundaries come from the first plane's restarts, as for [3, B, S]
        mask = None
        source = Layout.from_position_ids(pos, rule=position_rule, **rule), "position_ids"
    elif mask is not None:
        ndim = len(mask.shape)
        if ndim == 2:
            lay = Layout.from_mask2d(mask, convention=mask_convention or "keep", **rule)
        elif ndim == 4:
            if mask_convention not in ("keep", "masked", "additive"):
                raise Error("mask_convention: a 4D attention_mask needs its convention stated ('keep', 'masked' or "
                            f"'additive'); found {mask_convention!r} (an unannotated mask is never guessed)",
                            "MASKPACK_ERR_CONVENTION", argument="mask_convention")
            lay = Layout.from_mask4d(mask, convention=mask_convention)
            lay = lay.with_rule(**rule) if rule else lay
        else:
            raise Error(f"attention_mask: expected [B,S] or [B,1,S,S], found {ndim} dimensions", "MASKPACK_ERR_SHAPE",
                        argument="attention_mask")
        if pos is not None and ndim == 2:
            _check_positions(lay, pos, "attention_mask", mrope)
        return lay, "attention_mask"
    elif pos is not None:  # M-RoPE [3, B, S]: the text row (first plane) decides
        return Layout.from_position_ids(pos, rule=position_rule, **rule), "position_ids"
    else:
        lay = Layout.from_lengths([grid[-1]] * (grid[0] if len(grid) == 2 else 1),
                                  placement="packed" if len(grid) == 1 else "right", **rule)
        return (lay.with_outputs("torch") if torch_in else lay), key
    lay, name = source
    if mask is not None and len(mask.shape) == 2:  # a mask beside packed segments: the same real tokens
        m = _host(mask).reshape(-1).astype(bool)
        real = np.asarray(lay.with_outputs("numpy").mask2d()).reshape(-1)
        t = _first_difference(m, real) if m.shape == real.shape else 0
        if t >= 0:
            raise Error(f"attention_mask: disagrees with {name} at token {t} (mask {bool(m[t]) if t < m.size else '?'}, "
                        f"{name}: {'token' if t < real.size and real[t] else 'padding'})", "MASKPACK_ERR_VALUE",
                        argument="attention_mask", index=(t,))
    return (lay.with_outputs("torch") if torch_in else lay), name


def _grid_forms(grid: Tuple[int, ...], one_row: bool) -> str:
    """The token grid's shape as an error message writes it ([T] and [1, T] alike for one row)."""
    if not one_row:
        return str(list(grid))
    return f"[{grid[-1]}] or [1, {grid[-1]}]"


def _grid_lead(s: Tuple[int, ...], grid: Tuple[int, ...], one_row: bool, either: bool) -> int:
    """How many leading dims of shape ``s`` are the token grid (0: they are not). ``either``: for one
    row, [T, ...] and [1, T, ...] both count, whichever the token key used."""
    if s[:len(grid)] == tuple(grid):
        return len(grid)
    if either and one_row:
        T = grid[-1]
        if len(grid) == 2 and s[:1] == (T,):
            return 1
        if len(grid) == 1 and s[:2] == (1, T):
            return 2
    return 0


def _token_tensor(x: Any, layout: Layout, grid: Tuple[int, ...], one_row: bool = False,
                  either: bool = False) -> Optional[Any]:
    """The key's tensor with the layout's token dims leading ([1, T, ...] read as [T, ...]), or None
    when its leading dims are not the batch's token grid (then it passes through)."""
    if not _is_array(x):
        return None
    s = _shape(x)
    lead = _grid_lead(s, grid, one_row, either)
    if not lead:
        return None
    want = layout._per_token_shape() + s[lead:]
    return x if s == want else x.reshape(want)


def _require_per_token(key: str, x: Any, tok_key: str, grid: Tuple[int, ...], one_row: bool, exact: bool) -> None:
    """A key that is per-token by name (labels, shift_labels, ``per_token_keys``) must have the token
    grid's shape (``exact``: nothing after it): otherwise an error, never a pass-through."""
    if not _is_array(x):
        raise Error(f"{key}: expected a tensor of the token grid's shape {_grid_forms(grid, one_row)} (as {tok_key}), "
                    f"found {type(x).__name__}", "MASKPACK_ERR_INVALID_ARGUMENT", argument=key)
    _refuse_meta(key, x)
    s = _shape(x)
    lead = _grid_lead(s, grid, one_row, True)
    if lead and (not exact or len(s) == lead):
        return
    if lead:
        d = lead
    else:
        d = next((i for i, (a, b) in enumerate(zip(s, grid)) if a != b), min(len(s), len(grid)))
    then = "" if exact else ", then any per-token dims"
    raise Error(f"{key}: expected the token grid's shape {_grid_forms(grid, one_row)} (as {tok_key}){then}, found "
                f"{list(s)} (dimension {d}); a per-token key never passes through", "MASKPACK_ERR_SHAPE",
                argument=key, index=(d,))


def _per_token_key_set(per_token_keys: Any) -> Tuple[str, ...]:
    """``per_token_keys`` checked: None or a sequence of key names."""
    if per_token_keys is None:
        return ()
    if isinstance(per_token_keys, (str, bytes)) or not all(isinstance(k, str) for k in per_token_keys):
        raise Error(f"per_token_keys: expected a list of key names, found {per_token_keys!r}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="per_token_keys")
    return tuple(per_token_keys)


def _check_layout_shapes(batch: Dict[str, Any], tok_key: str, grid: Tuple[int, ...]) -> None:
    """attention_mask and seq_idx must cover the token grid (an error naming them, not a reshape failure)."""
    B, S = (1, grid[0]) if len(grid) == 1 else grid
    mask = batch.get("attention_mask")
    if _is_array(mask):
        s = _shape(mask)
        if len(s) == 4:
            ok = s[0] == B and s[3] == S and s[2] in (S, 1)
            want = f"[{B}, 1 or heads, {S}, {S}] (or [{B}, 1, 1, {S}])"
        else:
            ok = len(s) != 2 or s == (B, S)
            want = f"[{B}, {S}]"
        if not ok:
            raise Error(f"attention_mask: expected {want} for {tok_key} of shape {list(grid)}, found {list(s)}",
                        "MASKPACK_ERR_SHAPE", argument="attention_mask")
    seq_idx = batch.get("seq_idx")
    if _is_array(seq_idx) and B == 1 and _shape(seq_idx) not in ((S,), (1, S)):
        raise Error(f"seq_idx: expected [{S}] or [1, {S}] for {tok_key} of shape {list(grid)}, found "
                    f"{list(_shape(seq_idx))}", "MASKPACK_ERR_SHAPE", argument="seq_idx")


def _positions(pos: Any, grid: Tuple[int, ...], one_row: bool) -> Tuple[Any, Any]:
    """Position ids in any documented form -> (the text row in the token grid's shape, [T] for one row;
    every plane [P, *grid] for M-RoPE, else None). Forms: [B, S] / [T] / [1, T]; M-RoPE [P, B, S], and
    for one packed row [P, 1, T] / [P, T] (P != 1). The text row is the first plane."""
    if not _is_array(pos):
        raise Error(f"position_ids: expected a tensor, found {type(pos).__name__}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="position_ids")
    _refuse_meta("position_ids", pos)
    s = _shape(pos)
    if one_row:
        T = grid[-1]
        if s in ((T,), (1, T)):
            return pos.reshape(T), None
        if len(s) == 3 and s[1:] == (1, T) or len(s) == 2 and s[1] == T and s[0] != 1:
            planes = pos.reshape(s[0], T)
            return planes[0], planes
        forms = f"[{T}], [1, {T}] or M-RoPE [3, 1, {T}] / [3, {T}]"
    else:
        if s == tuple(grid):
            return pos, None
        if len(s) == 3 and s[1:] == tuple(grid):
            return pos[0], pos
        forms = f"{list(grid)} or M-RoPE [3, {grid[0]}, {grid[1]}]"
    raise Error(f"position_ids: expected {forms} (the token grid), found {list(s)}", "MASKPACK_ERR_SHAPE",
                argument="position_ids")


def prepare_batch(batch: Dict[str, Any], backend: str = "flash_attn", padding_free: bool = False, tp: int = 1,
                  cp: int = 1, cp_rank: int = 0, *, cp_scheme: str = "zigzag", align: Optional[str] = "verl",
                  input_layout: Optional[str] = None, head_dim: Optional[int] = None, scale: Optional[float] = None,
                  mask_convention: Optional[str] = None, cu_form: str = "te", position_rule: str = "reset",
                  ignore_index: int = -100, loss_mode: str = "token", pad_token_id: int = 0,
                  mask_dtype: Any = "float32", recompute_position_ids: bool = False, max_seqlen: Optional[int] = None,
                  pad_to_multiple_of: Optional[int] = None, per_token_keys: Optional[Sequence[str]] = None,
                  tail_padding: bool = False, **rule: Any) -> Batch:
    """A dataloader batch dict and a target -> :class:`Batch` (derived fields built on first access).

    The batch gives the tokens (input_ids: integer ids, or inputs_embeds) and their segments in any of
    the forms dataloaders use: attention_mask (2D, or 4D with ``mask_convention``), cu_seqlens
    (``cu_form``), transformers' cu_seq_lens_q/k, seq_idx, position_ids ([T], [1,T], [B,S], M-RoPE
    [3,B,S], and for one packed row [3,1,T] / [3,T]: boundaries from the first plane's restarts).
    Descriptions that disagree raise :class:`maskpack.Error` naming the first token where they do.
    Offsets (cu_seqlens, cu_seq_lens_q) that end before the packed row does are an error naming them,
    unless an attention_mask or cu_seqlens_padded marks the rest as padding or ``tail_padding=True``
    says it is.

    Which keys are per-token (moved with the tokens into ``bundle.tokens``) and which pass through
    (``bundle.passthrough``, listed in ``bundle.passthrough_keys``): ``labels``, ``shift_labels`` and
    every key named in ``per_token_keys`` are per-token by name and must have the token grid's shape
    (labels and shift_labels exactly; the others may add dims after it; for one packed row [T] and
    [1, T] are one grid): otherwise :class:`maskpack.Error` naming the key with the expected and found
    shapes, never a pass-through. A named key absent from the batch is fine. Any other key is per-token
    when its leading dims are the token grid (the shape of input_ids, or inputs_embeds without its
    hidden size) and passes through untouched otherwise.

    labels are optional (the loss then predicts input_ids). ``shift_labels`` given by the batch are the
    bundle's shifted labels (loss weights from them); given with labels they must equal labels shifted
    inside each sequence at every real token.

    backend: which attention the model runs, deciding what ``bundle.attention_mask`` is (built only
    when read): "flash_attn", "sdpa", "eager" (additive in ``mask_dtype``), "npu" (arguments in
    ``bundle.npu``; TND when padding_free, BSND otherwise; ``head_dim`` or ``scale`` required),
    "megatron", "mindspeed" (Ascend MindSpeed: no dense mask for causal attention, the 2D keep mask kept for
    Gated DeltaNet, NPU-form sequence ends in ``bundle.mindspeed_kwargs()``, slots padded to MindSpeed's
    ``lcm(2, tp) * cp``: ``align="minimal"`` in place of the default). The rule (causal=True, window=...,
    spans=..., prefix=...) applies to every backend alike.
    ``max_seqlen`` forces the value reported to kernels; ``pad_to_multiple_of`` pads the token count (each
    rank's, under CP) to a multiple, at the end of the packed stream (or the row width when padded), for
    kernels such as FP8 GEMMs that need it."""
    if backend not in BACKENDS:
        raise Error(f"backend: expected one of {', '.join(BACKENDS)}, found {backend!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="backend")
    cp, tp, cp_rank = int(cp), int(tp), int(cp_rank)
    if cp < 1:
        raise Error(f"cp: expected a context-parallel size >= 1, found {cp}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="cp")
    if not 0 <= cp_rank < cp:
        raise Error(f"cp_rank: expected in [0, {cp}), found {cp_rank}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="cp_rank")
    if backend == "npu" and head_dim is None and scale is None:
        raise Error("head_dim: the NPU operator defaults scale to 1.0; pass head_dim (for 1/sqrt(head_dim)) or scale",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="head_dim")
    named = ("labels", "shift_labels") + tuple(k for k in _per_token_key_set(per_token_keys)
                                               if k not in ("labels", "shift_labels"))
    key, grid, one_row = _token_grid(batch)
    # every check of the batch before anything is read or built: layout keys, per-token keys by name
    for k in _LAYOUT_KEYS:
        _refuse_meta(k, batch.get(k))
    for k in named:
        if batch.get(k) is not None:
            _require_per_token(k, batch[k], key, grid, one_row, exact=k in _LABEL_KEYS)
    _check_layout_shapes(batch, key, grid)
    pos = batch.get("position_ids")
    pos_text, pos_planes = _positions(pos, grid, one_row) if pos is not None else (None, None)
    src, _described_by = _source_layout(batch, mask_convention, cu_form, position_rule, rule, pos_text,
                                        pos_planes is not None, tail_padding=bool(tail_padding))
    target = src.packed_of() if padding_free else src
    # one padding rule (cp_multiple): zigzag halves and sequence parallelism at cp > 1, tp alone at cp = 1;
    # align=None pads nothing (every slot must already divide, as cp_shard(align=None) requires)
    if backend == "mindspeed" and align == "verl":
        align = "minimal"  # MindSpeed's pad_data: each slot a multiple of lcm(2, tp) * cp
    multiple = 1 if align is None else cp_multiple(cp, tp, align)
    if cp == 1 and not padding_free:
        multiple = 1  # a padded batch at cp = 1 runs as given
    if cp_scheme == "ulysses" and cp > 1:  # only the total is padded, at the end; the stream is cut evenly
        glob = target._cp_global(cp, tp, "verl" if align is None else align, "ulysses")
    else:
        glob = target.pad_to_multiple(multiple) if multiple > 1 else target
    if pad_to_multiple_of is not None and int(pad_to_multiple_of) > 1:
        # token counts in multiples (FP8 GEMMs): the stream's end padded so every rank's part divides
        m = int(pad_to_multiple_of) * (cp if cp_scheme == "ulysses" else 2 * cp if cp > 1 else 1)
        glob = glob.pad_total_to_multiple(m) if padding_free else glob.pad_to_multiple(m)
    local = glob.cp_shard(cp, cp_rank, scheme=cp_scheme, align=None) if cp > 1 else glob

    # the split: per-token by name (checked above) or by shape; the rest passes through untouched
    per_token: Dict[str, Any] = {}
    passthrough: Dict[str, Any] = {}
    for k, v in batch.items():
        if k in _LAYOUT_KEYS or v is None:  # read as the layout (position ids are moved below)
            continue
        t = _token_tensor(v, src, grid, one_row, either=k in named)
        if t is None:
            passthrough[k] = v
            continue
        _refuse_meta(k, v)
        per_token[k] = t
    tokens: Dict[str, Any] = {}
    for k, t in per_token.items():
        pad = ignore_index if k in _LABEL_KEYS else (pad_token_id if k == "input_ids" else 0)
        tokens[k] = _move(t, src, local, pad)
    labels_src = per_token.get("labels")
    base = labels_src if labels_src is not None else (per_token[key] if key == "input_ids" else None)
    given_shift = per_token.get("shift_labels")
    if base is None and given_shift is None:
        raise Error("labels: a batch of inputs_embeds needs labels (there are no input_ids to predict)",
                    "MASKPACK_ERR_NOT_FOUND", argument="labels")
    if given_shift is not None:  # the batch's own shifted labels are the loss's targets
        if labels_src is not None:
            _check_shift_labels(src, labels_src, given_shift, ignore_index)
        shifted, base, label_shift = given_shift, given_shift, 0
    else:
        shifted, label_shift = src.shift_labels(base, ignore_index=ignore_index), 1
    weights, denom = src.loss_weights(loss_mode, labels=shifted, ignore_index=ignore_index, dtype="float32",
                                      return_denominator=True)
    tokens["shift_labels"] = _move(shifted, src, local, ignore_index)
    tokens["loss_weights"] = _move(weights, src, local, 0)
    mrope = False
    if pos is not None and not recompute_position_ids:
        if pos_planes is not None:  # M-RoPE: move the token dims, keep the planes
            mrope = True
            p = pos_planes.reshape((pos_planes.shape[0],) + src._per_token_shape())
            moved = _move(_movedim(p, 0, -1), src, local, 0)
            tokens["position_ids"] = _movedim(moved, -1, 0)
        else:
            tokens["position_ids"] = _move(pos_text.reshape(src._per_token_shape()), src, local, 0)
    else:
        tokens["position_ids"] = local.position_ids()
    options = {"cp_scheme": cp_scheme, "tp": tp, "align": align, "mask_dtype": mask_dtype, "input_layout": input_layout,
               "head_dim": head_dim, "scale": scale, "ignore_index": ignore_index, "max_seqlen": max_seqlen,
               "mrope": mrope, "described_by": _described_by, "label_source": base, "label_shift": label_shift}
    return Batch(backend=backend, padding_free=padding_free, cp=cp, cp_rank=cp_rank, layout=local, global_layout=glob,
                 source_layout=src, tokens=tokens, passthrough=passthrough, loss_denominator=denom, options=options)


def _check_shift_labels(src: Layout, labels, given, ignore_index: int) -> None:
    """shift_labels given beside labels: they must be labels shifted inside each sequence (at every real
    token), or the two describe different targets."""
    want = _host(src.shift_labels(labels, ignore_index=ignore_index)).reshape(-1)
    got = _host(given).reshape(-1)
    real = np.asarray(src.with_outputs("numpy").mask2d()).reshape(-1).astype(bool)
    bad = np.nonzero(real & (want != got))[0]
    if bad.size:
        t = int(bad[0])
        raise Error(f"shift_labels: disagree with labels shifted inside each sequence at token {t}: expected "
                    f"{int(want[t])}, found {int(got[t])}", "MASKPACK_ERR_VALUE", argument="shift_labels", index=(t,))


def _move(x, src: Layout, dst: Layout, pad: Any):
    """x from the dataloader's layout to this rank's; no copy when they are one layout (a packed batch at
    cp = 1: the bundle then shares the batch's tensors)."""
    return x if dst is src else relayout(x, src, dst, pad_value=pad)


def _movedim(x, a: int, b: int):
    if is_torch_tensor(x):
        return x.movedim(a, b).contiguous()
    return np.ascontiguousarray(np.moveaxis(x, a, b))
