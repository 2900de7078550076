"""maskpack.prepare_batch: from a dataloader's batch and a training target, everything the model step
needs, derived from one layout so that no two consumers can disagree (docs/conventions.md).

    bundle = maskpack.prepare_batch(batch, padding_free=True, cp=2, cp_rank=rank)
    out = model(**bundle.hf_kwargs())                        # or flash_attn_kwargs(), sdpa_mask(), ...
    loss = (per_token_loss * bundle.loss_weights).sum()      # all-reduce(sum) over CP ranks = exact mean
    logits = bundle.to_padded(out.logits, parts=all_ranks_logits)   # back to the dataloader's layout

What the batch hands over is read in every form dataloaders use (attention_mask 2D or 4D, cu_seqlens,
transformers' cu_seq_lens_q/k, seq_idx, position_ids [T], [1,T], [B,S] and M-RoPE [3,B,S] / [3,1,T],
input_ids or inputs_embeds); where two of them describe the segments differently, an error names the
first token where they disagree. Every per-token key moves with the tokens; a key that cannot be placed
passes through and is listed. Fields a consumer reads (dense masks, NPU arguments, offsets) are derived
on first access: nothing is built that nobody reads.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ._errors import Error
from ._layout import Layout
from ._moves import cp_multiple, relayout
from ._tensors import is_torch_tensor

BACKENDS = ("flash_attn", "sdpa", "eager", "npu", "megatron")

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
    :meth:`flex_block_mask`, :meth:`npu_kwargs`."""

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
        return self.tokens.get("input_ids")

    @property
    def inputs_embeds(self):
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
        return self.npu["atten_mask"]

    @functools.cached_property
    def cu_seqlens(self):
        """TE / flash-attn cu_seqlens of the global layout (TE's THD CP convention); None when padded."""
        return self._place(self.global_layout.cu_seqlens("te")) if self.padding_free else None

    @functools.cached_property
    def cu_seqlens_padded(self):
        return self._place(self.global_layout.cu_seqlens_padded()) if self.padding_free else None

    @functools.cached_property
    def max_seqlen(self) -> int:
        """The longest sequence a kernel must size for: the longest real sequence at cp = 1; under
        context parallelism the longest *padded* slot (TransformerEngine divides it by cp and 2cp to
        size per-rank work; verl, Megatron-Bridge and TE's own default use the padded slot), unless
        ``max_seqlen=`` forced a value."""
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

    def npu_kwargs(self) -> Dict[str, Any]:
        """Exactly the keyword arguments of ``torch_npu.npu_fusion_attention`` (no diagnostics), spelled
        as torch_npu spells them (``pre_tockens``, ``next_tockens``)."""
        args = self.npu if self.npu is not None else self._npu_args()
        return {k: v for k, v in args.items() if not k.startswith("maskpack_")}

    def flash_attn_kwargs(self) -> Dict[str, Any]:
        """flash_attn_varlen_func's segment arguments: cu_seqlens_q/k (int32) and max_seqlen_q/k
        (padding-free); the 2D keep mask for the padded path (flash-attn's unpad_input)."""
        if not self.padding_free:
            return {"attention_mask": self._place(self.layout.mask2d("int64"))}
        cu = _as_int32(self.cu_seqlens)
        return {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": self.max_seqlen,
                "max_seqlen_k": self.max_seqlen}

    def megatron_packed_seq_params(self, as_object: bool = False):
        """The fields of Megatron-core's ``PackedSeqParams`` for THD (padding-free): qkv_format "thd",
        cu_seqlens_q/kv (real lengths), cu_seqlens_q/kv_padded (slots), max_seqlen_q/kv (the longest
        padded slot, as Megatron-Bridge sets it). ``as_object=True`` builds the class itself (needs
        megatron.core)."""
        if not self.padding_free:
            raise Error("padding_free: PackedSeqParams describe a THD (padding-free) batch; this bundle is padded",
                        "MASKPACK_ERR_UNSUPPORTED", argument="padding_free")
        cu, cup = _as_int32(self.cu_seqlens), _as_int32(self.cu_seqlens_padded)
        m = _max_slot(self.global_layout) if self.extras.get("max_seqlen") is None else int(self.extras["max_seqlen"])
        fields = {"qkv_format": "thd", "cu_seqlens_q": cu, "cu_seqlens_kv": cu, "cu_seqlens_q_padded": cup,
                  "cu_seqlens_kv_padded": cup, "max_seqlen_q": m, "max_seqlen_kv": m}
        if not as_object:
            return fields
        from megatron.core.packed_seq_params import PackedSeqParams

        return PackedSeqParams(**fields)

    def fla_kwargs(self) -> Dict[str, Any]:
        """What flash-linear-attention's ``chunk_gated_delta_rule`` and ``causal_conv1d`` take for packed
        rows: ``cu_seqlens`` (int64, the one packed row of this rank's tokens; inputs shaped [1, T, ...]);
        padded: the 2D keep mask its layers unpad with."""
        if not self.padding_free:
            return {"attention_mask": self._place(self.layout.mask2d("int64"))}
        if self.cp != 1:
            raise Error(f"cp: flash-linear-attention's packed rows hold whole sequences; found cp = {self.cp}",
                        "MASKPACK_ERR_UNSUPPORTED", argument="cp")
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
        labels rolled by depth + 1 tokens inside each sequence (never across one), on this rank."""
        base = self.extras["label_source"]
        rolled = self.source_layout.shift_labels(base, ignore_index=self.extras["ignore_index"], shift=int(depth) + 1)
        moved = rolled if self.layout is self.source_layout else relayout(
            rolled, self.source_layout, self.layout, pad_value=self.extras["ignore_index"])
        return self._place(moved)

    def to_padded(self, x: Any, parts: Optional[List[Any]] = None, pad_value: Any = 0, group: Any = None):
        """Output of the model step (per-token, this rank's layout) -> the dataloader's layout. Under CP,
        pass every rank's output in rank order as ``parts`` (e.g. from an all_gather) to reassemble the
        whole batch, or ``group`` (a torch.distributed ProcessGroup) to have the gather done here
        (:func:`maskpack.cp_all_gather`: backward reduce-scatters); without either only this rank's
        tokens are placed and the rest is pad_value. Differentiable."""
        if group is not None and self.cp > 1:
            from .distributed import cp_all_gather

            whole = cp_all_gather(x, self.global_layout, group, scheme=self.extras["cp_scheme"], align=None)
            return relayout(whole, self.global_layout, self.source_layout, pad_value=pad_value)
        if self.cp == 1 or parts is None:
            return relayout(x, self.layout, self.source_layout, pad_value=pad_value)
        if len(parts) != self.cp:
            raise Error(f"parts: expected {self.cp} rank outputs, found {len(parts)}", "MASKPACK_ERR_SHAPE",
                        argument="parts")
        shards = [self.global_layout.cp_shard(self.cp, r, scheme=self.extras["cp_scheme"], align=None)
                  for r in range(self.cp)]
        return relayout(list(parts), shards, self.source_layout, pad_value=pad_value)

    def hf_kwargs(self, labels: bool = False) -> Dict[str, Any]:
        """Keyword arguments for a transformers model's forward (``model(**bundle.hf_kwargs())``),
        one rank (cp = 1: transformers models do no context parallelism). Padded: input_ids (or
        inputs_embeds) and position_ids ``[B, S]`` and the 2D keep mask, whatever the backend
        (transformers builds its attention masks from it, and its Gated DeltaNet / Mamba layers need
        exactly that 2D mask: a 4D one reaches them as no mask at all). Padding-free: one packed row
        ``[1, T]`` with flash-attention's ``cu_seq_lens_q/k`` and ``max_length_q/k`` (which the flash
        kernels and maskpack-patched GDN layers read; sdpa/eager separate the sequences by the
        restarting position ids) and ``use_cache=False``. ``labels=True`` adds ``labels`` and the
        bundle's ``shift_labels`` (transformers' loss then takes the shifted labels as they are, never
        shifting across a packed sequence boundary). Every other per-token key of the batch is passed
        on in the same shape."""
        if self.cp != 1:
            raise Error(f"cp: transformers models run no context parallelism; hf_kwargs needs cp = 1, found {self.cp}",
                        "MASKPACK_ERR_UNSUPPORTED", argument="cp")
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


def _token_grid(batch: Dict[str, Any]) -> Tuple[str, Tuple[int, ...], bool]:
    """(the key that carries the tokens, the token grid [B, S] or [T], whether the batch is one packed
    row) from input_ids, else inputs_embeds (whose last dim is the hidden size)."""
    if batch.get("input_ids") is not None:
        key, shape = "input_ids", _shape(batch["input_ids"])
    elif batch.get("inputs_embeds") is not None:
        key, shape = "inputs_embeds", _shape(batch["inputs_embeds"])[:-1]
    else:
        raise Error("batch: expected an 'input_ids' or an 'inputs_embeds' entry", "MASKPACK_ERR_NOT_FOUND",
                    argument="input_ids")
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


def _check_positions(lay: Layout, pos, what: str) -> None:
    """Given position ids agree with a layout's segments when they advance by one inside every segment
    and do not run on across a boundary between two segments of a row. M-RoPE ids (row 0, temporal)
    stand still over an image and jump after it: inside a segment they only never decrease."""
    p = _host(pos)
    mrope = p.ndim == 3 or (p.ndim == 2 and lay.packed and p.shape[0] == 3)
    if mrope:
        p = p[0]
    p = p.reshape(lay._per_token_shape()).astype(np.int64)
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
                   rule: Dict[str, Any]) -> Tuple[Layout, str]:
    """The dataloader's layout and the key that described it. Explicit segment offsets (cu_seqlens,
    cu_seq_lens_q, seq_idx) come first; then, for one packed row, the position ids; then the attention
    mask; then position ids of a padded batch; else every row is one sequence. Every other description
    present is checked against the chosen one."""
    key, grid, one_row = _token_grid(batch)
    total = grid[-1]
    torch_in = is_torch_tensor(batch[key])
    explicit = _explicit_layouts(batch, total, cu_form, rule)
    pos = batch.get("position_ids")
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
        if pos is not None:
            _check_positions(lay, pos, name)
        source = lay, name
    elif pos is not None and one_row and (mask is None or (len(mask.shape) == 2 and _host(mask).astype(bool).all())):
        # one packed row (a mask, if any, marks every token real: it carries no segments)
        mask = None
        p = pos
        ps = _shape(p)
        if len(ps) == 3:  # M-RoPE [3, 1, T]
            p = p[:, 0]
        elif len(ps) == 2 and ps[0] == 1:
            p = p[0]
        source = Layout.from_position_ids(p, rule=position_rule, **rule), "position_ids"
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
            _check_positions(lay, pos, "attention_mask")
        return lay, "attention_mask"
    elif pos is not None:
        p = pos[0] if len(_shape(pos)) == 3 else pos  # M-RoPE [3, B, S]: the text row decides
        return Layout.from_position_ids(p, rule=position_rule, **rule), "position_ids"
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


def _token_tensor(x: Any, layout: Layout, grid: Tuple[int, ...]) -> Optional[Any]:
    """The key's tensor with the layout's token dims leading ([1, T, ...] read as [T, ...]), or None
    when its leading dims are not the batch's token grid (then it passes through)."""
    if not (is_torch_tensor(x) or isinstance(x, np.ndarray)):
        return None
    s = _shape(x)
    if s[:len(grid)] != tuple(grid):
        return None
    if layout.packed and len(grid) == 2:
        return x[0]
    return x


def prepare_batch(batch: Dict[str, Any], backend: str = "flash_attn", padding_free: bool = False, tp: int = 1,
                  cp: int = 1, cp_rank: int = 0, *, cp_scheme: str = "zigzag", align: Optional[str] = "verl",
                  input_layout: Optional[str] = None, head_dim: Optional[int] = None, scale: Optional[float] = None,
                  mask_convention: Optional[str] = None, cu_form: str = "te", position_rule: str = "reset",
                  ignore_index: int = -100, loss_mode: str = "token", pad_token_id: int = 0,
                  mask_dtype: Any = "float32", recompute_position_ids: bool = False, max_seqlen: Optional[int] = None,
                  pad_to_multiple_of: Optional[int] = None, **rule: Any) -> Batch:
    """A dataloader batch dict and a target -> :class:`Batch` (derived fields built on first access).

    The batch gives the tokens (input_ids, or inputs_embeds) and their segments in any of the forms
    dataloaders use: attention_mask (2D, or 4D with ``mask_convention``), cu_seqlens (``cu_form``),
    transformers' cu_seq_lens_q/k, seq_idx, position_ids ([T], [1,T], [B,S], M-RoPE [3,B,S] / [3,1,T]).
    Descriptions that disagree raise :class:`maskpack.Error` naming the first token where they do.
    labels are optional. Every other key whose leading dims are the token grid moves with the tokens;
    the rest passes through (``bundle.passthrough_keys``).

    backend: which attention the model runs, deciding what ``bundle.attention_mask`` is (built only
    when read): "flash_attn", "sdpa", "eager" (additive in ``mask_dtype``), "npu" (arguments in
    ``bundle.npu``; TND when padding_free, BSND otherwise; ``head_dim`` or ``scale`` required),
    "megatron". The rule (causal=True, window=..., spans=..., prefix=...) applies to every backend alike.
    ``max_seqlen`` forces the value reported to kernels; ``pad_to_multiple_of`` pads the token count (each
    rank's, under CP) to a multiple, at the end of the packed stream (or the row width when padded), for
    kernels such as FP8 GEMMs that need it."""
    if backend not in BACKENDS:
        raise Error(f"backend: expected one of {', '.join(BACKENDS)}, found {backend!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="backend")
    cp, tp, cp_rank = int(cp), int(tp), int(cp_rank)
    if cp < 1 or not 0 <= cp_rank < cp:
        raise Error(f"cp_rank: expected in [0, {cp}), found {cp_rank}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="cp_rank")
    if backend == "npu" and head_dim is None and scale is None:
        raise Error("head_dim: the NPU operator defaults scale to 1.0; pass head_dim (for 1/sqrt(head_dim)) or scale",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="head_dim")
    key, grid, _one_row = _token_grid(batch)
    src, _described_by = _source_layout(batch, mask_convention, cu_form, position_rule, rule)
    target = src.packed_of() if padding_free else src
    # one padding rule (cp_multiple): zigzag halves and sequence parallelism at cp > 1, tp alone at cp = 1;
    # align=None pads nothing (every slot must already divide, as cp_shard(align=None) requires)
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

    tokens: Dict[str, Any] = {}
    passthrough: Dict[str, Any] = {}
    for k, v in batch.items():
        if k in _LAYOUT_KEYS:  # read as the layout (position ids are moved below)
            continue
        t = _token_tensor(v, src, grid)
        if t is None:
            if v is not None:
                passthrough[k] = v
            continue
        pad = ignore_index if k in _LABEL_KEYS else (pad_token_id if k == "input_ids" else 0)
        tokens[k] = _move(t, src, local, pad)
    labels_src = _token_tensor(batch.get("labels"), src, grid) if batch.get("labels") is not None else None
    base = labels_src if labels_src is not None else (_token_tensor(batch[key], src, grid)
                                                      if key == "input_ids" else None)
    if base is None:
        raise Error("labels: a batch of inputs_embeds needs labels (there are no input_ids to predict)",
                    "MASKPACK_ERR_NOT_FOUND", argument="labels")
    shifted = src.shift_labels(base, ignore_index=ignore_index)
    weights, denom = src.loss_weights(loss_mode, labels=shifted, ignore_index=ignore_index, dtype="float32",
                                      return_denominator=True)
    tokens["shift_labels"] = _move(shifted, src, local, ignore_index)
    tokens["loss_weights"] = _move(weights, src, local, 0)
    mrope = False
    pos = batch.get("position_ids")
    if pos is not None and not recompute_position_ids:
        ps = _shape(pos)
        mrope = len(ps) == 3
        if mrope:  # [3, B, S] / [3, 1, T]: move the token dims, keep the 3 rows
            p = pos[:, 0] if src.packed else pos
            moved = _move(_movedim(p, 0, -1), src, local, 0)
            tokens["position_ids"] = _movedim(moved, -1, 0)
        else:
            tokens["position_ids"] = _move(_token_tensor(pos, src, grid), src, local, 0)
    else:
        tokens["position_ids"] = local.position_ids()
    options = {"cp_scheme": cp_scheme, "tp": tp, "align": align, "mask_dtype": mask_dtype, "input_layout": input_layout,
               "head_dim": head_dim, "scale": scale, "ignore_index": ignore_index, "max_seqlen": max_seqlen,
               "mrope": mrope, "described_by": _described_by, "label_source": base}
    return Batch(backend=backend, padding_free=padding_free, cp=cp, cp_rank=cp_rank, layout=local, global_layout=glob,
                 source_layout=src, tokens=tokens, passthrough=passthrough, loss_denominator=denom, options=options)


def _move(x, src: Layout, dst: Layout, pad: Any):
    """x from the dataloader's layout to this rank's; no copy when they are one layout (a packed batch at
    cp = 1: the bundle then shares the batch's tensors)."""
    return x if dst is src else relayout(x, src, dst, pad_value=pad)


def _movedim(x, a: int, b: int):
    if is_torch_tensor(x):
        return x.movedim(a, b).contiguous()
    return np.ascontiguousarray(np.moveaxis(x, a, b))
