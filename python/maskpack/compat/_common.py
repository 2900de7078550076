"""What every twin of :mod:`maskpack.compat` shares: Megatron's ``PackedSeqParams`` (its own class when
``megatron.core`` is importable, else a dataclass with the same fields), the resolution of ``tp`` /
``cp`` / ``cp_rank`` / ``group`` from keywords or an initialized Megatron ``parallel_state``, and the
argument checks that turn what upstream would crash on (or silently get wrong) into ``maskpack.Error``.
Nothing here imports a framework at module import time."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import torch

from .._errors import Error
from .._layout import Layout

__all__ = ["PackedSeqParams", "packed_seq_params", "resolve_parallel", "supports_field"]


@dataclasses.dataclass
class _PackedSeqParams:
    """Megatron-core's ``PackedSeqParams`` fields (0.16.1) plus ``cp_partition_mode`` (newer megatron-core),
    used when ``megatron.core`` is not importable."""

    qkv_format: str = None
    cu_seqlens_q: Any = None
    cu_seqlens_kv: Any = None
    cu_seqlens_q_padded: Any = None
    cu_seqlens_kv_padded: Any = None
    max_seqlen_q: int = None
    max_seqlen_kv: int = None
    local_cp_size: int = None
    cp_group: Any = None
    cp_partition_mode: str = "zigzag"


_CLASS: list = []


def _megatron_class():
    if not _CLASS:
        try:
            from megatron.core.packed_seq_params import PackedSeqParams as cls  # type: ignore
        except Exception:  # not installed, or a broken install: the dataclass stands in
            cls = _PackedSeqParams
        _CLASS.append(cls)
    return _CLASS[0]


def __getattr__(name):
    if name == "PackedSeqParams":
        return _megatron_class()
    raise AttributeError(name)


def supports_field(name: str) -> bool:
    cls = _megatron_class()
    return name in getattr(cls, "__dataclass_fields__", {})


def packed_seq_params(**fields: Any):
    """A ``PackedSeqParams`` of Megatron's class (or the stand-in) with ``fields``. A field the class
    lacks (``cp_partition_mode`` on megatron-core < 0.17) is set on the instance instead, so readers
    that look it up with ``getattr`` find it."""
    cls = _megatron_class()
    known = getattr(cls, "__dataclass_fields__", {})
    extra = {k: fields.pop(k) for k in list(fields) if known and k not in known}
    obj = cls(**fields)
    for k, v in extra.items():
        setattr(obj, k, v)
    return obj


def _parallel_state():
    try:
        from megatron.core import parallel_state as ps  # type: ignore
    except Exception:
        return None
    try:
        if ps.model_parallel_is_initialized():
            return ps
    except Exception:
        return None
    return None


def resolve_parallel(fn: str, tp: Optional[int] = None, cp: Optional[int] = None, cp_rank: Optional[int] = None,
                     need: Tuple[str, ...] = ("tp", "cp", "cp_rank")) -> Tuple[int, int, int]:
    """``(tp, cp, cp_rank)``: each keyword given wins; the missing ones come from Megatron's
    ``parallel_state`` when it is initialized, else the call fails naming the keyword to pass."""
    if (type(tp) is int or tp is None) and type(cp) is int and type(cp_rank) is int and 0 <= cp_rank < cp and \
            (tp is None or tp >= 1) and (tp is not None or "tp" not in need):
        return (1 if tp is None else tp), cp, cp_rank  # all given (the common case): no lookup
    vals = {"tp": tp, "cp": cp, "cp_rank": cp_rank}
    missing = [k for k in need if vals[k] is None]
    if missing:
        ps = _parallel_state()
        if ps is None:
            raise Error(f"{fn}: pass {', '.join(k + '=' for k in missing)} (megatron.core.parallel_state is not "
                        "initialized, so the parallel sizes cannot be read from it)",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument=missing[0])
        getters = {"tp": ps.get_tensor_model_parallel_world_size, "cp": ps.get_context_parallel_world_size,
                   "cp_rank": ps.get_context_parallel_rank}
        for k in missing:
            vals[k] = int(getters[k]())
    tp_, cp_, r_ = (1 if vals[k] is None else vals[k] for k in ("tp", "cp", "cp_rank"))
    for name, v, lo in (("tp", tp_, 1), ("cp", cp_, 1), ("cp_rank", r_, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise Error(f"{fn}: {name} must be an int >= {lo}, found {v!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument=name)
    if r_ >= cp_:
        raise Error(f"{fn}: cp_rank {r_} is outside cp = {cp_}", "MASKPACK_ERR_INVALID_ARGUMENT", argument="cp_rank")
    return tp_, cp_, r_


def resolve_group(group: Any):
    """The CP process group: the one given, else Megatron's when its parallel state is initialized, else
    torch.distributed's default group (None)."""
    if group is not None:
        return group
    ps = _parallel_state()
    if ps is not None:
        return ps.get_context_parallel_group()
    return None


def flag(fn: str, name: str, value: Any) -> bool:
    if value is None:
        raise Error(f"{fn}: pass {name}=True or {name}=False (upstream reads it from a global)",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument=name)
    return bool(value)


def check_bool_mask2d(fn: str, mask: Any, name: str = "attention_mask") -> None:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch tensor, found {type(mask).__name__}")
    if mask.dim() != 2:
        raise Error(f"{fn}: {name} must be [batch, seq], found shape {tuple(mask.shape)}", "MASKPACK_ERR_SHAPE",
                    argument=name)
    if mask.dtype != torch.bool:
        raise Error(f"{fn}: {name} must be a bool keep mask (upstream indexes rows with it: a {mask.dtype} mask "
                    "would be read as token indices)", "MASKPACK_ERR_DTYPE", argument=name)


def rows_layout(mask: torch.Tensor, name: str = "attention_mask") -> Layout:
    """The padded layout of a bool keep mask, one sequence per row, empty rows kept as empty sequences
    (so that sequence i is row i); a row with holes is a maskpack.Error naming the mask."""
    try:
        lay = Layout.from_mask2d(mask, convention="keep")
    except Error as e:
        raise Error(f"{name}: {e.message}", e.status, argument=name, index=e.index) from None
    if lay.n_segments == mask.shape[0]:
        return lay
    segs = {s[0]: s for s in lay.segments}
    return Layout.from_segments([segs[b][:3] if b in segs else (b, 0, 0) for b in range(mask.shape[0])],
                                mask.shape[0], mask.shape[1])


class Taker:
    """How to copy the entries ``idx`` (CPU int64, strictly increasing: a shard's token indices, from a layout)
    of a dimension of ``width``, the cheapest way: one run as a slice, equal aligned runs (a zigzag row) as a
    chunk gather, a few runs as slices, else a gather. Built once per index, applied to every tensor."""

    __slots__ = ("n", "kind", "a", "b", "idx", "_dev")

    def __init__(self, idx: torch.Tensor, width: int):
        self.n = n = idx.numel()
        self.idx = idx
        self._dev = {}
        self.kind = "gather"
        if n == 0:
            return
        first = int(idx[0])
        if int(idx[-1]) - first == n - 1:
            self.kind, self.a, self.b = "slice", first, n
            return
        brk = torch.nonzero(idx[1:] - idx[:-1] != 1).flatten() + 1
        runs = brk.numel() + 1
        if runs > 32:
            return
        cuts = [0] + brk.tolist() + [n]
        starts = idx[torch.tensor(cuts[:-1])].tolist()
        lens = [cuts[k + 1] - cuts[k] for k in range(runs)]
        chunk = lens[0]
        if all(r == chunk for r in lens) and width % chunk == 0 and all(s_ % chunk == 0 for s_ in starts):
            self.kind, self.a, self.b = "chunks", chunk, torch.tensor([s_ // chunk for s_ in starts])
        else:
            self.kind, self.a, self.b = "runs", starts, lens

    def _on(self, t: torch.Tensor, device) -> torch.Tensor:
        if device.type == "cpu":
            return t
        key = str(device)
        if key not in self._dev:
            self._dev[key] = t.to(device)
        return self._dev[key]

    def __call__(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        dim = dim % x.dim()
        if self.kind == "slice":
            return x.narrow(dim, self.a, self.b).contiguous()
        if self.kind == "chunks":
            w = x.shape[dim]
            return x.unflatten(dim, (w // self.a, self.a)).index_select(dim, self._on(self.b, x.device)).flatten(dim, dim + 1)
        if self.kind == "runs":
            return torch.cat([x.narrow(dim, s_, r) for s_, r in zip(self.a, self.b)], dim)
        return x.index_select(dim, self._on(self.idx, x.device))


def take(x: torch.Tensor, dim: int, idx: torch.Tensor) -> torch.Tensor:
    """``x.index_select(dim, idx)`` through a :class:`Taker` (one tensor)."""
    return Taker(idx, x.shape[dim % x.dim()])(x, dim)
