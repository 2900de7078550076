"""maskpack.plan: pack sequences into rows of a fixed capacity and balance the rows across ranks.

    >>> import maskpack
    >>> p = maskpack.plan([3, 7, 1, 6, 5, 2, 4], capacity=10)
    >>> p.rows                              # sequence ids placed in each row
    [[0, 1], [3, 6], [2, 4, 5]]
    >>> p.report()["fill"]                  # real tokens / (capacity * packed rows)
    0.9333333333333333

Each sequence is first rounded up to the context-parallel multiple (``maskpack_cp_multiple(cp, tp,
align)``, 1 when cp = tp = 1) so the rows are exactly the rows a CP shard will run; the rounded
lengths are packed (best-fit-decreasing by default, first-fit-decreasing, or order-preserving
next-fit), empty rows are added until the row count divides by ``dp * micro_batches``, and the rows
are split across ranks and then micro-batches by balanced Karmarkar-Karp (equal row counts) on the
chosen cost: tokens, or ``a*L + L^2`` per sequence (``objective="attention"``; a = 24576 as verl
uses, or given, or derived from a model shape with :func:`attention_coefficient`).

Rows are numbered rank-major: ``row = (rank * micro_batches + micro_batch) * rows_per_microbatch + t``.
"""

from __future__ import annotations

import contextlib
import gc

import operator
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _plan
from ._errors import Error

__all__ = ["Plan", "plan", "attention_coefficient"]

_ALIGN = {"verl": 0, "minimal": 1}
_OBJECTIVE = {"tokens": 0, "attention": 1}
_ALGORITHM = {"bfd": 0, "ffd": 1, "nextfit": 2}
_ROW_WIDTH = {"capacity": 0, "used": 1}


@contextlib.contextmanager
def _no_gc():
    """Building the per-row lists of a large plan creates ~1e5 container objects at once: the cyclic
    garbage collector would run several full passes over them (most of the time of ``.rows`` at 1e5
    sequences); none of them can be part of a cycle, so it is paused meanwhile."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _choice(value: Any, table: Dict[str, int], name: str) -> int:
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {', '.join(map(repr, table))}, found {value!r}")
    if value not in table:
        raise Error(f"{name}: expected one of {', '.join(map(repr, table))}, found {value!r}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument=name)
    return table[value]


def _int(v: Any, name: str) -> int:
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name}: expected an int, found {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{name}: expected an int, found {type(v).__name__} {v!r}") from None


def _lengths(x: Any) -> np.ndarray:
    """Sequence / numpy array / torch tensor of integer lengths -> C-contiguous int64 [N]."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "iu":
            raise TypeError(f"lengths: expected integers, found dtype {x.dtype}")
        if x.ndim != 1:
            raise Error(f"lengths: expected a 1-D array, found shape {tuple(x.shape)}", "MASKPACK_ERR_SHAPE",
                        argument="lengths")
        if x.dtype.kind == "u" and x.size and int(x.max()) > np.iinfo(np.int64).max:
            raise Error("lengths: a value does not fit int64", "MASKPACK_ERR_OVERFLOW", argument="lengths")
        return np.ascontiguousarray(x, dtype=np.int64)
    if isinstance(x, (str, bytes)):
        raise TypeError(f"lengths: expected a sequence of integers, found {type(x).__name__}")
    try:
        items = list(x)
    except TypeError:
        raise TypeError(f"lengths: expected a sequence of integers, found {type(x).__name__}") from None
    vals = [_int(v, f"lengths[{k}]") for k, v in enumerate(items)]
    try:
        return np.array(vals, dtype=np.int64)
    except OverflowError:
        raise Error("lengths: a value does not fit int64", "MASKPACK_ERR_OVERFLOW", argument="lengths") from None


def attention_coefficient(hidden: int, intermediate: int = 0, q_dim: int = 0, kv_dim: int = 0,
                          gated_mlp: bool = False, causal: bool = False) -> float:
    """The ``a`` of ``a*L + L^2`` for a model shape: one layer's forward FLOPs on L tokens are
    ``2*W*L`` (W = hidden*(q_dim + 2*kv_dim) + q_dim*hidden + (3 if gated else 2)*hidden*intermediate)
    plus ``4*q_dim*L^2`` for attention (half when causal), so a = W / (2*q_dim) (W / q_dim causal).
    Defaults: intermediate 4*hidden, q_dim = hidden, kv_dim = q_dim. hidden=4096 gives 24576 (verl)."""
    return _plan.attention_coefficient(_int(hidden, "hidden"), _int(intermediate, "intermediate"),
                                       _int(q_dim, "q_dim"), _int(kv_dim, "kv_dim"), bool(gated_mlp), bool(causal))


class Plan:
    """The result of :func:`plan`. Immutable.

    Attributes (computed once, on first access):
      rows               list per row of the sequence ids it holds (a split sequence appears in
                         several rows; ``pieces`` says which part)
      pieces             list per row of (sequence, offset, length, slot) tuples
      rank_of_row        list: the data-parallel rank running each row
      microbatch_of_row  list: the micro-batch of its rank each row belongs to
    """

    __slots__ = ("_h", "_cache", "capacity", "dp", "micro_batches", "row_width", "__weakref__")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("use maskpack.plan(lengths, capacity, ...)")

    @classmethod
    def _wrap(cls, h: Any, capacity: int, dp: int, micro_batches: int, row_width: str) -> "Plan":
        obj = object.__new__(cls)
        obj._h = h
        obj._cache = {}
        obj.capacity = capacity
        obj.dp = dp
        obj.micro_batches = micro_batches
        obj.row_width = row_width
        return obj

    # ---- bulk data ------------------------------------------------------------------------------

    def _arrays(self) -> Tuple[np.ndarray, np.ndarray]:
        if "pieces" not in self._cache:
            pb, rb = _plan.pieces(self._h)
            self._cache["pieces"] = (np.frombuffer(pb, dtype=np.int64).reshape(-1, 4),
                                     np.frombuffer(rb, dtype=np.int64))
        return self._cache["pieces"]

    def _costs(self):
        if "costs" not in self._cache:
            rc, ru, kc, mc = _plan.costs(self._h)
            self._cache["costs"] = (np.frombuffer(rc, dtype=np.float64), np.frombuffer(ru, dtype=np.int64),
                                    np.frombuffer(kc, dtype=np.float64),
                                    np.frombuffer(mc, dtype=np.float64).reshape(self.dp, self.micro_batches))
        return self._cache["costs"]

    @property
    def n_rows(self) -> int:
        return len(self._arrays()[1]) - 1

    @property
    def rows_per_microbatch(self) -> int:
        return self.n_rows // (self.dp * self.micro_batches)

    @property
    def multiple(self) -> int:
        return int(self.report()["multiple"])

    @property
    def rows(self) -> List[List[int]]:
        if "rows" not in self._cache:
            arr, begin = self._arrays()
            with _no_gc():
                seqs = arr[:, 0].tolist()
                b = begin.tolist()
                self._cache["rows"] = [seqs[b[r]:b[r + 1]] for r in range(len(b) - 1)]
        return self._cache["rows"]

    @property
    def pieces(self) -> List[List[Tuple[int, int, int, int]]]:
        if "piece_lists" not in self._cache:
            arr, begin = self._arrays()
            with _no_gc():
                tuples = list(map(tuple, arr.tolist()))
                b = begin.tolist()
                self._cache["piece_lists"] = [tuples[b[r]:b[r + 1]] for r in range(len(b) - 1)]
        return self._cache["piece_lists"]

    @property
    def rank_of_row(self) -> List[int]:
        per_rank = self.n_rows // self.dp
        return [r // per_rank for r in range(self.n_rows)]

    @property
    def microbatch_of_row(self) -> List[int]:
        per_mb = self.rows_per_microbatch
        return [(r // per_mb) % self.micro_batches for r in range(self.n_rows)]

    @property
    def row_costs(self) -> np.ndarray:
        """Cost of each row under the plan's objective (float64 [n_rows])."""
        return self._costs()[0]

    @property
    def row_used(self) -> np.ndarray:
        """Columns in use in each row: the sum of its slots (int64 [n_rows])."""
        return self._costs()[1]

    @property
    def rank_costs(self) -> np.ndarray:
        """Cost of each rank (float64 [dp])."""
        return self._costs()[2]

    @property
    def microbatch_costs(self) -> np.ndarray:
        """Cost of each micro-batch (float64 [dp, micro_batches])."""
        return self._costs()[3]

    def rows_of(self, rank: int, micro_batch: Optional[int] = None) -> List[int]:
        """Row indices of a rank (or of one of its micro-batches), in order."""
        rank = _int(rank, "rank")
        if not 0 <= rank < self.dp:
            raise Error(f"rank: expected in [0, {self.dp}), found {rank}", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="rank", index=(rank,))
        per_mb = self.rows_per_microbatch
        if micro_batch is None:
            first = rank * self.micro_batches * per_mb
            return list(range(first, first + self.micro_batches * per_mb))
        micro_batch = _int(micro_batch, "micro_batch")
        if not 0 <= micro_batch < self.micro_batches:
            raise Error(f"micro_batch: expected in [0, {self.micro_batches}), found {micro_batch}",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="micro_batch", index=(micro_batch,))
        first = (rank * self.micro_batches + micro_batch) * per_mb
        return list(range(first, first + per_mb))

    # ---- layouts ----------------------------------------------------------------------------------

    def _row_segments(self, r: int, grid_row: int):
        arr, begin = self._arrays()
        segs, col = [], 0
        for seq, off, length, slot in arr[begin[r]:begin[r + 1]].tolist():
            segs.append((grid_row, col, length))
            col += slot
        return segs

    def _width(self, rows: Sequence[int]) -> int:
        if self.row_width == "capacity":
            return self.capacity
        used = self.row_used
        return int(max((used[r] for r in rows), default=0))

    def layout(self, row: int, **rule: Any):
        """The packed maskpack.Layout of one row: its pieces back to back, each followed by its slot's
        alignment filler (the last slot runs to the row's end), so cu_seqlens_padded gives the slots.
        Rule keywords as for every Layout constructor (default causal)."""
        from ._layout import Layout

        row = _int(row, "row")
        if not 0 <= row < self.n_rows:
            raise Error(f"row: expected in [0, {self.n_rows}), found {row}", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="row", index=(row,))
        return Layout.from_segments(self._row_segments(row, 0), 1, self._width([row]), packed=True, **rule)

    def layouts(self, **rule: Any) -> List[Any]:
        """One packed maskpack.Layout per row (see :meth:`layout`), in row order."""
        return [self.layout(r, **rule) for r in range(self.n_rows)]

    def microbatch_layout(self, rank: int, micro_batch: int, **rule: Any):
        """The rows of one micro-batch as one (not packed) Layout [rows_per_microbatch, width]."""
        from ._layout import Layout

        rows = self.rows_of(rank, micro_batch)
        segs = []
        for t, r in enumerate(rows):
            segs.extend(self._row_segments(r, t))
        return Layout.from_segments(segs, len(rows), self._width(rows), packed=False, **rule)

    # ---- report -------------------------------------------------------------------------------------

    def report(self) -> Dict[str, Any]:
        """fill (real tokens / (capacity * packed rows)), padding, per-rank cost and imbalance, as a dict
        (keys as maskpack_plan_report, plus ``rank_costs``)."""
        if "report" not in self._cache:
            self._cache["report"] = _plan.report(self._h)
        out = dict(self._cache["report"])
        out["rank_costs"] = self.rank_costs.tolist()
        return out

    def __len__(self) -> int:
        return self.n_rows

    def __repr__(self) -> str:
        r = self.report()
        return (f"<maskpack.Plan {r['n_sequences']} sequences in {r['n_rows']} rows of {self.capacity} "
                f"(dp {self.dp} x {self.micro_batches} micro-batches), fill {100 * r['fill']:.2f}%, "
                f"imbalance {100 * r['imbalance']:.3f}%>")


def plan(lengths: Any, capacity: int, dp: int = 1, micro_batches: int = 1, cp: int = 1, tp: int = 1,
         objective: str = "tokens", algorithm: str = "bfd", *, align: str = "verl",
         multiple: Optional[int] = None, attention_a: Optional[float] = None, model: Optional[Dict[str, Any]] = None,
         seed: int = 0, allow_split: bool = False, row_width: str = "capacity") -> Plan:
    """Pack sequences of the given lengths into rows of ``capacity`` tokens and balance the rows across
    ``dp`` ranks and ``micro_batches`` micro-batches per rank.

    cp, tp, align: each sequence is padded to maskpack_cp_multiple(cp, tp, align) ("verl": tp*cp*2,
      "minimal": cp*lcm(2, tp); nothing when cp = tp = 1); ``multiple`` overrides it.
    objective: "tokens" or "attention" (a*L + L^2 with ``attention_a``, or ``model`` = dict(hidden=...,
      intermediate=..., q_dim=..., kv_dim=..., gated_mlp=..., causal=...) for attention_coefficient;
      default a = 24576).
    algorithm: "bfd" (best-fit-decreasing), "ffd" (first-fit-decreasing), "nextfit" (input order).
    seed: 0 breaks ties by index; another value by a seeded hash (reproducible).
    allow_split: cut sequences longer than a row into capacity-sized pieces instead of raising.
    row_width: "capacity" (rows of the full capacity) or "used" (each row as wide as its slots).
    Raises maskpack.Error (a ValueError) naming the first sequence that does not fit.
    """
    lens = _lengths(lengths)
    cap = _int(capacity, "capacity")
    seed = _int(seed, "seed")
    if not 0 <= seed < 2**64:
        raise Error(f"seed: expected in [0, 2^64), found {seed}", "MASKPACK_ERR_INVALID_ARGUMENT", argument="seed")
    dp_ = _int(dp, "dp")
    mb = _int(micro_batches, "micro_batches")
    if model is not None and attention_a is not None:
        raise TypeError("plan(): give attention_a or model, not both")
    a = 0.0
    if attention_a is not None:
        a = float(attention_a)
        if not a > 0:
            raise Error(f"attention_a: expected a number > 0, found {attention_a!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="attention_a")
    if model is not None:
        if not isinstance(model, dict):
            raise TypeError(f"model: expected a dict of attention_coefficient arguments, found {model!r}")
        a = attention_coefficient(**model)
    h = _plan.create(lens, cap, dp_, mb, _int(cp, "cp"), _int(tp, "tp"), _choice(align, _ALIGN, "align"),
                     0 if multiple is None else _int(multiple, "multiple"), _choice(objective, _OBJECTIVE, "objective"),
                     a, _choice(algorithm, _ALGORITHM, "algorithm"), seed, bool(allow_split),
                     _choice(row_width, _ROW_WIDTH, "row_width"))
    return Plan._wrap(h, cap, dp_, mb, row_width)
