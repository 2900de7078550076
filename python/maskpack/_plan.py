"""maskpack.plan (module maskpack._plan): pack sequences into rows of a fixed capacity and balance the rows across ranks.

    >>> import maskpack
    >>> p = maskpack.plan([3, 7, 1, 6, 5, 2, 4], capacity=10)
    >>> p.rows                              # sequence ids placed in each row (numpy-backed view)
    Rows([[0, 1], [3, 6], [2, 4, 5]])
    >>> p.rows == [[0, 1], [3, 6], [2, 4, 5]]
    True
    >>> p.rows.offsets.tolist(), p.rows.sequences.tolist()   # CSR: row r is sequences[offsets[r]:offsets[r+1]]
    ([0, 2, 4, 7], [0, 1, 3, 6, 2, 4, 5])
    >>> p.report()["fill_all_rows"]         # real tokens / (capacity * every row every rank runs)
    0.9333333333333333

Each sequence is first rounded up to the context-parallel multiple (``maskpack_cp_multiple(cp, tp,
align)``, 1 when cp = tp = 1) so the rows are exactly the rows a CP shard will run; the rounded
lengths are packed (best-fit-decreasing by default, first-fit-decreasing, or order-preserving
next-fit), which fixes the rows per micro-batch (the packed row count over ``dp * micro_batches``,
rounded up). With the decreasing packers the sequences themselves are then dealt over the
(rank, micro-batch) groups, largest first to the lightest group with room, each group packing its own
rows, and single moves and swaps between the heaviest and the lightest groups polish the balance;
next-fit's rows are dealt whole by balanced Karmarkar-Karp. Every rank runs the same number of rows.
The cost is tokens, or ``a*L + L^2`` per sequence (``objective="attention"``): ``a`` is the length at
which a sequence's attention work equals its linear-layer work, so sequences much shorter than ``a``
balance almost by tokens. ``a`` is the one given, else 6 * hidden of the ``hidden`` size or ``model``
shape given (:func:`attention_coefficient`), else verl's 24576.

Rows are numbered rank-major: ``row = (rank * micro_batches + micro_batch) * rows_per_microbatch + t``.
"""

from __future__ import annotations

import contextlib
import gc

import operator
from collections.abc import Sequence as _SequenceABC
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._maskpack import plan as _plan
from ._errors import Error
from ._runtime import enum

__all__ = ["Plan", "Rows", "plan", "attention_coefficient"]

_ALIGN = enum("cp_align")
_OBJECTIVE = enum("plan_objective")
_ALGORITHM = enum("plan_algorithm")
_ROW_WIDTH = enum("plan_row_width")


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


class Rows(_SequenceABC):
    """The rows of a plan as CSR arrays: row r holds ``sequences[offsets[r]:offsets[r + 1]]``.

    No Python object is made per row until one is asked for: indexing gives that row as a list,
    iterating gives the rows as lists one by one, :meth:`tolist` all of them (the list view), and
    ``==`` compares with a list of lists. ``offsets`` (int64 [n_rows + 1]) and ``sequences`` (int64
    [pieces]) are read-only numpy arrays; :meth:`array` is one row as a numpy view."""

    __slots__ = ("offsets", "sequences")

    def __init__(self, offsets: np.ndarray, sequences: np.ndarray) -> None:
        self.offsets = offsets
        self.sequences = sequences

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _index(self, r: Any) -> int:
        r = operator.index(r)
        n = len(self)
        if r < 0:
            r += n
        if not 0 <= r < n:
            raise IndexError(f"row {r} out of range for {n} rows")
        return r

    def __getitem__(self, r: Any) -> Any:
        if isinstance(r, slice):
            return [self[i] for i in range(*r.indices(len(self)))]
        r = self._index(r)
        return self.sequences[self.offsets[r]:self.offsets[r + 1]].tolist()

    def array(self, r: int) -> np.ndarray:
        """Row r as a numpy view (no copy)."""
        r = self._index(r)
        return self.sequences[self.offsets[r]:self.offsets[r + 1]]

    def __iter__(self):
        seqs = self.sequences.tolist()
        b = self.offsets.tolist()
        for r in range(len(b) - 1):
            yield seqs[b[r]:b[r + 1]]

    def tolist(self) -> List[List[int]]:
        """Every row as a list of sequence ids (the list view)."""
        with _no_gc():
            return list(self)

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, Rows):
            return np.array_equal(self.offsets, other.offsets) and np.array_equal(self.sequences, other.sequences)
        if isinstance(other, (list, tuple)):
            return self.tolist() == [list(r) if not isinstance(r, list) else r for r in other]
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        if len(self) <= 8:
            return f"Rows({self.tolist()!r})"
        return f"Rows({len(self)} rows, {len(self.sequences)} pieces)"


class _PieceRows(_SequenceABC):
    """Per row, its pieces as (sequence, offset, length, slot) tuples, built per row on demand."""

    __slots__ = ("_arr", "_begin")

    def __init__(self, arr: np.ndarray, begin: np.ndarray) -> None:
        self._arr = arr
        self._begin = begin

    def __len__(self) -> int:
        return len(self._begin) - 1

    def __getitem__(self, r: Any) -> Any:
        if isinstance(r, slice):
            return [self[i] for i in range(*r.indices(len(self)))]
        r = operator.index(r)
        n = len(self)
        if r < 0:
            r += n
        if not 0 <= r < n:
            raise IndexError(f"row {r} out of range for {n} rows")
        return list(map(tuple, self._arr[self._begin[r]:self._begin[r + 1]].tolist()))

    def __iter__(self):
        tuples = list(map(tuple, self._arr.tolist()))
        b = self._begin.tolist()
        for r in range(len(b) - 1):
            yield tuples[b[r]:b[r + 1]]

    def tolist(self) -> List[List[Tuple[int, int, int, int]]]:
        with _no_gc():
            return list(self)

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, _PieceRows):
            return self.tolist() == other.tolist()
        if isinstance(other, (list, tuple)):
            return self.tolist() == [[tuple(pc) for pc in r] for r in other]
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{len(self)} rows of pieces>"


class Plan:
    """The result of :func:`plan`. Immutable.

    Attributes (computed once, on first access):
      rows               :class:`Rows`: per row the sequence ids it holds, as CSR numpy arrays
                         (``rows.offsets``, ``rows.sequences``); indexes and compares like a list of
                         lists, ``rows.tolist()`` is that list (a split sequence appears in several
                         rows; ``pieces`` says which part)
      row_offsets, row_sequences   the same two arrays
      piece_array        int64 [pieces, 4]: (sequence, offset, length, slot), rows one after another
      pieces             per row, its (sequence, offset, length, slot) tuples (built per row on demand)
      row_ranks, row_microbatches  int64 [n_rows] numpy arrays; rank_of_row, microbatch_of_row: lists
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
                                     np.frombuffer(rb, dtype=np.int64))  # bytes-backed: read-only
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
    def rows(self) -> Rows:
        if "rows" not in self._cache:
            arr, begin = self._arrays()
            seqs = np.ascontiguousarray(arr[:, 0])
            seqs.flags.writeable = False
            self._cache["rows"] = Rows(begin, seqs)
        return self._cache["rows"]

    @property
    def row_offsets(self) -> np.ndarray:
        """CSR offsets of the rows (int64 [n_rows + 1], read-only)."""
        return self.rows.offsets

    @property
    def row_sequences(self) -> np.ndarray:
        """Sequence ids of the rows one after another (int64 [pieces], read-only)."""
        return self.rows.sequences

    @property
    def piece_array(self) -> np.ndarray:
        """(sequence, offset, length, slot) of every piece, rows one after another (int64 [pieces, 4])."""
        return self._arrays()[0]

    @property
    def pieces(self) -> _PieceRows:
        if "piece_rows" not in self._cache:
            arr, begin = self._arrays()
            self._cache["piece_rows"] = _PieceRows(arr, begin)
        return self._cache["piece_rows"]

    @property
    def row_ranks(self) -> np.ndarray:
        """The data-parallel rank running each row (int64 [n_rows])."""
        return np.arange(self.n_rows, dtype=np.int64) // (self.n_rows // self.dp)

    @property
    def row_microbatches(self) -> np.ndarray:
        """The micro-batch of its rank each row belongs to (int64 [n_rows])."""
        return np.arange(self.n_rows, dtype=np.int64) // self.rows_per_microbatch % self.micro_batches

    @property
    def rank_of_row(self) -> List[int]:
        return self.row_ranks.tolist()

    @property
    def microbatch_of_row(self) -> List[int]:
        return self.row_microbatches.tolist()

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

    def layout(self, row: int, **rule: Any):
        """The packed maskpack.Layout of one row: its pieces back to back, each followed by its slot's
        alignment filler (the last slot runs to the row's end), so cu_seqlens_padded gives the slots.
        Rule keywords as for every Layout constructor (default causal). Built by the library
        (maskpack_plan_row_layout)."""
        from . import _rule
        from ._layout import Layout

        row = _int(row, "row")
        if not 0 <= row < self.n_rows:
            raise Error(f"row: expected in [0, {self.n_rows}), found {row}", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="row", index=(row,))
        r, explicit = _rule.normalize(rule, None, "layout")
        return Layout._wrap(_plan.row_layout(self._h, row, _rule.to_c(r, explicit)), False, explicit)

    def layouts(self, **rule: Any) -> List[Any]:
        """One packed maskpack.Layout per row (see :meth:`layout`), in row order."""
        return [self.layout(r, **rule) for r in range(self.n_rows)]

    def microbatch_layout(self, rank: int, micro_batch: int, **rule: Any):
        """The rows of one micro-batch as one (not packed) Layout [rows_per_microbatch, width], built by
        the library (maskpack_plan_microbatch_layout)."""
        from . import _rule
        from ._layout import Layout

        self.rows_of(rank, micro_batch)  # the arguments checked and named as rows_of names them
        r, explicit = _rule.normalize(rule, None, "microbatch_layout")
        h = _plan.microbatch_layout(self._h, int(rank), int(micro_batch), _rule.to_c(r, explicit))
        return Layout._wrap(h, False, explicit)

    # ---- report -------------------------------------------------------------------------------------

    def report(self) -> Dict[str, Any]:
        """The plan's figures as a dict (keys as maskpack_plan_report, plus ``rank_costs``):

        fill_all_rows   real tokens / (capacity * every row every rank runs, empty rows included)
        fill            the fill of non-empty rows (also under ``fill_nonempty_rows``): flatters a plan
                        whose ranks step through empty rows
        rows_per_rank, n_empty_rows
        imbalance       max / mean - 1 of the rank costs under the plan's objective
        token_imbalance, attention_imbalance   the same for tokens and for a*L + L^2 per rank,
                        whichever objective was balanced (rank_tokens_*, rank_attention_*)
        microbatch_imbalance, padding, attention_a, ..."""
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
                f"(dp {self.dp} x {self.micro_batches} micro-batches), fill {100 * r['fill_all_rows']:.2f}% of all "
                f"rows ({100 * r['fill']:.2f}% of non-empty rows), "
                f"imbalance {100 * r['imbalance']:.3f}%>")


def plan(lengths: Any, capacity: int, dp: int = 1, micro_batches: int = 1, cp: int = 1, tp: int = 1,
         objective: str = "tokens", algorithm: str = "bfd", *, align: str = "verl",
         multiple: Optional[int] = None, attention_a: Optional[float] = None, model: Optional[Dict[str, Any]] = None,
         hidden: Optional[int] = None, seed: int = 0, allow_split: bool = False, row_width: str = "capacity") -> Plan:
    """Pack sequences of the given lengths into rows of ``capacity`` tokens and balance the rows across
    ``dp`` ranks and ``micro_batches`` micro-batches per rank.

    cp, tp, align: each sequence is padded to maskpack_cp_multiple(cp, tp, align) ("verl": tp*cp*2,
      "minimal": cp*lcm(2, tp); nothing when cp = tp = 1); ``multiple`` overrides it.
    objective: "tokens" or "attention" (a*L + L^2 per slot of L tokens; a is the length at which a
      sequence's attention work equals its linear-layer work). a: ``attention_a`` when given (it always
      wins), else from ``model`` = dict(hidden=..., intermediate=..., q_dim=..., kv_dim=...,
      gated_mlp=..., causal=...) through attention_coefficient, else 6 * ``hidden``, else 24576 (verl).
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
    a = 0.0
    if attention_a is not None:
        a = float(attention_a)
        if not a > 0:
            raise Error(f"attention_a: expected a number > 0, found {attention_a!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="attention_a")
    if model is not None:
        if not isinstance(model, dict):
            raise TypeError(f"model: expected a dict of attention_coefficient arguments, found {model!r}")
        if attention_a is None:  # the user's a takes precedence over the model's
            a = attention_coefficient(**model)
    hid = 0
    if hidden is not None:
        hid = _int(hidden, "hidden")
        if hid < 1:
            raise Error(f"hidden: expected an int >= 1, found {hidden!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="hidden")
    h = _plan.create(lens, cap, dp_, mb, _int(cp, "cp"), _int(tp, "tp"), _choice(align, _ALIGN, "align"),
                     0 if multiple is None else _int(multiple, "multiple"), _choice(objective, _OBJECTIVE, "objective"),
                     a, _choice(algorithm, _ALGORITHM, "algorithm"), seed, bool(allow_split),
                     _choice(row_width, _ROW_WIDTH, "row_width"), hid)
    return Plan._wrap(h, cap, dp_, mb, row_width)
