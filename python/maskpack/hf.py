"""maskpack.hf: a transformers model on maskpack in one call, padding-free and under context parallelism.

    >>> model = maskpack.hf.prepare_model(model, group=cp_group)            # doctest: +SKIP
    >>> bundle = maskpack.prepare_batch(batch, padding_free=True, cp=cp, cp_rank=rank)  # doctest: +SKIP
    >>> out = model(**bundle.hf_kwargs())                                    # doctest: +SKIP

:func:`prepare_model` routes a model's full-attention layers through an attention implementation
registered with transformers under the name ``"maskpack"`` (``AttentionInterface.register`` and
``AttentionMaskInterface.register``; the model's ``config._attn_implementation`` is set to it with
``model.set_attn_implementation``), which calls :func:`maskpack.attention` over the call's layout, and
its Gated DeltaNet layers (Qwen3.5, Qwen3-Next) through :func:`maskpack.patch_linear_attention`.

Where a layer's sequences come from (the attention function reads what the model call passes down to
every layer; transformers hands a call's extra keyword arguments to each attention layer):

* ``maskpack_layout=<Layout>``: the segments themselves. At cp = 1 the layout of the call's tokens
  (``[B, S]`` padded or one packed row ``[1, T]``); under context parallelism the whole batch's layout
  (``bundle.global_layout``), each rank's tokens being its shard of it. ``bundle.hf_kwargs()`` passes it
  under CP, with ``maskpack_cp={"cp", "cp_rank", "cp_scheme", "tp"}`` saying which shard the call holds.
* else, at cp = 1, by :func:`maskpack.prepare_batch`'s rules: transformers' ``cu_seq_lens_q/k`` (or
  ``cu_seqlens``, ``seq_idx``) of one packed row; the position ids of one packed row (a restart at the
  row minimum starts a sequence); the 2D keep mask (the mask function registered under ``"maskpack"``
  hands the layers the model's 2D mask unchanged); the position ids of a padded batch. Every other form
  present must agree (an error names the first token where two differ).
* none of them: :class:`maskpack.Error`, never one sequence across the batch.

The rule inside each sequence is the layer's: causal unless the module (or the call's ``is_causal``)
says otherwise, transformers' ``sliding_window`` (w keys including the query, converted with
:func:`maskpack.window_from_hf`), ``softcap``. A call that continues a KV cache (generation's decode
steps: fewer queries than keys, or a 4D mask) runs through transformers' own SDPA path, as patched
Gated DeltaNet layers do.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, Optional, Tuple

import torch

from ._errors import Error
from ._tensors import check_layout, compiling

__all__ = ["ATTN_IMPLEMENTATION", "attention_forward", "mask_function", "prepare_model", "unprepare_model",
           "register", "SUPPORTED"]

ATTN_IMPLEMENTATION = "maskpack"

# what prepare_model knows how to run; the error for any other model lists it
SUPPORTED = ("Qwen3.5 (model_type qwen3_5, qwen3_5_moe: Gated DeltaNet + attention)",
             "Qwen3-Next (qwen3_next: Gated DeltaNet + attention)",
             "any model whose token mixers are all attention through transformers' AttentionInterface "
             "(full or sliding-window attention: llama, qwen2, qwen3, mistral, ...)")

# token-mixer layer kinds (config.layer_types) maskpack runs: attention, and Gated DeltaNet of the classes
# patch_linear_attention knows
_ATTN_LAYER_TYPES = ("full_attention", "sliding_attention")
_LINEAR_LAYER_TYPES = ("linear_attention",)
# class-name fragments of recurrent / convolutional token mixers maskpack has no kernel for: in a packed
# row they would run across sequence boundaries, so a model holding one is refused by name
_RECURRENT = ("Mamba", "GatedDeltaNet", "DeltaNet", "LinearAttention", "Lightning", "ShortConv", "Rwkv", "RWKV",
              "RecurrentBlock", "Rglru", "RgLru", "xLSTM", "Mlstm", "Slstm", "Hyena", "Retention", "SSM")
_CP_SCHEMES = ("zigzag", "contiguous", "ulysses")
_CP_ALGORITHMS = ("auto", "ring", "all_gather", "ulysses")
# the keyword arguments bundle.hf_kwargs() adds for the layers under CP (and a caller may pass at cp = 1)
CALL_KEYS = ("maskpack_layout", "maskpack_cp")


class _Settings:
    """What prepare_model was told, kept on every module of the prepared model (the attention function
    gets the module it runs for). Shared, never copied: a deep copy of the model keeps the same group."""

    __slots__ = ("group", "cp_scheme", "tp", "align", "cp_algorithm", "threads", "original", "gdn_layers")

    def __init__(self, group, cp_scheme, tp, align, cp_algorithm, threads) -> None:
        self.group, self.cp_scheme, self.tp, self.align = group, cp_scheme, tp, align
        self.cp_algorithm, self.threads = cp_algorithm, threads
        self.original: Any = None
        self.gdn_layers = 0

    def key(self) -> tuple:
        return (id(self.group) if self.group is not None else None, self.cp_scheme, self.tp, self.align,
                self.cp_algorithm, self.threads)

    def __deepcopy__(self, memo):
        return self

    def __copy__(self):
        return self


_ATTR = "_maskpack_hf"
# models prepared with a group (weakly held): Batch.hf_kwargs under CP refuses to hand a shard's kwargs
# over when no model in this process was prepared for that many ranks (an unprepared model would attend
# inside the shard only, silently)
_PREPARED_CP: "weakref.WeakSet" = weakref.WeakSet()


# ---- registration with transformers -------------------------------------------------------------------


# () -> None: the attention function and mask factory registered with transformers as "maskpack"
def register() -> None:
    """Registers the attention function and its mask function with transformers under
    ``"maskpack"`` (idempotent). prepare_model calls it; call it yourself to set
    ``attn_implementation="maskpack"`` on a config before building a model."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, mask_function)


# (B, S, S_kv, 2D keep mask [B, S_kv] or None) -> the same 2D mask (fresh calls) or SDPA's 4D mask (cache)
def mask_function(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: Any = 0,
                  mask_function: Any = None, attention_mask: Optional[torch.Tensor] = None, **kwargs: Any):
    """transformers' mask factory for ``"maskpack"``: the 2D keep mask [B, S] as the model got it (or
    None), which the attention function reads as the padding of the batch. A call that continues a
    cache (keys beyond the queries, a query offset) gets transformers' own SDPA mask instead, for the
    SDPA path such calls take."""
    fresh = isinstance(q_offset, int) and q_offset == 0 and kv_length == q_length
    if fresh:
        # why not transformers' 4D mask: the layout is rebuilt from the 2D mask in O(tokens) and a
        # [B, 1, S, S] tensor is never materialised
        return attention_mask
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask, **kwargs)


# ---- the attention function ------------------------------------------------------------------------------


def _fail(message: str, argument: str, status: str = "MASKPACK_ERR_INVALID_ARGUMENT", index=()) -> Error:
    return Error(message, status, argument=argument, index=index)


def _host(x: Any) -> Any:
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


_SEGMENT_KEYS = ("cu_seqlens", "cu_seq_lens_q", "cu_seq_lens_k", "seq_idx")
# one entry per thread: every attention layer of one forward gets the same tensors, so the layout is
# built once per model call (identity and version of each tensor: an in-place change rebuilds it)
_LAST = threading.local()


def _fingerprint(items: Tuple[Any, ...]) -> tuple:
    return tuple((id(x), getattr(x, "_version", None), tuple(x.shape) if isinstance(x, torch.Tensor) else None)
                 for x in items)


def _call_layout(B: int, S: int, attention_mask: Any, kwargs: Dict[str, Any]):
    """The layout of a cp = 1 call's tokens [B, S] from what the call carries (see the module doc)."""
    from . import batch as _b

    given = kwargs.get("maskpack_layout")
    if given is not None:
        check_layout(given, "maskpack_layout")
        grid = (1, given.q_width) if given.packed else (given.n_rows, given.q_width)
        if grid != (B, S) or given.kv_width != given.q_width:
            raise _fail(f"maskpack_layout: expected the layout of the call's tokens {[B, S]} (self-attention), found "
                        f"a layout of {list(grid)} queries and {given.kv_width} key columns (under context "
                        "parallelism prepare the model with group=)", "maskpack_layout", "MASKPACK_ERR_SHAPE")
        return given
    mask = attention_mask if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 else None
    pos = kwargs.get("position_ids")
    if pos is None:
        pos = kwargs.get("maskpack_position_ids")  # what patched GDN layers' call tap passes on
    segs = [kwargs.get(k) for k in _SEGMENT_KEYS]
    if mask is None and pos is None and all(s is None for s in segs):
        raise _fail("position_ids: the attention layer cannot tell where the call's sequences begin and end: it got "
                    "no maskpack_layout, no cu_seq_lens_q / cu_seqlens / seq_idx, no position_ids and no 2D attention "
                    "mask; pass one (bundle.hf_kwargs() passes them), a layer never attends across the whole batch "
                    "as one sequence", "position_ids", "MASKPACK_ERR_NOT_FOUND")
    given_tensors = (mask, pos, *segs)
    key = _fingerprint(given_tensors) + ((B, S),)
    last = getattr(_LAST, "entry", None)
    if last is not None and last[0] == key:
        return last[1]
    batch: Dict[str, Any] = {"inputs_embeds": torch.empty((B, S, 1))}
    for k, v in zip(_SEGMENT_KEYS, segs):
        if v is not None:
            batch[k] = _host(v)
    text = None
    if isinstance(pos, torch.Tensor):
        pos = _host(pos)
        if pos.dim() == 2 and pos.shape[0] == 1 and B > 1:  # one row of positions for every row
            pos = pos.expand(B, -1)
        batch["position_ids"] = pos
        _, grid, one_row = _b._token_grid(batch)
        text, _planes = _b._positions(pos, grid, one_row)
    if mask is not None:
        batch["attention_mask"] = _host(mask)
    _, grid, _ = _b._token_grid(batch)
    _b._check_layout_shapes(batch, "hidden_states", grid)
    lay, _name = _b._source_layout(batch, None, "te", "reset", {}, text, False)
    # keep the given tensors alive with the entry, so that their ids cannot be reused by other tensors
    _LAST.entry = (key, lay, given_tensors)
    return lay


def _with_rule(layout: Any, causal: bool, window: Tuple[int, int]):
    """The layout under the layer's rule (kept on the layout: one derivation per rule, not per layer)."""
    r = layout.rule
    if bool(r["causal"]) == causal and tuple(r["window"]) == tuple(window):
        return layout
    from ._runtime import cached as _cached

    return _cached(layout, ("hf_rule", causal, tuple(window)), lambda: layout.with_rule(causal=causal, window=window))


@torch._dynamo.assume_constant_result
def _ruled_key(layout: Any, causal: bool, window: Tuple[int, int]) -> int:
    """Under torch.compile: the registry key of the layout under the layer's rule (a constant of the
    layout while tracing: made once, kept in the layout's cache, so it lives as long as the layout; the
    rule is read from the C extension, which Dynamo cannot trace)."""
    return id(_with_rule(layout, causal, window))


def _layer_rule(module: Any, kwargs: Dict[str, Any]) -> Tuple[bool, Tuple[int, int]]:
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", True)
    w = kwargs.get("sliding_window")
    if w is None or (isinstance(w, int) and w <= 0):
        return bool(causal), (-1, -1)
    from ._rule import window_from_hf

    # transformers' sliding window w: keys j with |i - j| < w (j <= i as well when causal) = flash's (w-1, w-1)
    return bool(causal), tuple(window_from_hf(int(w)))


def _check_tensors(query: Any, key: Any, value: Any) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, found {type(t).__name__}")
        if t.dim() != 4:
            raise _fail(f"{name}: expected transformers' [batch, heads, tokens, head dim], found shape {list(t.shape)}",
                        name, "MASKPACK_ERR_SHAPE")
    for name, t in (("key", key), ("value", value)):
        if t.device != query.device:
            raise _fail(f"{name}: on {t.device}, query on {query.device}: every tensor of an attention call on one "
                        "device", name)
    if query.device.type != "cpu":
        raise _fail(f"query: maskpack's attention kernels run on the CPU, found a tensor on {query.device}", "query",
                    "MASKPACK_ERR_UNSUPPORTED")


def _settings_of(module: Any) -> Optional[_Settings]:
    s = getattr(module, _ATTR, None)
    return s if isinstance(s, _Settings) else None


# query [B, Hq, S, D], key/value [B, Hkv, S, D] -> (out [B, S, Hq, D], None); under CP B = 1, S = T_local
def attention_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
                      **kwargs: Any) -> Tuple[torch.Tensor, None]:
    """transformers' attention interface ``"maskpack"``: query [B, Hq, S, D], key / value [B, Hkv, S, D]
    -> (out [B, S, Hq, D], None), per sequence of the call's layout (see the module doc), through
    :func:`maskpack.attention` (under context parallelism: this rank's shard of one packed row, B = 1,
    by the ring, the all-gather or Ulysses' head exchange as :func:`prepare_model` was told)."""
    _check_tensors(query, key, value)
    settings = _settings_of(module)
    group = settings.group if settings is not None else None
    if dropout and getattr(module, "training", False):
        raise _fail(f"attention_dropout: maskpack's attention has no dropout, the layer asks for {dropout} while "
                    "training (set config.attention_dropout = 0)", "attention_dropout", "MASKPACK_ERR_UNSUPPORTED")
    for k in ("s_aux", "sinks"):
        if kwargs.get(k) is not None:
            raise _fail(f"{k}: attention sinks are not supported by maskpack's attention", k,
                        "MASKPACK_ERR_UNSUPPORTED")
    continues = key.shape[-2] != query.shape[-2] or (isinstance(attention_mask, torch.Tensor)
                                                      and attention_mask.dim() == 4)
    if continues:
        if group is not None:
            raise _fail("group: a context-parallel attention layer does not continue a KV cache (generate without "
                        "group=, or unprepare the model)", "group", "MASKPACK_ERR_UNSUPPORTED")
        # a cache continuation (a decode step) or a caller's own 4D mask: transformers' own path
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **{k: v for k, v in kwargs.items() if k not in CALL_KEYS})
    causal, window = _layer_rule(module, kwargs)
    softcap = kwargs.get("softcap") or 0.0
    threads = settings.threads if settings is not None else None
    B, S = int(query.shape[0]), int(query.shape[2])
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, S, H, D]: maskpack's order, no copy
    if group is not None:
        return _cp_forward(settings, q, k, v, causal, window, scaling, softcap, kwargs), None
    info = kwargs.get("maskpack_cp")
    if isinstance(info, dict) and int(info.get("cp", 1)) > 1:
        raise _fail(f"group: the call holds a context-parallel shard (cp = {info['cp']}) but the "
                    "model was prepared without a group: maskpack.hf.prepare_model(model, group=...)", "group")
    from ._attention import attention

    if compiling():
        # traced: the layout is the call's maskpack_layout (boundaries read from tensor values cannot be
        # traced), handed to the kernel op by its registry key; the call's other forms are checked
        # against it by the patched linear layers' opaque check when the graph runs
        given = kwargs.get("maskpack_layout")
        if given is None:
            raise _fail("maskpack_layout: under torch.compile the attention layers take the call's layout as "
                        "maskpack_layout=<Layout> (built outside the compiled function; bundle.hf_kwargs() passes "
                        "it); offsets read from tensor values cannot be traced", "maskpack_layout",
                    "MASKPACK_ERR_NOT_FOUND")
        layout = _call_layout(B, S, attention_mask, kwargs)
        key = _ruled_key(layout, causal, window)
        if layout.packed:
            out, _ = attention(q[0], k[0], v[0], key, scale=scaling, softcap=softcap, threads=threads)
            return out.unsqueeze(0), None
        out, _ = attention(q, k, v, key, scale=scaling, softcap=softcap, threads=threads)
        return out, None
    layout = _with_rule(_call_layout(B, S, attention_mask, kwargs), causal, window)
    if layout.packed:
        out, _ = attention(q[0], k[0], v[0], layout, scale=scaling, softcap=softcap, threads=threads)
        return out.unsqueeze(0), None
    out, _ = attention(q, k, v, layout, scale=scaling, softcap=softcap, threads=threads)
    return out, None


def _agree(group: Any, n: int, rank: int, local: Optional[Exception]) -> None:
    """One all-gather of whether each rank accepted its call's CP arguments (the shard it claims, the
    whole batch's layout), before any collective of the layer: a rank that refuses them raises its own
    error and every other rank one naming it, instead of leaving them waiting in the ring."""
    import torch.distributed as dist

    from .distributed import _backend_device

    dev = _backend_device(group)
    mine = torch.tensor([1 if local is not None else 0], dtype=torch.int64,
                        device=dev if dev in ("cuda", "npu") else "cpu")  # NCCL / HCCL move device tensors only
    everyone = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(everyone, mine, group=group)
    if local is not None:
        raise local
    for r, flag in enumerate(everyone):
        if int(flag):
            raise _fail(f"group: rank {r} refused its call's context-parallel arguments (the shard it holds, the "
                        "whole batch's layout); every rank stops with it", "group", index=(r,))


def _cp_layout(settings: _Settings, kwargs: Dict[str, Any], n: int, rank: int):
    """The whole batch's layout under CP, and the shard the call says it holds checked against the group."""
    info = kwargs.get("maskpack_cp")
    if info is not None:
        if not isinstance(info, dict):
            raise TypeError(f"maskpack_cp: expected a dict (cp, cp_rank, cp_scheme, tp), found {type(info).__name__}")
        if int(info.get("cp", n)) != n or int(info.get("cp_rank", rank)) != rank:
            raise _fail(f"group: the batch was prepared for cp = {info.get('cp')}, cp_rank = {info.get('cp_rank')}; "
                        f"the model's group has {n} ranks and this process is rank {rank}", "group")
        if info.get("cp_scheme", settings.cp_scheme) != settings.cp_scheme:
            raise _fail(f"cp_scheme: the batch was cut with cp_scheme {info.get('cp_scheme')!r}, the model was "
                        f"prepared with {settings.cp_scheme!r}", "cp_scheme")
    layout = kwargs.get("maskpack_layout")
    if layout is None and kwargs.get("cu_seq_lens_q") is not None:
        # the whole batch's offsets, as ring-attention trainers pass them (as the patched GDN layers read them)
        from ._layout import Layout

        layout = Layout.from_cu_seqlens(_host(torch.as_tensor(kwargs["cu_seq_lens_q"])), form="te")
    if layout is None:
        raise _fail("maskpack_layout: under context parallelism an attention layer needs the whole batch's layout: "
                    "pass maskpack_layout=<Layout of the whole batch> (bundle.hf_kwargs() does) or the whole batch's "
                    "cu_seq_lens_q to the model call", "maskpack_layout", "MASKPACK_ERR_NOT_FOUND")
    check_layout(layout, "maskpack_layout")
    return layout


def _cp_forward(settings: _Settings, q, k, v, causal, window, scaling, softcap, kwargs) -> torch.Tensor:
    """This rank's shard [1, T_local, H, D] -> its attention output [1, T_local, Hq, D] over the whole batch."""
    import torch.distributed as dist

    from ._attention import attention

    s = settings
    n, rank = dist.get_world_size(s.group), dist.get_rank(s.group)
    algo = s.cp_algorithm
    if algo == "auto":
        algo = "ulysses" if s.cp_scheme == "ulysses" else "auto"
    if compiling():
        # traced: the ring or the all-gather is one opaque op (maskpack._compile.cp_call) whose eager call
        # starts with the ranks' agreement, so a rank refused there stops every rank; the whole batch's
        # layout under the layer's rule crosses by its registry key
        if algo == "ulysses":
            raise _fail("cp_algorithm: under torch.compile the attention layers run the ring or the all-gather "
                        "(prepare_model(..., cp_algorithm='ring' or 'all_gather', cp_scheme='zigzag'))",
                        "cp_algorithm", "MASKPACK_ERR_UNSUPPORTED")
        if q.shape[0] != 1:
            raise _fail(f"query: under context parallelism one packed row [1, T_local, ...], found a batch of "
                        f"{q.shape[0]} rows", "query", "MASKPACK_ERR_SHAPE")
        key = _ruled_key(_cp_layout(s, kwargs, n, rank), causal, window)
        out, _ = attention(q[0], k[0], v[0], key, scale=scaling, softcap=softcap, threads=s.threads, group=s.group,
                           cp_scheme=s.cp_scheme, tp=s.tp, align=s.align, cp_algorithm=algo)
        return out.unsqueeze(0)
    # every check that may differ between ranks before the agreement, so that none raises alone
    local = None
    try:
        if q.shape[0] != 1:
            raise _fail(f"query: under context parallelism one packed row [1, T_local, ...], found a batch of "
                        f"{q.shape[0]} rows", "query", "MASKPACK_ERR_SHAPE")
        whole = _with_rule(_cp_layout(s, kwargs, n, rank), causal, window)
        if algo == "ulysses":
            shards = _ulysses_shards(q[0], whole, s, n, rank)
    except (Error, TypeError) as e:
        local = e
    _agree(s.group, n, rank, local)
    q, k, v = q[0], k[0], v[0]
    if algo == "ulysses":
        return _ulysses(q, k, v, whole, shards, s, n, scaling, softcap).unsqueeze(0)
    out, _ = attention(q, k, v, whole, scale=scaling, softcap=softcap, threads=s.threads, group=s.group,
                       cp_scheme=s.cp_scheme, tp=s.tp, align=s.align, cp_algorithm=algo)
    return out.unsqueeze(0)


def _ulysses_shards(q, whole, s: _Settings, n: int, rank: int) -> list:
    """Every rank's shard layout of ``whole``, with this rank's q [T_local, Hq, D] checked against its own."""
    Hq = int(q.shape[1])
    if Hq % n:
        raise _fail(f"cp_algorithm: Ulysses gives each of the {n} ranks heads/{n} of the {Hq} query heads, which do "
                    "not divide; use cp_algorithm='ring' or 'all_gather'", "cp_algorithm", "MASKPACK_ERR_SHAPE")
    shards = [whole.cp_shard(n, r, scheme=s.cp_scheme, tp=s.tp, align=s.align) for r in range(n)]
    mine = shards[rank]
    if q.shape[0] != mine.n_rows * mine.q_width:
        raise _fail(f"query: expected this rank's shard (rank {rank} of {n}) of {mine.n_rows * mine.q_width} tokens, "
                    f"found {q.shape[0]}", "query", "MASKPACK_ERR_SHAPE")
    return shards


def _ulysses(q, k, v, whole, shards: list, s: _Settings, n: int, scaling, softcap) -> torch.Tensor:
    """Ulysses: an all-to-all turns this rank's tokens of every head into every token of heads/n heads, the
    whole batch attends per sequence in one kernel call, and the reverse all-to-all brings the rank's tokens
    back. Key/value heads that do not divide by n are repeated up to the query heads first (each query head
    keeps its key head)."""
    from ._moves import relayout
    from ._attention import attention
    from .distributed import ulysses_all_to_all

    Hq, Hkv = int(q.shape[1]), int(k.shape[1])
    if Hkv % n:
        k, v = (t.repeat_interleave(Hq // Hkv, dim=1) for t in (k, v))
    whole_g = whole._cp_global(n, s.tp, s.align, s.cp_scheme)
    sizes = [sh.n_rows * sh.q_width for sh in shards]
    contiguous = s.cp_scheme == "ulysses"  # the shards are the stream's pieces in rank order

    def to_whole(x):
        x = ulysses_all_to_all(x.contiguous(), s.group, 1, 0)  # [sum of shards, H/n, D], rank order
        return x if contiguous else relayout(list(torch.split(x, sizes)), shards, whole_g)

    qw, kw, vw = to_whole(q), to_whole(k), to_whole(v)
    out, _ = attention(qw, kw, vw, whole_g, scale=scaling, softcap=softcap, threads=s.threads)
    if not contiguous:
        out = torch.cat([relayout(out, whole_g, sh) for sh in shards])
    return ulysses_all_to_all(out.contiguous(), s.group, 0, 1)


# ---- preparing a model ------------------------------------------------------------------------------------


def _gdn_class_names() -> Tuple[str, ...]:
    from .gdn import _HF_GDN_LAYERS

    return tuple(_HF_GDN_LAYERS)


def _text_config(model: Any) -> Any:
    cfg = model.config
    sub = getattr(cfg, "text_config", None)
    return sub if sub is not None else cfg


def _refuse_family(model: Any, why: str) -> Error:
    cfg = getattr(model, "config", None)
    mt = getattr(cfg, "model_type", None)
    return _fail(f"model: maskpack.hf.prepare_model does not know {type(model).__name__}"
                 f"{f' (model_type {mt!r})' if mt else ''}: {why}. It supports: " + "; ".join(SUPPORTED),
                 "model", "MASKPACK_ERR_UNSUPPORTED")


def _check_family(model: Any) -> int:
    """Whether maskpack can run every token mixer of ``model`` -> the number of Gated DeltaNet layers."""
    try:
        from transformers import PreTrainedModel
    except ImportError as e:  # pragma: no cover  (transformers is a dependency of this module)
        raise _fail(f"model: maskpack.hf needs transformers ({e})", "model", "MASKPACK_ERR_UNSUPPORTED") from None
    if not isinstance(model, PreTrainedModel):
        raise _refuse_family(model, "it is not a transformers PreTrainedModel")
    gdn = _gdn_class_names()
    n_gdn = 0
    for name, mod in model.named_modules():
        cls = type(mod).__name__
        if cls in gdn:
            n_gdn += 1
        elif any(f in cls for f in _RECURRENT):
            raise _refuse_family(model, f"its layer {name} ({cls}) is a recurrent token mixer maskpack has no kernel "
                                        "for (in a packed row it would run across sequences)")
    types = getattr(_text_config(model), "layer_types", None) or ()
    other = sorted({t for t in types if t not in _ATTN_LAYER_TYPES + _LINEAR_LAYER_TYPES})
    if other:
        raise _refuse_family(model, f"its config has layer types {other} maskpack does not run")
    if any(t in _LINEAR_LAYER_TYPES for t in types) and n_gdn == 0:
        raise _refuse_family(model, "its linear-attention layers are of no class maskpack knows")
    if not type(model)._can_set_attn_implementation():
        raise _refuse_family(model, "its attention does not go through transformers' AttentionInterface")
    return n_gdn


def _check_devices(model: Any) -> None:
    devs = sorted({str(t.device) for t in list(model.parameters()) + list(model.buffers())})
    if len(devs) > 1:
        raise _fail(f"model: its parameters and buffers lie on several devices ({', '.join(devs)}); maskpack's "
                    "kernels take every tensor of a layer on one device (the CPU)", "model")
    if devs and devs[0] != "cpu":
        raise _fail(f"model: maskpack's attention and Gated DeltaNet kernels run on the CPU, the model is on {devs[0]}",
                    "model", "MASKPACK_ERR_UNSUPPORTED")


def _check_cp(model: Any, group: Any, cp_scheme: str, cp_algorithm: str) -> None:
    if cp_scheme not in _CP_SCHEMES:
        raise _fail(f"cp_scheme: expected one of {', '.join(_CP_SCHEMES)}, found {cp_scheme!r}", "cp_scheme")
    if cp_algorithm not in _CP_ALGORITHMS:
        raise _fail(f"cp_algorithm: expected one of {', '.join(_CP_ALGORITHMS)}, found {cp_algorithm!r}",
                    "cp_algorithm")
    if group is None:
        return
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise _fail("group: torch.distributed is not initialised (init_process_group first)", "group")
    try:
        n = dist.get_world_size(group)
    except (RuntimeError, ValueError, TypeError) as e:
        raise _fail(f"group: expected a torch.distributed ProcessGroup this process belongs to ({e})", "group") \
            from None
    heads = getattr(_text_config(model), "num_attention_heads", None)
    if cp_algorithm == "ulysses" and isinstance(heads, int) and heads % n:
        raise _fail(f"cp_algorithm: Ulysses splits the {heads} attention heads over the group's {n} ranks, which "
                    "do not divide them; use 'ring' or 'all_gather'", "cp_algorithm", "MASKPACK_ERR_SHAPE")


def _set_attn(model: Any, name: str) -> None:
    if getattr(model.config, "text_config", None) is not None and "text_config" in getattr(model.config,
                                                                                          "sub_configs", {}):
        model.set_attn_implementation({"text_config": name})  # the vision tower keeps its own
    else:
        model.set_attn_implementation(name)


# model -> the same model, in place (attention "maskpack", GDN layers patched); enabled=False undoes it
def prepare_model(model: Any, group: Any = None, *, enabled: bool = True, cp_scheme: str = "zigzag", tp: int = 1,
                  align: Optional[str] = "verl", cp_algorithm: str = "auto", threads: Optional[int] = None) -> Any:
    """A transformers model -> the same model (in place) running on maskpack: full attention through
    the ``"maskpack"`` attention implementation, Gated DeltaNet layers (Qwen3.5, Qwen3-Next) through
    :func:`maskpack.patch_linear_attention`. Parameters, state dict and optimizer state are unchanged.

    ``group`` (a torch.distributed ProcessGroup): context parallelism. Each rank then calls the model on
    its shard of one packed row (``bundle.hf_kwargs()`` of ``prepare_batch(..., padding_free=True,
    cp=group size, cp_rank=rank, cp_scheme=cp_scheme)``); attention runs by ``cp_algorithm``: "ring"
    (maskpack's ring, CPU float32), "all_gather" (K/V all-gathered), "ulysses" (heads exchanged; the
    query heads divide by the group size) or "auto" (Ulysses for cp_scheme "ulysses", else the ring where
    it applies, else the all-gather); the GDN layers run head-parallel (or sequence-parallel where heads
    do not divide). ``tp`` and ``align`` as :func:`maskpack.prepare_batch` cut the batch.

    Idempotent: preparing a prepared model with the same settings changes nothing, with other settings
    re-prepares it. ``enabled=False`` (or :func:`unprepare_model`) gives the model back its attention
    implementation and its layers' own forward. Refused with :class:`maskpack.Error`: a model with a
    token mixer maskpack does not run (the message lists what it supports), parameters on several
    devices or off the CPU (``model``), a bad ``group``, ``cp_scheme`` or ``cp_algorithm``."""
    if not enabled:
        return unprepare_model(model)
    n_gdn = _check_family(model)
    _check_devices(model)
    _check_cp(model, group, cp_scheme, cp_algorithm)
    settings = _Settings(group, cp_scheme, int(tp), align, cp_algorithm, threads)
    old = _settings_of(model)
    if old is not None:
        if old.key() == settings.key():
            return model
        unprepare_model(model)
    register()
    settings.original = _text_config(model)._attn_implementation
    _set_attn(model, ATTN_IMPLEMENTATION)
    if _text_config(model)._attn_implementation != ATTN_IMPLEMENTATION:
        _set_attn(model, settings.original)
        raise _refuse_family(model, "transformers would not set its attention implementation")
    if n_gdn:
        from .gdn import patch_linear_attention

        settings.gdn_layers = patch_linear_attention(model, threads=threads, group=group, cp_scheme=cp_scheme, tp=tp,
                                                     align=align)
    for mod in model.modules():
        object.__setattr__(mod, _ATTR, settings)
    if group is not None:
        _PREPARED_CP.add(model)
    return model


# prepared model -> the same model as before prepare_model
def unprepare_model(model: Any) -> Any:
    """Undoes :func:`prepare_model` (a model that was not prepared is returned as it is)."""
    settings = _settings_of(model)
    if settings is None:
        return model
    if settings.gdn_layers:
        from .gdn import patch_linear_attention

        patch_linear_attention(model, enabled=False)
    _set_attn(model, settings.original)
    for mod in model.modules():
        mod.__dict__.pop(_ATTR, None)
    _PREPARED_CP.discard(model)
    return model


def _prepared_for(cp: int, model: Any = None) -> bool:
    """Whether ``model`` (or, when None, any live model of this process) was prepared with a group of
    ``cp`` ranks: Batch.hf_kwargs' guard against handing a CP shard to a model that would attend inside
    the shard only."""
    import torch.distributed as dist

    models = [model] if model is not None else list(_PREPARED_CP)
    for m in models:
        s = _settings_of(m)
        if s is not None and s.group is not None and dist.is_initialized() and dist.get_world_size(s.group) == cp:
            return True
    return False


# Batch of a CP rank -> {input_ids [1, T_local], position_ids [1, T_local], maskpack_layout, maskpack_cp, ...}
def cp_kwargs(bundle: Any, labels: bool = False, model: Any = None) -> Dict[str, Any]:
    """What :meth:`maskpack.Batch.hf_kwargs` returns for a context-parallel rank (cp > 1): this rank's
    shard as one packed row ``[1, T_local]`` (input_ids or inputs_embeds, position_ids: each token's
    position in its sequence, for RoPE; M-RoPE ``[3, 1, T_local]``; every other per-token key), the whole
    batch's layout ``maskpack_layout`` (``bundle.global_layout``, which the prepared attention layers and
    the patched GDN layers cut into the same shards), ``maskpack_cp`` (cp, cp_rank, cp_scheme, tp: the
    attention layers check them against the model's group) and ``use_cache=False``. ``labels=True`` adds
    ``labels`` and ``shift_labels`` of the shard as hf_kwargs does at cp = 1.

    A model that was not prepared for that many ranks would attend inside the shard only, silently: so
    ``model`` (when given) must have been prepared with a group of ``bundle.cp`` ranks, or else (when not
    given) some live model of this process must have been; otherwise :class:`maskpack.Error` naming
    ``cp``. A padded (not padding-free) CP bundle is refused (``padding_free``): the layers take one
    packed row under CP."""
    if not bundle.padding_free:
        raise _fail(f"padding_free: a transformers model under context parallelism (cp = {bundle.cp}) takes one "
                    "packed row per rank; prepare the batch with padding_free=True", "padding_free",
                    "MASKPACK_ERR_UNSUPPORTED")
    if not _prepared_for(bundle.cp, model):
        which = "this model was" if model is not None else "no model of this process was"
        raise _fail(f"cp: {which} prepared for {bundle.cp} context-parallel ranks: maskpack.hf.prepare_model(model, "
                    f"group=<a group of {bundle.cp} ranks>) first (a model that is not would attend inside this "
                    "rank's shard only)", "cp", "MASKPACK_ERR_UNSUPPORTED")
    skip = {"labels", "shift_labels", "loss_weights"}
    mrope = bool(bundle.extras.get("mrope"))

    def row(key, v):  # [T, ...] -> [1, T, ...]; M-RoPE [3, T] -> [3, 1, T]
        v = torch.as_tensor(v)
        return v[:, None] if key == "position_ids" and mrope and v.dim() == 2 else v[None]

    kw = {k: row(k, v) for k, v in bundle.tokens.items() if k not in skip}
    kw["maskpack_layout"] = bundle.global_layout
    kw["maskpack_cp"] = {"cp": int(bundle.cp), "cp_rank": int(bundle.cp_rank),
                         "cp_scheme": bundle.extras.get("cp_scheme", "zigzag"), "tp": int(bundle.extras.get("tp", 1))}
    kw["use_cache"] = False
    if labels:
        lab = bundle.labels if bundle.labels is not None else bundle.shift_labels
        kw["labels"] = torch.as_tensor(lab)[None]
        kw["shift_labels"] = torch.as_tensor(bundle.shift_labels)[None]
    return kw
