"""Moving per-token tensors between layouts: pack, unpack, context-parallel shard and gather, label
shifting, loss weights and last tokens. Every move is one pass of the C copy-plan engine; a tensor is
matched between layouts by (sequence, position), so any composition (padded -> a CP rank's shard of the
packed layout) is a single call and nothing is ever truncated."""

from __future__ import annotations

import os
import weakref
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from . import _maskpack
from ._errors import Error
from ._tensors import DTYPE_NAMES as _DTYPE_NAMES, alloc, describe, describe_out, dtype_name, is_torch_tensor

_SCHEMES = {"zigzag": 0, "contiguous": 1}
_ALIGNS = {"verl": 0, "minimal": 1}
_PLACEMENTS = {"right": 0, "left": 1}
_LOSS_MODES = {"token": 0, "sequence": 1}


def _pick(value: Any, table: dict, name: str) -> int:
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {', '.join(map(repr, table))}, found {value!r}")
    if value not in table:
        raise Error(f"{name}: expected one of {', '.join(map(repr, table))}, found {value!r}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument=name)
    return table[value]


# The default thread count, read once: os.cpu_count() reads sysfs on every call.
_DEFAULT_THREADS = max(1, min(2, os.cpu_count() or 1))


def _threads(threads: Optional[int]) -> int:
    if threads is None:
        return _DEFAULT_THREADS
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads: expected an int, found {threads!r}")
    return int(threads)


def cp_multiple(cp: int, tp: int = 1, align: str = "verl") -> int:
    """The multiple every sequence (packed) or row (padded) is padded to for CP: ``tp*cp*2`` ("verl")
    or ``cp*lcm(2, tp)`` ("minimal"); never ``lcm(tp, 2cp)``, which fails for tp=4, cp=2."""
    return _maskpack.cp_multiple(int(cp), int(tp), _pick(align, _ALIGNS, "align"))


def _token_lead(layout) -> int:
    return 1 if layout.packed else 2


def _alloc_like(x: Any, shape: Tuple[int, ...]):
    """An uninitialised tensor of x's kind and dtype (the relayout writes every element); large
    torch outputs come from the output cache (maskpack._alloc), like the kernels' outputs."""
    if is_torch_tensor(x):
        from ._alloc import fresh  # imports torch: only on this path

        return fresh(shape, x.dtype)
    return np.empty(shape, dtype=np.asarray(x).dtype)


def _pad_bytes(pad_value: Any, dtype: str) -> Optional[bytes]:
    if pad_value is None or pad_value == 0:
        return None
    if dtype == "bfloat16":
        import torch

        return torch.tensor([pad_value], dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
    return np.array([pad_value], dtype=np.dtype(dtype)).tobytes()


# One worker team per (process, thread count), started on first use: a move of a few hundred KB takes
# ~10 us, less than starting a thread, so only a team that is already running can put the second
# core to work on it. A forked child (a DataLoader worker) starts its own: the parent's threads do not
# exist there (the C library then runs the parent's team inline and only frees its memory).
_TEAMS: dict = {}
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_TEAMS.clear)


def _team(threads: Optional[int]):
    n = _DEFAULT_THREADS if threads is None else _threads(threads)
    if n == 1:
        return None
    team = _TEAMS.get(n)
    if team is None:
        team = _TEAMS[n] = _maskpack.workers_create(n)  # n < 1 or > 256: a maskpack.Error
    return team


def _cache_of(layout) -> dict:
    """The dict of values derived from an (immutable) layout, kept on it."""
    c = layout._cache
    if c is None:
        c = layout._cache = {}
    return c


def _cached(layout, key, make):
    """A value derived from an (immutable) layout, computed once and kept on it."""
    c = _cache_of(layout)
    v = c.get(key)
    if v is None:
        v = c[key] = make()
    return v


def _plan(srcs: list, dst):
    """The copy plan srcs -> dst, cached on the first source and keyed by the other layouts' ids; a
    weak reference to each confirms it is still the same layout (an id can be reused after death)."""
    if len(srcs) == 1:  # the common case, without the generator below (a move takes microseconds)
        c = _cache_of(srcs[0])
        key = id(dst)
        entry = c.get(key)
        if entry is None or entry[0][0]() is not dst:
            entry = c[key] = ([weakref.ref(dst)], _maskpack.plan_create((srcs[0]._h,), dst._h))
        return entry[1]
    others = (dst, *srcs[1:])
    c = _cache_of(srcs[0])
    key = tuple(map(id, others))
    entry = c.get(key)
    if entry is None or any(r() is not o for r, o in zip(entry[0], others)):
        entry = c[key] = ([weakref.ref(o) for o in others],
                          _maskpack.plan_create(tuple(s._h for s in srcs), dst._h))
    return entry[1]


def _register_torch() -> None:
    """Lets the extension read torch tensors itself (it never imports torch on its own)."""
    import torch
    import torch.utils.dlpack

    _maskpack.register_torch(torch.Tensor, torch.utils.dlpack.to_dlpack)
    _TORCH_REGISTERED.append(True)


_TORCH_REGISTERED: list = []
_PACK_PLAN, _UNPACK_PLAN = "pack plan", "unpack plan"  # keys in a layout's cache


def _fast_move(plan, x: Any, out: Any, pad_value: Any, threads: Optional[int]) -> bool:
    """The first try of a move whose plan is already cached, into a given ``out`` with zero padding:
    the extension reads torch/numpy tensors itself. False: the caller takes the full path (which
    also reports any error)."""
    return (plan is not None and out is not None and (pad_value is None or (type(pad_value) is int and pad_value == 0))
            and _maskpack.move(plan, x, out, None, _team(threads)))


def _move(plan, srcs: list, dst, xs: list, out: Any, pad_value: Any, threads: Optional[int]):
    if len(xs) == 1 and out is not None:
        # fast path: the extension reads torch CPU tensors and numpy arrays itself
        x = xs[0]
        if not _TORCH_REGISTERED and is_torch_tensor(x):
            _register_torch()
        pad, readable = None, True
        if not (pad_value is None or pad_value == 0):
            try:
                pad = _pad_bytes(pad_value, dtype_name(out.dtype))
            except (AttributeError, TypeError, Error):
                readable = False  # the descriptor path below reports it
        if readable and _maskpack.move(plan, x, out, pad, _team(threads)):
            return out
    descs, keep = [], []
    for i, xi in enumerate(xs):  # shapes are checked by the C engine, which names the argument
        d, k, _ = describe(xi, f"x[{i}]")
        descs.append(d)
        keep.append(k)
    if out is None:
        lead = _token_lead(srcs[0])
        if len(descs[0][2]) < lead:
            raise Error(f"x[0]: expected at least {lead} dimensions (the source's token grid), found "
                        f"{len(descs[0][2])}", "MASKPACK_ERR_SHAPE", argument="x")
        out = _alloc_like(xs[0], dst._per_token_shape() + tuple(descs[0][2][lead:]))
    od, okeep, _ = describe_out(out, "out")
    pad = None if (pad_value is None or pad_value == 0) else _pad_bytes(pad_value, _DTYPE_NAMES[od[1]])
    _maskpack.plan_execute(plan, tuple(descs), od, pad, _team(threads))
    del keep, okeep
    return out


def relayout(x: Any, src, dst, out: Any = None, pad_value: Any = 0, threads: Optional[int] = None):
    """Per-token tensor ``x`` of layout ``src`` ([B,S,...] or [T,...]) -> the same tokens in layout
    ``dst``; padding of dst gets ``pad_value``. ``src`` may also be a sequence of CP shard layouts with
    ``x`` the matching sequence of parts (a gather). Writes into ``out`` when given. The copy plan is
    computed once per pair of layouts and kept on ``src``."""
    if not isinstance(src, (list, tuple)):
        c = src._cache
        entry = c.get(id(dst)) if c is not None else None  # a plan made before by _plan
        if entry is not None and entry[0][0]() is dst and _fast_move(entry[1], x, out, pad_value, threads):
            return out
        return _move(_plan([src], dst), [src], dst, [x], out, pad_value, threads)
    srcs = list(src)
    xs = list(x)
    if len(xs) != len(srcs):
        raise Error(f"x: expected {len(srcs)} tensors (one per source layout), found {len(xs)}",
                    "MASKPACK_ERR_SHAPE", argument="x")
    if not srcs:
        raise Error("src: expected at least one source layout", "MASKPACK_ERR_INVALID_ARGUMENT", argument="src")
    return _move(_plan(srcs, dst), srcs, dst, xs, out, pad_value, threads)


def cp_gather(parts: Sequence[Any], layout, scheme: str = "zigzag", tp: int = 1, align: Optional[str] = "verl",
              pad_value: Any = 0, out: Any = None, threads: Optional[int] = None):
    """The per-rank parts of a per-token tensor (rank order, as ``layout.shard`` produced them) -> the
    tensor in ``layout``. Every token of ``layout`` must be held by exactly one part."""
    cp = len(parts)
    shards = [layout.cp_shard(cp, r, scheme=scheme, tp=tp, align=align) for r in range(cp)]
    return relayout(list(parts), shards, layout, out=out, pad_value=pad_value, threads=threads)


class _Moves:
    """Layout methods that move tensors; mixed into maskpack.Layout."""

    __slots__ = ()

    # ---- layouts of the same sequences ---------------------------------------------------------

    @property
    def _ptr(self) -> int:
        """Address of the C maskpack_layout (valid while this object lives), for sibling extensions."""
        return _maskpack.ptr(self._h)

    def _derived(self, h):
        return type(self)._wrap(h, self._torch, self._align_explicit)

    def packed_of(self):
        """The packed (THD) layout of the same sequences in order, without gaps (flash-attn's unpad)."""
        return _cached(self, "packed_of", lambda: self._derived(_maskpack.packed_of(self._h)))

    def padded_of(self, placement: str = "right", width: Optional[int] = None):
        """One sequence per row, padded on the right or the left to ``width`` (default: the longest)."""
        return self._derived(_maskpack.padded_of(self._h, _pick(placement, _PLACEMENTS, "placement"),
                                                 0 if width is None else int(width)))

    def pad_to_multiple(self, multiple: int):
        """Each sequence's slot (packed) or the row width (padded) padded up to a multiple, explicitly."""
        return self._derived(_maskpack.pad_to_multiple(self._h, int(multiple)))

    def _cp_global(self, cp_size: int, tp: int, align: Optional[str]):
        if align is None:
            return self
        return self.pad_to_multiple(cp_multiple(cp_size, tp, align))

    def cp_shard(self, cp_size: int, cp_rank: int, scheme: str = "zigzag", tp: int = 1,
                 align: Optional[str] = "verl"):
        """The layout of CP rank ``cp_rank`` of ``cp_size``: its queries are the rank's tokens, its keys
        the whole (aligned) batch. ``align`` pads every sequence (packed) or row (padded) explicitly to
        ``cp_multiple(cp_size, tp, align)``; ``align=None`` requires divisibility and fails otherwise."""
        sch = _pick(scheme, _SCHEMES, "scheme")
        if align is not None:
            _pick(align, _ALIGNS, "align")
        key = ("cp_shard", int(cp_size), int(cp_rank), sch, int(tp), align)
        return _cached(self, key, lambda: self._derived(_maskpack.cp_shard(
            self._cp_global(cp_size, tp, align)._h, int(cp_size), int(cp_rank), sch)))

    def cp_shard_indices(self, cp_size: int, cp_rank: int, scheme: str = "zigzag", tp: int = 1,
                         align: Optional[str] = "verl", dtype: Any = "int64"):
        """int [local tokens]: flattened index, in the aligned layout, of each token of the rank's shard
        (TransformerEngine's thd_get_partitioned_indices for packed layouts)."""
        g = self._cp_global(cp_size, tp, align)
        n = g.n_rows * g.q_width // int(cp_size) if int(cp_size) > 0 else 0
        obj, d = alloc((n,), dtype_name(dtype), self._torch)
        _maskpack.cp_shard_indices(g._h, int(cp_size), int(cp_rank), _pick(scheme, _SCHEMES, "scheme"), d)
        return obj

    # ---- tensor moves -------------------------------------------------------------------------

    # pack and unpack into a given ``out`` run once per step on small tensors, where each microsecond
    # of Python shows: their plans are kept under fixed keys (the packed layout lives in the same
    # cache, so no identity check is needed) and tried on the extension's fast path first.

    def pack(self, x: Any, out: Any = None, threads: Optional[int] = None):
        """Per-token tensor of this layout -> [n_tokens, ...] packed without gaps (flash-attn unpad)."""
        c = self._cache
        if c is not None and _fast_move(c.get(_PACK_PLAN), x, out, 0, threads):
            return out
        dst = self.packed_of()
        plan = _cached(self, _PACK_PLAN, lambda: _maskpack.plan_create((self._h,), dst._h))
        return _move(plan, [self], dst, [x], out, 0, threads)

    def unpack(self, x: Any, pad_value: Any = 0, out: Any = None, threads: Optional[int] = None):
        """[n_tokens, ...] packed tensor -> this layout, padding filled with ``pad_value``."""
        c = self._cache
        if c is not None and _fast_move(c.get(_UNPACK_PLAN), x, out, pad_value, threads):
            return out
        src = self.packed_of()
        plan = _cached(self, _UNPACK_PLAN, lambda: _maskpack.plan_create((src._h,), self._h))
        return _move(plan, [src], self, [x], out, pad_value, threads)

    def shard(self, x: Any, cp_size: int, cp_rank: int, scheme: str = "zigzag", tp: int = 1,
              align: Optional[str] = "verl", pad_value: Any = 0, out: Any = None, threads: Optional[int] = None):
        """Per-token tensor of this layout -> CP rank ``cp_rank``'s part (shape of ``cp_shard(...)``)."""
        return relayout(x, self, self.cp_shard(cp_size, cp_rank, scheme, tp, align), out=out, pad_value=pad_value,
                        threads=threads)

    # ---- labels, losses, last tokens ----------------------------------------------------------

    def shift_labels(self, labels: Any, ignore_index: int = -100, out: Any = None):
        """Next-token labels inside each sequence: out[t] = labels[t+1] within a sequence, ignore_index
        on each sequence's last token and on padding. Shift before sharding."""
        d, keep, torch_in = describe(labels, "labels")
        if out is None:
            out = _alloc_like(labels, tuple(d[2]))
        od, okeep, _ = describe_out(out, "out")
        _maskpack.shift_labels(self._h, d, int(ignore_index), od)
        return out

    def loss_weights(self, mode: str = "token", labels: Any = None, ignore_index: int = -100,
                     dtype: Any = "float32", return_denominator: bool = False):
        """Per-token weights with sum(loss * w) == the mean loss ("token": over labelled tokens,
        "sequence": mean of per-sequence means). ``labels`` are the shifted labels (None: every token but
        each sequence's last). Shard the weights like any per-token tensor: per-rank sums add up to the
        exact global mean."""
        keep = None
        ld = None
        if labels is not None:
            ld, keep, _ = describe(labels, "labels")
        obj, od = alloc(self._per_token_shape(), dtype_name(dtype), self._torch)
        denom = _maskpack.loss_weights(self._h, ld, int(ignore_index), _pick(mode, _LOSS_MODES, "mode"), od)
        del keep
        return (obj, denom) if return_denominator else obj

    def cp_last_token(self, cp_size: int, scheme: str = "zigzag", tp: int = 1, align: Optional[str] = "verl",
                      dtype: Any = "int64"):
        """(rank [N], local [N]): the CP rank holding each sequence's last token and its flattened index
        in that rank's shard (-1 for empty sequences)."""
        g = self._cp_global(cp_size, tp, align)
        r, rd = alloc((self.n_segments,), dtype_name(dtype), self._torch)
        l, ld = alloc((self.n_segments,), dtype_name(dtype), self._torch)
        _maskpack.cp_last_token(g._h, int(cp_size), _pick(scheme, _SCHEMES, "scheme"), rd, ld)
        return r, l

    def gather_last_tokens(self, x: Any):
        """Per-token tensor [B,S,...] / [T,...] -> [N, ...]: each sequence's last real token (for reward
        and value heads). Empty sequences give zeros."""
        idx = self.last_token_index(dtype="int64")
        lead = _token_lead(self)
        if is_torch_tensor(x):
            import torch

            flat = x.reshape((-1,) + tuple(x.shape[lead:]))
            idx_t = torch.as_tensor(np.asarray(idx) if not is_torch_tensor(idx) else idx.numpy())
            rows = flat[idx_t.clamp(min=0)]
            rows[idx_t < 0] = 0
            return rows
        a = np.asarray(x)
        flat = a.reshape((-1,) + a.shape[lead:])
        idx = np.asarray(idx)
        rows = flat[np.maximum(idx, 0)].copy()
        rows[idx < 0] = 0
        return rows
