"""maskpack.Layout: one description of a variable-length batch, every backend's input derived from it."""

from __future__ import annotations

import re
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _maskpack
from . import _rule
from ._errors import Error
from ._moves import (_ALIGNS, _LOSS_MODES, _PACK_PLAN, _PLACEMENTS as _PADDED_PLACEMENTS, _SCHEMES,
                     _UNPACK_PLAN, _Move, _alloc_like, _apply, _as_torch, _check_grid, _fast_move, _numel,
                     _pick, _token_lead, _torch_path, cp_multiple, relayout)
from ._tensors import DTYPE_CODE, alloc, as_int_list, describe, describe_out, dtype_code, dtype_name, is_torch_tensor, compiling, placed as _placed
from ._runtime import cached as _cached, enum as _enum
from ._runtime import above as _above  # the layers above this one, by name (see there)
from ._tensors import _LAYOUT_TYPE  # check_layout's type, entered below once Layout is defined

__all__ = ["Layout", "mask2d_from_mask4d"]

# the C enums, as the extension exports them (maskpack._runtime.enum)
_PLACEMENTS = _enum("placement")
_MASK2D_CONV = _enum("mask2d_convention")
_MASK_CONV = _enum("mask_convention")
_CU_FORMS = _enum("cu_form")
_BOUNDARY = _enum("boundary")
_FILLS = _enum("fill")
NPU_LAYOUTS = _enum("npu_layout")
_NPU_LAYOUT_NAMES = {v: k for k, v in NPU_LAYOUTS.items()}
_NPU_MASK_KINDS = {v: k for k, v in _enum("npu_mask_kind").items()}
_NPU_MASKS: Dict[Any, Any] = {}  # the compressed NPU masks, one per (kind, shape, output kind) per process
_FLOAT_CODES = {DTYPE_CODE[n] for n in ("float16", "bfloat16", "float32", "float64")}


def _choice(value: Any, table: Dict[str, int], name: str, status: str) -> int:
    """A string option -> its code. Non-strings are TypeErrors, unknown strings maskpack.Errors."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {', '.join(map(repr, table))}, found {value!r}")
    if value not in table:
        raise Error(f"{name}: expected one of {', '.join(map(repr, table))}, found {value!r}", status, argument=name)
    return table[value]


def _int(v: Any, name: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, found {type(v).__name__} {v!r}")
    v = int(v)
    if not -(2 ** 63) <= v < 2 ** 63:  # the C library's int64, named here rather than as OverflowError
        raise Error(f"{name}: expected a value that fits int64, found {v}", "MASKPACK_ERR_OVERFLOW", argument=name)
    return v


def _alignment_refused(e: Error) -> Error:
    """The library's refusal of an unstated alignment (argument rule.alignment), worded for the keyword
    arguments: the policy is the library's (include/maskpack.h, MASKPACK_ALIGN_UNSTATED), the advice
    names ``alignment=``."""
    if e.status != "MASKPACK_ERR_CONVENTION" or e.argument != "rule.alignment" or not e.index:
        return e
    m = re.match(r"rule\.alignment: segment (\d+) has q_len (-?\d+) != kv_len (-?\d+);", e.message)
    if m is None:
        return e
    k, q, kv = m.groups()
    return Error(
        f"alignment: segment {k} has q_len {q} != kv_len {kv}; pass alignment='bottom_right' "
        "(flash-attn >= 2.1, NPU mode 3) or alignment='top_left' (torch SDPA is_causal, NPU mode 2) "
        "explicitly",
        "MASKPACK_ERR_CONVENTION",
        argument="alignment",
        index=(int(k),),
    )


def _build(fn: Any, *args: Any) -> Any:
    """Calls a constructor of the extension, rewording an unstated-alignment refusal (see above)."""
    try:
        return fn(*args)
    except Error as e:
        new = _alignment_refused(e)
        if new is e:
            raise
        raise new from None


# Every live layout by id(): torch.compile'd code names a layout by this key (maskpack._compile), so the
# traced graph never holds a Python object. Weak: the registry keeps no layout alive.
_LIVE: "weakref.WeakValueDictionary[int, Layout]" = weakref.WeakValueDictionary()


class Layout:
    """A batch described once: a list of segments on a token grid plus an attention rule.

    Build one with a ``from_*`` constructor; derive every consumer's input from it. Outputs are
    numpy arrays, or torch tensors when the layout was built from a torch tensor (bfloat16 outputs
    are always torch tensors). Layouts are immutable, hashable and picklable.
    """

    # _cache: layouts and copy plans derived from this one (immutable, so computed once per layout)
    # _info: the C layout's (rows, q_width, kv_width, packed, is_self, segments, tokens, max_seqlen,
    # max_seqlen_kv), read once: the layout is immutable, and torch.compile traces plain attributes
    __slots__ = ("_h", "_info", "_torch", "_align_explicit", "_cache", "__weakref__")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("use a constructor: Layout.from_lengths, from_mask2d, from_cu_seqlens, from_position_ids, "
                        "from_mask4d or from_segments")

    @classmethod
    def _wrap(cls, h: Any, torch: bool, align_explicit: bool = False) -> "Layout":
        obj = object.__new__(cls)
        obj._h = h
        obj._info = tuple(_maskpack.info(h))
        obj._torch = bool(torch)
        obj._align_explicit = bool(align_explicit)
        obj._cache = None
        _LIVE[id(obj)] = obj
        return obj

    # ---- constructors -------------------------------------------------------------------------

    @classmethod
    def from_lengths(cls, lengths: Any, placement: str = "right", capacity: Optional[int] = None,
                     **rule: Any) -> "Layout":
        """Sequence lengths -> a padded ([n, max(len, capacity)]) or packed layout.

        placement: "right" (padding after each sequence), "left" (padding before), "packed" (one
        THD row when capacity is None, else rows of ``capacity`` columns filled in order)."""
        lens = as_int_list(lengths, "lengths")
        pcode = _choice(placement, _PLACEMENTS, "placement", "MASKPACK_ERR_INVALID_ARGUMENT")
        cap = 0 if capacity is None else _int(capacity, "capacity")
        r, explicit = _rule.normalize(rule, None, "from_lengths")
        h = _maskpack.from_lengths(lens, pcode, cap, _rule.to_c(r, explicit))
        return cls._wrap(h, is_torch_tensor(lengths), explicit)

    @classmethod
    def from_mask2d(cls, mask: Any, convention: str = "keep", **rule: Any) -> "Layout":
        """[B,S] padding mask -> layout. convention "keep" (1 = token, HF attention_mask) or "doc_id"
        (1-based document id, 0 = pad). Float masks are rejected: their meaning is ambiguous."""
        code = _choice(convention, _MASK2D_CONV, "convention", "MASKPACK_ERR_CONVENTION")
        d, torch = describe(mask, "mask")
        if dtype_code(d) in _FLOAT_CODES:
            raise Error(
                f"mask: a float mask is ambiguous (keep? additive?); pass a bool or integer mask with "
                f"convention={convention!r}, found dtype {_dtype_of(d)}",
                "MASKPACK_ERR_DTYPE",
                argument="mask",
            )
        r, explicit = _rule.normalize(rule, None, "from_mask2d")
        h = _maskpack.from_mask2d(d, code, _rule.to_c(r, explicit))
        return cls._wrap(h, torch, explicit)

    @classmethod
    def from_cu_seqlens(cls, cu: Any, form: str = "te", total: Optional[int] = None, cu_padded: Any = None,
                        cu_kv: Any = None, **rule: Any) -> "Layout":
        """cu_seqlens -> packed layout. form "te" ([0, e1, ..., eN]) or "npu" ([e1, ..., eN]).

        total: stream length (default: the last end); cu_padded: TE cu_seqlens_padded slot offsets;
        cu_kv: key-side cu_seqlens in the same form for a cross layout (q_len != kv_len per segment,
        where ``alignment`` must be given)."""
        fcode = _choice(form, _CU_FORMS, "form", "MASKPACK_ERR_CONVENTION")
        d, torch = describe(cu, "cu_seqlens", list_dtype=np.int64)
        r, explicit = _rule.normalize(rule, None, "from_cu_seqlens")
        if cu_kv is not None:
            if total is not None or cu_padded is not None:
                raise TypeError("from_cu_seqlens(): cu_kv cannot be combined with total or cu_padded")
            dk, torch_k = describe(cu_kv, "cu_kv", list_dtype=np.int64)
            h = _build(_maskpack.from_cu_seqlens_qk, d, dk, fcode, _rule.to_c(r, explicit))
            torch = torch or torch_k
        else:
            tot = 0 if total is None else _int(total, "total")
            dp = None if cu_padded is None else describe(cu_padded, "cu_padded", list_dtype=np.int64)[0]
            h = _build(_maskpack.from_cu_seqlens, d, fcode, tot, dp, _rule.to_c(r, explicit))
        return cls._wrap(h, torch, explicit)

    @classmethod
    def from_nested(cls, nested: Any, **rule: Any) -> "Layout":
        """A torch nested (jagged) tensor ``[B, j, ...]`` (``torch.nested.nested_tensor(..., layout=torch.jagged)``,
        verl's model-engine batches) -> the packed layout of its sequences: ``nested.values()`` is a per-token
        tensor of it. A strided nested tensor, or a jagged one with holes (``lengths()`` set), is refused."""
        if not (is_torch_tensor(nested) and getattr(nested, "is_nested", False)):
            raise TypeError(f"nested: expected a torch nested tensor, found {type(nested).__name__}")
        try:
            offsets = nested.offsets()
        except Exception:
            raise Error("nested: a strided nested tensor has no offsets; build it with layout=torch.jagged",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="nested") from None
        if nested.lengths() is not None:
            raise Error("nested: a jagged tensor with holes (lengths() set) is not a packed batch",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="nested")
        if getattr(nested, "_ragged_idx", 1) != 1:
            raise Error("nested: the ragged dimension must be dim 1 ([B, j, ...])", "MASKPACK_ERR_SHAPE",
                        argument="nested")
        return cls.from_cu_seqlens(offsets.detach().to("cpu"), **rule)

    @classmethod
    def from_position_ids(cls, position_ids: Any, rule: str = "reset", **rule_kwargs: Any) -> "Layout":
        """position_ids ([T] packed, [B,S], or [3,B,S] M-RoPE: text row 0 decides) -> layout.

        ``rule`` names the boundary rule: "reset" (a sequence starts where the position equals the
        row minimum: HF's flash path) or "step" (at any step other than +1: HF's mask builders). A
        trailing run of two or more zeros is tail padding, not a run of length-1 sequences."""
        bcode = _choice(rule, _BOUNDARY, "rule", "MASKPACK_ERR_CONVENTION")
        d, torch = describe(position_ids, "position_ids", list_dtype=np.int64)
        r, explicit = _rule.normalize(rule_kwargs, None, "from_position_ids")
        h = _maskpack.from_position_ids(d, bcode, _rule.to_c(r, explicit))
        return cls._wrap(h, torch, explicit)

    @classmethod
    def from_mask4d(cls, mask: Any, *, convention: str) -> "Layout":
        """Dense [B,1,S,S] / [B,H,S,S] mask -> the layout (and rule) that reproduces it.

        convention is required: "keep" (True = attend), "masked" (True = excluded: Megatron, TE,
        Ascend) or "additive" (0 = attend, negative = excluded)."""
        code = _choice(convention, _MASK_CONV, "convention", "MASKPACK_ERR_CONVENTION")
        d, torch = describe(mask, "mask")
        h = _maskpack.from_mask4d(d, code)
        return cls._wrap(h, torch, True)

    @classmethod
    def from_segments(cls, segments: Sequence[Sequence[int]], n_rows: int, q_width: int,
                      kv_width: Optional[int] = None, packed: bool = False, **rule: Any) -> "Layout":
        """Explicit segments -> layout. Each segment is (row, q_start, q_len) for self-attention or
        (row, q_start, q_len, kv_start, kv_len); sorted by (row, q_start), non-overlapping."""
        segs = []
        try:
            items = list(segments)
        except TypeError:
            raise TypeError(f"segments: expected a list of tuples, found {type(segments).__name__}") from None
        for k, s in enumerate(items):
            if isinstance(s, (str, bytes)) or not hasattr(s, "__len__"):
                raise TypeError(f"segments[{k}]: expected a tuple, found {s!r}")
            if len(s) == 3:
                row, qs, ql = (_int(x, f"segments[{k}]") for x in s)
                segs.append((row, qs, ql, qs, ql))
            elif len(s) in (5, 6):
                vals = [_int(x, f"segments[{k}]") for x in s[:5]]
                if len(s) == 6 and s[5] is not None:
                    vals.append(_int(s[5], f"segments[{k}].q_pos"))
                segs.append(tuple(vals))
            else:
                raise TypeError(f"segments[{k}]: expected (row, q_start, q_len) or "
                                f"(row, q_start, q_len, kv_start, kv_len), found {len(s)} fields")
        nr = _int(n_rows, "n_rows")
        qw = _int(q_width, "q_width")
        kw = qw if kv_width is None else _int(kv_width, "kv_width")
        if not isinstance(packed, (bool, np.bool_)):
            raise TypeError(f"packed: expected a bool, found {packed!r}")
        r, explicit = _rule.normalize(rule, None, "from_segments")
        h = _build(_maskpack.from_segments, segs, nr, qw, kw, bool(packed), _rule.to_c(r, explicit))
        return cls._wrap(h, False, explicit)

    def with_rule(self, **rule: Any) -> "Layout":
        """Same segments under another rule. Keys not given keep their current value (pass
        ``spans=None`` / ``prefix=None`` / ``window=(-1, -1)`` to remove them)."""
        r, explicit = _rule.normalize(rule, self.rule, "with_rule")
        explicit = explicit or self._align_explicit
        h = _build(_maskpack.with_rule, self._h, _rule.to_c(r, explicit))
        return type(self)._wrap(h, self._torch, explicit)

    def with_outputs(self, kind: str) -> "Layout":
        """The same layout returning "numpy" arrays or "torch" tensors from its methods."""
        if kind not in ("numpy", "torch"):
            raise TypeError(f"kind: expected 'numpy' or 'torch', found {kind!r}")
        return type(self)._wrap(self._h, kind == "torch", self._align_explicit)

    # ---- properties ---------------------------------------------------------------------------

    @property
    def n_rows(self) -> int:
        """Rows of the token grid: B for a padded batch [B,S], 1 for a packed one."""
        return self._info[0]

    @property
    def q_width(self) -> int:
        """Query columns per row: S for a padded batch [B,S], T (all tokens, padding
        included) for a packed one."""
        return self._info[1]

    @property
    def kv_width(self) -> int:
        """Key columns per row (equal to :attr:`q_width` for self-attention; under CP
        a shard's keys are the whole batch's)."""
        return self._info[2]

    @property
    def packed(self) -> bool:
        """True for a packed (THD) layout: one row, per-token tensors [T, ...] rather
        than [1, T, ...]."""
        return self._info[3]

    @property
    def is_self(self) -> bool:
        """True when every segment attends to itself (kv == q)."""
        return self._info[4]

    @property
    def n_segments(self) -> int:
        return self._info[5]

    @property
    def n_tokens(self) -> int:
        """Real query tokens: the sum of the segments' lengths (padding excluded)."""
        return self._info[6]

    @property
    def max_seqlen(self) -> int:
        """The longest segment's real (query) length, 0 for none; padding and CP
        alignment not counted (:meth:`cu_seqlens_padded` has the slots)."""
        return self._info[7]

    @property
    def max_seqlen_kv(self) -> int:
        return self._info[8]

    @property
    def seqlens(self):
        """int32 [N]: the real (query) length of each segment."""
        return self._seqlens(False)

    @property
    def seqlens_kv(self):
        """int32 [N]: the key length of each segment."""
        return self._seqlens(True)

    def _seqlens(self, kv: bool):
        obj = alloc((self.n_segments,), "int32", self._torch)
        _maskpack.seqlens(self._h, kv, obj)
        return obj

    @property
    def segments(self) -> List[Tuple[int, int, int, int, int]]:
        """[(row, q_start, q_len, kv_start, kv_len), ...] sorted by (row, q_start)."""
        return [tuple(s[:5]) for s in _maskpack.segments(self._h)]

    @property
    def rule(self) -> Dict[str, Any]:
        """{"causal", "alignment", "window", "spans", "prefix"}: usable as keyword arguments."""
        return _rule.from_c(_maskpack.rule(self._h))

    # ---- derived outputs ----------------------------------------------------------------------

    def _per_token_shape(self) -> Tuple[int, ...]:
        info = self._info
        return (info[1],) if info[3] else (info[0], info[1])

    def _fill(self, fn, shape, dtype, what="dtype", device=None, pin_memory=False):
        obj = alloc(shape, dtype_name(dtype, what), self._torch)
        fn(self._h, obj)
        return _placed(obj, device, pin_memory)

    def cu_seqlens(self, form: str = "te", kv: bool = False, dtype: Any = "int32", device: Any = None, pin_memory: bool = False):
        """TE form [0, e1, ..., eN] (N+1) or NPU form [e1, ..., eN] (N) cumulative real lengths.

        Every derived output takes ``device=`` (a torch device: the result is a torch tensor there) and
        ``pin_memory=True`` (page-locked host memory, copied with non_blocking=True when a device is
        given too)."""
        if compiling():
            return _above("compile").derived(self, "cu_seqlens", dict(form=form, kv=kv, dtype=dtype), device)
        fcode = _choice(form, _CU_FORMS, "form", "MASKPACK_ERR_CONVENTION")
        n = self.n_segments + (1 if fcode == _CU_FORMS["te"] else 0)
        obj = alloc((n,), dtype_name(dtype), self._torch)
        _maskpack.cu_seqlens(self._h, fcode, bool(kv), obj)
        return _placed(obj, device, pin_memory)

    def cu_seqlens_padded(self, dtype: Any = "int32", device: Any = None, pin_memory: bool = False):
        """[N+1] TE cu_seqlens_padded: slot offsets in the flattened token grid."""
        if compiling():
            return _above("compile").derived(self, "cu_seqlens_padded", dict(dtype=dtype), device)
        return self._fill(_maskpack.cu_seqlens_padded, (self.n_segments + 1,), dtype,
                          device=device, pin_memory=pin_memory)

    def mask2d(self, dtype: Any = "bool", device: Any = None, pin_memory: bool = False):
        """Per-token keep mask ([B,S], or [T] when packed): True = real token."""
        if compiling():
            return _above("compile").derived(self, "mask2d", dict(dtype=dtype), device)
        return self._fill(_maskpack.mask2d, self._per_token_shape(), dtype,
                          device=device, pin_memory=pin_memory)

    def mask4d(self, convention: str, dtype: Any = None, fill: Any = "-inf", heads: int = 1, device: Any = None, pin_memory: bool = False):
        """Dense [B, heads, S, Skv] mask. convention is required: "keep" (True = attend, torch SDPA),
        "masked" (True = excluded: Megatron/TE/Ascend) or "additive" (0 / fill; fill "-inf" or "min"
        = the dtype's most negative finite value as HF eager uses). Default dtype: bool, or float32
        for additive."""
        if compiling():
            return _above("compile").derived(self, "mask4d", dict(convention=convention, dtype=dtype, fill=fill, heads=heads), device)
        code = _choice(convention, _MASK_CONV, "convention", "MASKPACK_ERR_CONVENTION")
        if dtype is None:
            dtype = "float32" if code == _MASK_CONV["additive"] else "bool"
        if isinstance(fill, float) and fill == float("-inf"):
            fill = "-inf"
        fcode = _choice(fill, _FILLS, "fill", "MASKPACK_ERR_INVALID_ARGUMENT")
        nh = _int(heads, "heads")
        if nh < 1:
            raise Error(f"heads: expected >= 1, found {nh}", "MASKPACK_ERR_INVALID_ARGUMENT", argument="heads")
        info = self._info
        obj = alloc((info[0], nh, info[1], info[2]), dtype_name(dtype), self._torch)
        _maskpack.mask4d(self._h, code, fcode, obj)
        return _placed(obj, device, pin_memory)

    def position_ids(self, dtype: Any = "int64", device: Any = None, pin_memory: bool = False):
        """Per-token positions 0, 1, 2, ... restarting at each segment (pads 0)."""
        if compiling():
            return _above("compile").derived(self, "position_ids", dict(dtype=dtype), device)
        return self._fill(_maskpack.position_ids, self._per_token_shape(), dtype,
                          device=device, pin_memory=pin_memory)

    def segment_ids(self, dtype: Any = "int64", device: Any = None, pin_memory: bool = False):
        """Per-token 1-based segment id (global order), 0 = pad."""
        if compiling():
            return _above("compile").derived(self, "segment_ids", dict(dtype=dtype), device)
        return self._fill(_maskpack.segment_ids, self._per_token_shape(), dtype,
                          device=device, pin_memory=pin_memory)

    def valid_indices(self, dtype: Any = "int64", device: Any = None, pin_memory: bool = False):
        """[V] flattened indices (b*S + s) of the real tokens (flash-attn unpad_input's indices)."""
        if compiling():
            return _above("compile").derived(self, "valid_indices", dict(dtype=dtype), device)
        return self._fill(_maskpack.valid_indices, (self.n_tokens,), dtype,
                          device=device, pin_memory=pin_memory)

    def last_token_index(self, dtype: Any = "int64", device: Any = None, pin_memory: bool = False):
        """[N] flattened index of each segment's last real token, -1 for an empty segment."""
        if compiling():
            return _above("compile").derived(self, "last_token_index", dict(dtype=dtype), device)
        return self._fill(_maskpack.last_token_index, (self.n_segments,), dtype,
                          device=device, pin_memory=pin_memory)

    def block_mask(self, block_q: int = 128, block_k: int = 128, device: Any = None,
                   pin_memory: bool = False) -> Dict[str, Any]:
        """FlexAttention BlockMask arrays, int32, shaped [B, 1, ...] (one broadcast head).

        Keys: kv_num_blocks [B,1,Qb], kv_indices [B,1,Qb,Kb], full_kv_num_blocks, full_kv_indices,
        q_num_blocks [B,1,Kb], q_indices [B,1,Kb,Qb], full_q_num_blocks, full_q_indices (entries past
        each count are 0), block_size (block_q, block_k) and seq_lengths (S, Skv)."""
        bq = _int(block_q, "block_q")
        bk = _int(block_k, "block_k")
        qb, kb = _maskpack.block_mask_dims(self._h, bq, bk)
        b = self.n_rows
        shapes = {
            "kv_num_blocks": (b, 1, qb),
            "kv_indices": (b, 1, qb, kb),
            "full_kv_num_blocks": (b, 1, qb),
            "full_kv_indices": (b, 1, qb, kb),
            "q_num_blocks": (b, 1, kb),
            "q_indices": (b, 1, kb, qb),
            "full_q_num_blocks": (b, 1, kb),
            "full_q_indices": (b, 1, kb, qb),
        }
        out: Dict[str, Any] = {name: alloc(shape, "int32", self._torch) for name, shape in shapes.items()}
        _maskpack.block_mask(self._h, bq, bk, tuple(out.values()))
        out = {k: _placed(v, device, pin_memory) for k, v in out.items()}
        out["block_size"] = (bq, bk)
        out["seq_lengths"] = (self.q_width, self.kv_width)
        return out

    def flex_block_mask(self, block_q: int = 128, block_k: int = 128):
        """A torch FlexAttention ``BlockMask`` built from :meth:`block_mask` (needs torch). Its
        mask_mod reads the dense predicate for the partial blocks."""
        from torch.nn.attention.flex_attention import BlockMask

        arrays = self.with_outputs("torch").block_mask(block_q, block_k)
        allowed = self.with_outputs("torch").allowed()

        def mask_mod(b, h, q_idx, kv_idx):
            return allowed[b, q_idx, kv_idx]

        return BlockMask.from_kv_blocks(
            arrays["kv_num_blocks"],
            arrays["kv_indices"],
            arrays["full_kv_num_blocks"],
            arrays["full_kv_indices"],
            BLOCK_SIZE=(int(block_q), int(block_k)),
            mask_mod=mask_mod,
            seq_lengths=(self.q_width, self.kv_width),
        )

    def magi_slices(self):
        """MagiAttention slices -> (q_ranges [n,2] int32, k_ranges [n,2] int32, types [n] int32),
        half-open ranges over flattened token indices; types FULL=0, CAUSAL=1 (bottom-right),
        INVCAUSAL=2, BICAUSAL=3. Windows are not representable (maskpack.Error)."""
        n = _maskpack.magi_slices(self._h, None, None, None, 0)
        q = alloc((n, 2), "int32", self._torch)
        k = alloc((n, 2), "int32", self._torch)
        t = alloc((n,), "int32", self._torch)
        got = _maskpack.magi_slices(self._h, q, k, t, n)
        if got != n:  # the layout is immutable: a different count means a library bug
            raise RuntimeError(f"magi_slices: sized {n} slices, filled {got}")
        return q, k, t

    def npu_args(self, input_layout: str = "TND", scale: Optional[float] = None,
                 head_dim: Optional[int] = None) -> Dict[str, Any]:
        """Keyword arguments for ``torch_npu.npu_fusion_attention`` computing this layout's predicate.

        Keys spelled as the operator spells them: input_layout, atten_mask (bool M-mask or None),
        sparse_mode, pre_tockens, next_tockens, scale, inner_precise, actual_seq_qlen and
        actual_seq_kvlen (NPU-form lists for TND, else None), prefix (list or None). Diagnostics
        that are not operator arguments start with ``maskpack_``: maskpack_mask_kind,
        maskpack_pad_items (TND: True where an item is declared filler), maskpack_fully_masked_rows
        (query rows of real tokens that see nothing) and maskpack_fully_masked_pad_rows (padding rows
        that see nothing: never read, but they too make inner_precise 2).
        Drop them with ``{k: v for k, v in args.items() if not k.startswith("maskpack_")}``.
        scale: the softmax scale; or give head_dim for 1/sqrt(head_dim) (the operator's own default
        is 1.0, a classic bug, so one of them is required)."""
        il = _choice(input_layout, NPU_LAYOUTS, "input_layout", "MASKPACK_ERR_INVALID_ARGUMENT")
        if scale is None:
            sc = 0.0
        elif isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
            raise TypeError(f"scale: expected a float, found {scale!r}")
        else:
            sc = float(scale)
        hd = 0 if head_dim is None else _int(head_dim, "head_dim")
        torch_out = self._torch

        def factory(shape, kind):
            # the compressed masks (kinds 1 and 2) depend on nothing but their kind: built once per
            # process and shared (read-only inputs of the operator)
            if kind in (1, 2):
                key = (kind, tuple(shape), torch_out)
                cached = _NPU_MASKS.get(key)
                if cached is not None:
                    return cached, None
                fresh_key.append(key)  # kept once filled (below): a failed fill must not be cached
            mask = alloc(shape, "bool", torch_out)
            return mask, mask

        fresh_key: list = []

        t = _maskpack.npu_args(self._h, il, sc, hd, factory)
        if fresh_key:
            _NPU_MASKS[fresh_key[0]] = t[7]
        (layout_code, mode, pre, nxt, scale_out, ip, kind, mask, ql, kl, prefix, pad, fully, fully_pad) = t
        return {
            "input_layout": _NPU_LAYOUT_NAMES.get(layout_code, str(layout_code)),
            "atten_mask": mask,
            "sparse_mode": mode,
            "pre_tockens": pre,
            "next_tockens": nxt,
            "scale": scale_out,
            "inner_precise": ip,
            "actual_seq_qlen": ql,
            "actual_seq_kvlen": kl,
            "prefix": prefix,
            "maskpack_mask_kind": _NPU_MASK_KINDS.get(kind, str(kind)),
            "maskpack_pad_items": pad,
            "maskpack_fully_masked_rows": fully,
            "maskpack_fully_masked_pad_rows": fully_pad,
        }

    def allowed(self):
        """The dense predicate [B, S, Skv] bool (True = query i of row b may attend key j)."""
        b, s, skv = (self._info[i] for i in (0, 1, 2))
        obj = alloc((b, s, skv), "bool", self._torch)
        # the [B,S,Skv] buffer viewed as [B,1,S,Skv] for maskpack_mask4d (the head dim has size 1)
        _maskpack.mask4d(self._h, _MASK_CONV["keep"], _FILLS["-inf"], obj[:, None])
        return obj

    def allowed_at(self, b: int, i: int, j: int, h: int = 0) -> bool:
        """Reference predicate for one pair (out-of-grid -> False)."""
        return _maskpack.allowed(self._h, _int(b, "b"), _int(h, "h"), _int(i, "i"), _int(j, "j"))

    def segment_of_query(self, b: int, i: int) -> int:
        """Index of the segment owning query column i of row b, or -1 for padding."""
        return _maskpack.segment_of_query(self._h, _int(b, "b"), _int(i, "i"))

    # ---- layouts of the same sequences ---------------------------------------------------------

    def _derived(self, h):
        return type(self)._wrap(h, self._torch, self._align_explicit)

    def packed_of(self):
        """The packed (THD) layout of the same sequences in order, without gaps (flash-attn's unpad);
        the layout itself when it already is one (packed, every column a token of a self-attention
        segment), so moves between the two are no moves at all."""
        info = self._info
        if info[3] and info[4] and info[6] == info[1]:
            return self
        return _cached(self, "packed_of", lambda: self._derived(_maskpack.packed_of(self._h)))

    def padded_of(self, placement: str = "right", width: Optional[int] = None):
        """One sequence per row, padded on the right or the left to ``width`` (default: the longest)."""
        return self._derived(_maskpack.padded_of(self._h, _pick(placement, _PADDED_PLACEMENTS, "placement"),
                                                 0 if width is None else int(width)))

    def pad_to_multiple(self, multiple: int):
        """Each sequence's slot (packed) or the row width (padded) padded up to a multiple, explicitly."""
        return self._derived(_maskpack.pad_to_multiple(self._h, int(multiple)))

    def _cp_global(self, cp_size: int, tp: int, align: Optional[str], scheme: str = "zigzag"):
        """The layout a CP split cuts: every slot padded to cp_multiple (zigzag, contiguous), or, for
        Ulysses (verl's ulysses_pad_and_slice_inputs), only the total of a packed stream padded up to a
        multiple of cp * tp at its end (a padded batch: its row width), then cut contiguously."""
        if align is None:
            return self
        if scheme == "ulysses":
            return self.pad_total_to_multiple(int(cp_size) * int(tp))
        return self.pad_to_multiple(cp_multiple(cp_size, tp, align))

    def pad_total_to_multiple(self, multiple: int):
        """A packed stream padded at its end (one padding run after the last slot) so that its token count
        divides by ``multiple`` (FP8 and other kernels that need token counts in multiples of 16); a
        padded layout: its row width rounded up (as pad_to_multiple)."""
        m = int(multiple)
        if m < 1:
            raise Error(f"multiple: expected >= 1, found {m}", "MASKPACK_ERR_INVALID_ARGUMENT", argument="multiple")
        info = self._info
        if not info[3]:
            return self.pad_to_multiple(m)
        total = -(-info[1] // m) * m
        if total == info[1]:
            return self
        return _cached(self, ("pad total", m), lambda: self._derived(_maskpack.from_segments(
            [tuple(sg[:5]) + ((sg[5],) if sg[5] is not None else ()) for sg in _maskpack.segments(self._h)],
            1, total, total if info[4] else info[2] + (total - info[1]), True, _maskpack.rule(self._h))))

    def cp_shard(self, cp_size: int, cp_rank: int, scheme: str = "zigzag", tp: int = 1,
                 align: Optional[str] = "verl"):
        """The layout of CP rank ``cp_rank`` of ``cp_size``: its queries are the rank's tokens, its keys
        the whole (aligned) batch. ``align`` pads every sequence (packed) or row (padded) explicitly to
        ``cp_multiple(cp_size, tp, align)``; ``align=None`` requires divisibility and fails otherwise."""
        sch = _pick(scheme, _SCHEMES, "scheme")
        if align is not None:
            _pick(align, _ALIGNS, "align")
        key = ("cp_shard", int(cp_size), int(cp_rank), scheme, int(tp), align)
        return _cached(self, key, lambda: self._derived(_maskpack.cp_shard(
            self._cp_global(cp_size, tp, align, scheme)._h, int(cp_size), int(cp_rank), sch)))

    def cp_shard_indices(self, cp_size: int, cp_rank: int, scheme: str = "zigzag", tp: int = 1,
                         align: Optional[str] = "verl", dtype: Any = "int64", device: Any = None,
                         pin_memory: bool = False):
        """int [local tokens]: flattened index, in the aligned layout, of each token of the rank's shard
        (TransformerEngine's thd_get_partitioned_indices for packed layouts)."""
        if compiling():
            return _above("compile").derived(self, "cp_shard_indices", dict(cp_size=int(cp_size), cp_rank=int(cp_rank),
                                                                            scheme=scheme, tp=int(tp), align=align, dtype=dtype),
                                             device)
        g = self._cp_global(cp_size, tp, align, scheme)
        n = g.n_rows * g.q_width // int(cp_size) if int(cp_size) > 0 else 0
        obj = alloc((n,), dtype_name(dtype), self._torch)
        _maskpack.cp_shard_indices(g._h, int(cp_size), int(cp_rank), _pick(scheme, _SCHEMES, "scheme"), obj)
        return _placed(obj, device, pin_memory)

    # ---- tensor moves -------------------------------------------------------------------------

    # pack and unpack into a given ``out`` run once per step on small tensors, where each microsecond
    # of Python shows: their plans are kept under fixed keys (the packed layout lives in the same
    # cache, so no identity check is needed) and tried on the extension's fast path first.

    def pack(self, x: Any, out: Any = None, threads: Optional[int] = None, engine: Optional[str] = None):
        """Per-token tensor of this layout -> [n_tokens, ...] packed without gaps (flash-attn unpad).
        Differentiable; any torch device (see :func:`relayout`)."""
        if out is None and compiling():
            return _above("compile").move([x], [self], None, "pack", 0, threads, engine)
        c = self._cache
        if engine is None and c is not None and _fast_move(c.get(_PACK_PLAN), x, out, 0, threads):
            return out
        dst = self.packed_of()
        move = _cached(self, _PACK_PLAN, lambda: _Move.create([self], dst))
        return _apply(move, [self], dst, [x], out, 0, threads, engine)

    def unpack(self, x: Any, pad_value: Any = 0, out: Any = None, threads: Optional[int] = None,
               engine: Optional[str] = None):
        """[n_tokens, ...] packed tensor -> this layout, padding filled with ``pad_value``.
        Differentiable (pad slots take no gradient); any torch device (see :func:`relayout`)."""
        if out is None and compiling():
            return _above("compile").move([x], [self], None, "unpack", pad_value, threads, engine)
        c = self._cache
        if engine is None and c is not None and _fast_move(c.get(_UNPACK_PLAN), x, out, pad_value, threads):
            return out
        src = self.packed_of()
        move = _cached(self, _UNPACK_PLAN, lambda: _Move.create([src], self))
        return _apply(move, [src], self, [x], out, pad_value, threads, engine)

    def to_nested(self, x: Any, threads: Optional[int] = None, engine: Optional[str] = None):
        """Per-token torch tensor of this layout -> a torch nested (jagged) tensor ``[n_segments, j, ...]``, one
        component per sequence (verl's model-engine outputs). Differentiable: the components are views of
        the packed move's result. ``Layout.from_nested`` reads such a tensor back."""
        import torch

        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch tensor, found {type(x).__name__}")
        if x.is_nested:
            x = relayout(x, type(self).from_nested(x), self)
        values = self.pack(x, threads=threads, engine=engine)
        offsets = torch.as_tensor(self.packed_of().cu_seqlens(dtype="int64")).to(values.device)
        return torch.nested.nested_tensor_from_jagged(values, offsets)

    def shard(self, x: Any, cp_size: int, cp_rank: int, scheme: str = "zigzag", tp: int = 1,
              align: Optional[str] = "verl", pad_value: Any = 0, out: Any = None, threads: Optional[int] = None,
              engine: Optional[str] = None):
        """Per-token tensor of this layout -> CP rank ``cp_rank``'s part (shape of ``cp_shard(...)``).
        Differentiable: the part's gradient lands in the whole's tokens, zero elsewhere."""
        if out is None and compiling():
            return _above("compile").move([x], [self], None, f"shard,{int(cp_size)},{int(cp_rank)},{scheme},{int(tp)},{align}",
                                          pad_value, threads, engine)
        return relayout(x, self, self.cp_shard(cp_size, cp_rank, scheme, tp, align), out=out, pad_value=pad_value,
                        threads=threads, engine=engine)

    # ---- labels, losses, last tokens ----------------------------------------------------------

    def shift_labels(self, labels: Any, ignore_index: int = -100, out: Any = None, engine: Optional[str] = None,
                     shift: int = 1):
        """Next-token labels inside each sequence: out[t] = labels[t+1] within a sequence, ignore_index
        on each sequence's last token and on padding. Shift before sharding. Labels on an accelerator
        are shifted there (torch indexing with an index the C library derives once per device);
        ``engine="torch"`` takes that path on the CPU too. ``shift=k`` rolls by k tokens (a
        multi-token-prediction head at depth d takes ``shift=d + 1``): out[t] = labels[t+k] within a
        sequence, ignore_index on each sequence's last k tokens."""
        if isinstance(shift, bool) or not isinstance(shift, (int, np.integer)) or shift < 1:
            raise Error(f"shift: expected an int >= 1, found {shift!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="shift")
        if shift > 1:  # k shifts inside each sequence: each one moves the ignored tail one token further
            out_k = self.shift_labels(labels, ignore_index, None, engine)
            for _ in range(int(shift) - 2):
                out_k = self.shift_labels(out_k, ignore_index, None, engine)
            return self.shift_labels(out_k, ignore_index, out, engine)
        if out is None and is_torch_tensor(labels) and compiling():
            return _above("compile").shift_labels(self, labels, int(ignore_index))
        if _torch_path(labels, engine):
            return self._shift_labels_torch(labels, int(ignore_index), out)
        d = describe(labels, "labels")[0]
        if out is None:
            out = _alloc_like(labels, tuple(d.shape))
        od = describe_out(out, "out")[0]
        _maskpack.shift_labels(self._h, d, int(ignore_index), od)
        return out

    def _shift_index(self) -> np.ndarray:
        """int64 [tokens]: the flat index of each token's label after the shift, -1 where ignore_index
        goes: the C shift run over a token counter."""
        def make():
            grid = self._per_token_shape()
            counter = np.arange(_numel(grid), dtype=np.int64).reshape(grid)
            return np.asarray(self.with_outputs("numpy").shift_labels(counter, ignore_index=-1)).reshape(-1)
        return _cached(self, "shift index", make)

    def _shift_labels_torch(self, labels, ignore_index: int, out):
        import torch

        grid = self._per_token_shape()
        _check_grid(labels, grid, "labels")
        if labels.dim() != len(grid) or labels.dtype not in (torch.int32, torch.int64):
            raise Error(f"labels: expected an int32 or int64 tensor of shape {list(grid)}, found {labels.dtype} "
                        f"{list(labels.shape)}", "MASKPACK_ERR_SHAPE", argument="labels")

        def make():
            idx = self._shift_index()
            return (torch.from_numpy(np.maximum(idx, 0)).to(labels.device),
                    torch.from_numpy(np.nonzero(idx < 0)[0]).to(labels.device))
        take, ignore = _cached(self, ("shift index", str(labels.device)), make)
        res = labels.reshape(-1).index_select(0, take).index_fill_(0, ignore, ignore_index).view(grid)
        if out is None:
            return res
        if not is_torch_tensor(out) or out.device != labels.device or out.dtype != labels.dtype:
            raise Error(f"out: expected a {labels.dtype} tensor on {labels.device} (as labels)",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="out")
        return out.copy_(res)

    def loss_weights(self, mode: str = "token", labels: Any = None, ignore_index: int = -100,
                     dtype: Any = "float32", return_denominator: bool = False, device: Any = None,
                     pin_memory: bool = False, engine: Optional[str] = None):
        """Per-token weights with sum(loss * w) == the mean loss ("token": over labelled tokens,
        "sequence": mean of per-sequence means). ``labels`` are the shifted labels (None: every token but
        each sequence's last). Shard the weights like any per-token tensor: per-rank sums add up to the
        exact global mean. Labels on an accelerator give weights there (the same values as the C
        library's, computed in float64 and rounded once; the denominator then costs a device sync)."""
        code = _pick(mode, _LOSS_MODES, "mode")
        if compiling() and not return_denominator:
            if labels is None:
                return _above("compile").derived(self, "loss_weights", dict(mode=mode, ignore_index=int(ignore_index),
                                                                            dtype=dtype), device)
            if is_torch_tensor(labels):
                return self._loss_weights_torch(code, labels, int(ignore_index), dtype_name(dtype), False, device)
        if _torch_path(labels, engine):
            return self._loss_weights_torch(code, labels, int(ignore_index), dtype_name(dtype), return_denominator,
                                            device)
        ld = None if labels is None else describe(labels, "labels")[0]
        name = dtype_name(dtype)
        if name not in ("float32", "float64", "bfloat16", "float16"):
            raise Error(f"dtype: expected a floating dtype (float32, float64, bfloat16, float16), found {name}",
                        "MASKPACK_ERR_DTYPE", argument="dtype")
        # bfloat16 / float16 weights: computed in float32 and rounded once
        obj = alloc(self._per_token_shape(), name if name in ("float32", "float64") else "float32", self._torch)
        denom = _maskpack.loss_weights(self._h, ld, int(ignore_index), code, obj)
        if name not in ("float32", "float64"):
            import torch

            obj = torch.as_tensor(obj).to(getattr(torch, name))
        obj = _placed(obj, device, pin_memory)
        return (obj, denom) if return_denominator else obj

    def _loss_weights_torch(self, code: int, labels, ignore_index: int, dtype: str, return_denominator: bool,
                            device: Any):
        import torch

        grid = self._per_token_shape()
        if dtype not in ("float32", "float64", "bfloat16", "float16"):
            raise Error(f"dtype: expected a floating dtype, found {dtype}", "MASKPACK_ERR_DTYPE", argument="dtype")
        if labels is not None:
            labels = _as_torch(labels, "labels")
            _check_grid(labels, grid, "labels")
        dev = labels.device if labels is not None else torch.device(device if device is not None else "cpu")
        if compiling():
            seg = _above("compile").derived(self, "segment_ids", {"dtype": "int64"}, dev).reshape(-1)
        else:
            seg = _cached(self, ("segment ids", str(dev)), lambda: torch.as_tensor(
                np.asarray(self.with_outputs("numpy").segment_ids())).reshape(-1).to(dev))
        if labels is None:  # every token but each sequence's last: the tokens the shift gives a label
            lab = _cached(self, ("shifted", str(dev)), lambda: torch.from_numpy(self._shift_index() >= 0).to(dev))
        else:
            lab = (labels.reshape(-1) != ignore_index) & (seg > 0)
        per_seq = torch.zeros(self.n_segments + 1, dtype=torch.float64, device=dev).index_add_(
            0, seg, lab.to(torch.float64))
        per_seq[0] = 0  # padding belongs to no sequence
        if code == _LOSS_MODES["token"]:
            denom = per_seq.sum()
            w = torch.where(lab, 1.0 / denom, 0.0)
        else:
            denom = (per_seq > 0).sum().to(torch.float64)
            w = torch.where(lab, 1.0 / (per_seq[seg] * denom), 0.0)
        if dtype in ("bfloat16", "float16"):
            w = w.to(torch.float32)  # rounded as the host path: float64 -> float32 -> the narrow type
        w = w.to(getattr(torch, dtype)).view(grid)
        return (w, float(denom)) if return_denominator else w

    def cp_last_token(self, cp_size: int, scheme: str = "zigzag", tp: int = 1, align: Optional[str] = "verl",
                      dtype: Any = "int64", device: Any = None, pin_memory: bool = False):
        """(rank [N], local [N]): the CP rank holding each sequence's last token and its flattened index
        in that rank's shard (-1 for empty sequences)."""
        g = self._cp_global(cp_size, tp, align, scheme)
        r = alloc((self.n_segments,), dtype_name(dtype), self._torch)
        l = alloc((self.n_segments,), dtype_name(dtype), self._torch)
        _maskpack.cp_last_token(g._h, int(cp_size), _pick(scheme, _SCHEMES, "scheme"), r, l)
        return _placed(r, device, pin_memory), _placed(l, device, pin_memory)

    def gather_last_tokens(self, x: Any):
        """Per-token tensor [B,S,...] / [T,...] -> [N, ...]: each sequence's last real token (for reward
        and value heads). Empty sequences give zeros. Differentiable, on x's device (torch indexing
        with an index kept on the layout per device)."""
        lead = _token_lead(self)
        if is_torch_tensor(x):
            import torch

            _check_grid(x, self._per_token_shape(), "x")
            if compiling():
                idx = _above("compile").derived(self, "last_token_index", {"dtype": "int64"}, x.device)
                rows = x.reshape((-1,) + tuple(x.shape[lead:])).index_select(0, idx.clamp(min=0))
                keep = (idx >= 0).reshape((-1,) + (1,) * (rows.dim() - 1))
                return torch.where(keep, rows, torch.zeros((), dtype=rows.dtype, device=rows.device))
            key = ("last tokens", str(x.device))
            idx, empty = _cached(self, key, lambda: self._last_token_index_on(x.device))
            flat = x.reshape((-1,) + tuple(x.shape[lead:]))
            rows = flat.index_select(0, idx)
            if empty is not None:
                rows = rows.index_fill(0, empty, 0)
            return rows
        a = np.asarray(x)
        flat = a.reshape((-1,) + a.shape[lead:])
        idx = np.asarray(self.last_token_index(dtype="int64"))
        rows = flat[np.maximum(idx, 0)].copy()
        rows[idx < 0] = 0
        return rows

    def _last_token_index_on(self, device):
        import torch

        idx = np.asarray(self.last_token_index(dtype="int64"))
        if not isinstance(idx, np.ndarray):
            idx = idx.numpy()
        empty = np.nonzero(idx < 0)[0]
        return (torch.from_numpy(np.maximum(idx, 0)).to(device),
                torch.from_numpy(empty).to(device) if empty.size else None)

    # ---- protocol -----------------------------------------------------------------------------

    def _key(self):
        info = self._info
        r = _maskpack.rule(self._h)
        return (info[0], info[1], info[2], info[3], tuple(_maskpack.segments(self._h)),
                (r[0], r[1], r[2], r[3], tuple(tuple(s) for s in r[4]), None if r[5] is None else tuple(r[5])))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Layout):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self):
        info = self._info
        segs = [tuple(s) if s[5] is not None else tuple(s[:5]) for s in _maskpack.segments(self._h)]
        return (_rebuild, (segs, info[0], info[1], info[2], info[3], _maskpack.rule(self._h), self._torch,
                           self._align_explicit))

    def __repr__(self) -> str:
        info = self._info
        r = self.rule
        parts = ["causal" if r["causal"] else "bidirectional"]
        if not info[4] or r["alignment"] != "bottom_right":
            parts.append(r["alignment"])
        if tuple(r["window"]) != (-1, -1):
            parts.append(f"window={tuple(r['window'])}")
        if r["spans"]:
            parts.append(f"{len(r['spans'])} spans")
        if r["prefix"] is not None:
            parts.append("prefix")
        grid = f"packed T={info[1]}" if info[3] else f"[{info[0]}, {info[1]}]"
        if info[2] != info[1]:
            grid += f" kv={info[2]}"
        lens = [s[2] for s in _maskpack.segments(self._h)]
        shown = ", ".join(map(str, lens[:8])) + (", ..." if len(lens) > 8 else "")
        return (f"Layout({grid}, {info[5]} segments [{shown}], {info[6]} tokens, {' '.join(parts)})")


_LAYOUT_TYPE.append(Layout)  # check_layout's type (maskpack._tensors is below this module)


def _rebuild(segs, n_rows, q_width, kv_width, packed, rule_t, torch, align_explicit):
    h = _maskpack.from_segments(segs, n_rows, q_width, kv_width, packed, rule_t)
    return Layout._wrap(h, torch, align_explicit)


def _dtype_of(d: Any) -> str:
    from ._tensors import DTYPE_NAMES

    return DTYPE_NAMES[dtype_code(d)]


def mask2d_from_mask4d(mask: Any, convention: str, dtype: Any = "bool"):
    """[B,1,S,S] / [B,H,S,S] / [B,1,1,S] / [B,S] mask -> [B,S] keep mask: token s is valid iff its key
    column is not fully masked (some query, any head, attends to it). convention is required."""
    code = _choice(convention, _MASK_CONV, "convention", "MASKPACK_ERR_CONVENTION")
    d, torch = describe(mask, "mask")
    shape = tuple(d.shape)
    if len(shape) not in (2, 4):
        raise Error(f"mask: expected [B,S], [B,1,1,S], [B,1,S,S] or [B,H,S,S], found shape {list(shape)}",
                    "MASKPACK_ERR_SHAPE", argument="mask")
    obj = alloc((shape[0], shape[-1]), dtype_name(dtype), torch)
    _maskpack.mask2d_from_mask4d(d, code, obj)
    return obj
