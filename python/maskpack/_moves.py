"""The move engine: per-token tensors between layouts (pack, unpack, context-parallel shard and gather,
label shifting, loss weights and last tokens are maskpack.Layout's methods, in _layout.py, over this
layer; relayout and cp_gather are its public functions). Every move is one pass of the C copy-plan
engine; a tensor is matched between layouts by (sequence, position), so any composition (padded -> a
CP rank's shard of the packed layout) is a single call and nothing is ever truncated.

Two engines run a move. Host tensors (numpy, torch CPU) go through the C engine: one pass of copies
split across a team of threads. Tensors on any other torch device (cuda, npu, xpu, mps, meta) go
through torch's own indexing with index tensors derived from the same C plan (the plan moved over a
token counter), kept per device on the plan, so the data never visits the host; ``engine="torch"``
picks that path on the CPU too, and both agree bit for bit (a move only copies).

Every move of a torch tensor that requires grad records autograd. A move is injective (a token of
the destination comes from one source token; padding from none), so its adjoint is a move too: the
destination's tokens go back to where they came from and every other source token (padding, tokens a
CP shard does not hold) receives zero; the C library builds that plan (maskpack_relayout_plan_adjoint).
The adjoint runs through the same autograd function, so double backward works."""

from __future__ import annotations

import weakref
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import _maskpack
from ._errors import Error
from ._tensors import (DTYPE_NAMES as _DTYPE_NAMES, describe, describe_out, dtype_code, dtype_name,
                       is_torch_tensor, register_torch)
from ._tensors import check_layout, compiling
from ._runtime import cache_of as _cache_of, enum as _enum, team as _team
from ._runtime import above as _above  # the layers above this one, by name (see there)

# the C enums, as the extension exports them (maskpack._runtime.enum); "ulysses" runs as "contiguous" over a
# global layout padded only at the end (see _cp_global)
_SCHEMES = _enum("cp_scheme")
_SCHEMES["ulysses"] = _SCHEMES["contiguous"]
_ALIGNS = _enum("cp_align")
_PLACEMENTS = {k: v for k, v in _enum("placement").items() if k != "packed"}  # the padded placements
_LOSS_MODES = _enum("loss_mode")


def _pick(value: Any, table: dict, name: str) -> int:
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {', '.join(map(repr, table))}, found {value!r}")
    if value not in table:
        raise Error(f"{name}: expected one of {', '.join(map(repr, table))}, found {value!r}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument=name)
    return table[value]


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


def _check_pad_value(pad_value: Any, dtype: str) -> None:
    """pad_value must be a number the output's dtype holds exactly: no string, no fraction into an
    integer dtype (1.5 into int32 wrote 1), nothing out of range (1000 into int8)."""
    if isinstance(pad_value, (bool, np.bool_)):
        pad_value = int(pad_value)
    if not isinstance(pad_value, (int, float, np.integer, np.floating)):
        raise TypeError(f"pad_value: expected a number, found {type(pad_value).__name__} {pad_value!r}")
    if dtype == "bool":
        ok, what = pad_value in (0, 1), "0 or 1 (bool output)"
    elif dtype in ("int8", "uint8", "int16", "int32", "int64"):
        info = np.iinfo(dtype)
        if isinstance(pad_value, (float, np.floating)) and not float(pad_value).is_integer():
            raise Error(f"pad_value: expected an integer for a {dtype} output, found {pad_value!r}",
                        "MASKPACK_ERR_VALUE", argument="pad_value")
        ok = info.min <= pad_value <= info.max
        what = f"a {dtype} value in [{info.min}, {info.max}]"
    else:
        big = 65504.0 if dtype == "float16" else 3.3895313892515355e38 if dtype == "bfloat16" else \
            float(np.finfo(dtype).max)
        ok, what = not (abs(float(pad_value)) > big and np.isfinite(float(pad_value))), f"a finite {dtype} value"
    if not ok:
        raise Error(f"pad_value: expected {what}, found {pad_value!r}", "MASKPACK_ERR_OVERFLOW", argument="pad_value")


def _pad_bytes(pad_value: Any, dtype: str) -> Optional[bytes]:
    if pad_value is not None:
        _check_pad_value(pad_value, dtype)
    if pad_value is None or pad_value == 0:
        return None
    if dtype == "bfloat16":
        import torch

        return torch.tensor([pad_value], dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
    return np.array([pad_value], dtype=np.dtype(dtype)).tobytes()


# A move with padding or several sources, of at most this many contiguous runs, runs as slice copies
# and fills on a device (one launch per run; an H100 unpacks bf16 [8, 4096, 4096] at 77 % of a copy's
# bandwidth so, and at 40 % through zeros + index_copy_)
_RUN_LIMIT = 32


class _Move:
    """One copy plan between layouts, as both engines run it: the C plan, the source and destination
    token grids, the adjoint plans (per source) and, per torch device, the torch engine's index
    tensors. Immutable; kept in the source layout's cache, so every move of a batch plans once."""

    __slots__ = ("plan", "src_grids", "dst_grid", "_adjoints", "_index", "_cache", "__weakref__")

    def __init__(self, plan, src_grids: Tuple[Tuple[int, ...], ...], dst_grid: Tuple[int, ...]) -> None:
        self.plan = plan
        self.src_grids = src_grids
        self.dst_grid = dst_grid
        self._adjoints: dict = {}
        self._index: dict = {}
        self._cache = None  # the torch.compile registry key (maskpack._compile)

    @classmethod
    def create(cls, srcs: list, dst) -> "_Move":
        return cls(_maskpack.plan_create(tuple(x._h for x in srcs), dst._h),
                   tuple(x._per_token_shape() for x in srcs), dst._per_token_shape())

    def adjoint(self, s: int) -> "_Move":
        """The transpose of this move for source ``s``: dst's grid -> source s's grid, zero elsewhere."""
        a = self._adjoints.get(s)
        if a is None:
            a = self._adjoints[s] = _Move(_maskpack.plan_adjoint(self.plan, s), (self.dst_grid,), self.src_grids[s])
        return a

    def host_index(self) -> np.ndarray:
        """int64 [dst tokens]: the flat index of each destination token in the concatenated sources'
        tokens, -1 for padding. Computed by the C engine itself (the plan run over a counter), so
        the torch engine follows the C engine by construction."""
        idx = self._index.get("host")
        if idx is None:
            xs, descs, off = [], [], 0
            for g in self.src_grids:
                n = _numel(g)
                a = np.arange(off, off + n, dtype=np.int64).reshape(g)
                xs.append(a)
                descs.append(describe(a, "x")[0])
                off += n
            idx = np.empty(self.dst_grid, dtype=np.int64)
            od = describe_out(idx, "out")[0]
            _maskpack.plan_execute(self.plan, tuple(descs), od, np.int64(-1).tobytes(), None)
            idx = self._index["host"] = idx.reshape(-1)
        return idx

    def runs(self) -> Optional[tuple]:
        """The move as contiguous runs, when it has few (rows of a padded batch, a handful of documents):
        ([(dst start, source, source start, length)], [(dst start, length) of padding]), or None when
        there are more than ``_RUN_LIMIT`` runs. On a device each run is one contiguous copy or fill at
        memory bandwidth; an index kernel reads an index per token and writes the padding twice."""
        key = ("runs", _RUN_LIMIT)
        if key not in self._index:
            flat = self.host_index()
            n = flat.size
            offs = np.cumsum([0] + [_numel(g) for g in self.src_grids])
            sid = np.searchsorted(offs, flat, side="right") - 1  # which source (fills: -1)
            sid[flat < 0] = -1
            cont = np.zeros(n, dtype=bool)
            if n > 1:
                a, b = flat[:-1], flat[1:]
                cont[1:] = ((b >= 0) & (a >= 0) & (b == a + 1) & (sid[1:] == sid[:-1])) | ((b < 0) & (a < 0))
            starts = np.nonzero(~cont)[0]
            runs = None
            if starts.size <= _RUN_LIMIT:
                ends = np.append(starts[1:], n)
                toks, fills = [], []
                for d, e in zip(starts.tolist(), ends.tolist()):
                    if flat[d] < 0:
                        fills.append((d, e - d))
                    else:
                        k = int(sid[d])
                        toks.append((d, k, int(flat[d] - offs[k]), e - d))
                runs = (toks, fills)
            self._index[key] = runs
        return self._index[key]

    def source_runs(self, s: int) -> List[Tuple[int, int, int]]:
        """Source s's share of the move as contiguous runs [(dst start, source start, length)], however
        many (a sender that writes its own tokens into a destination other senders also fill)."""
        key = ("source runs", s)
        r = self._index.get(key)
        if r is None:
            sel, src = self._source_positions()[s]
            brk = np.nonzero((np.diff(sel) != 1) | (np.diff(src) != 1))[0] + 1
            starts = np.concatenate([[0], brk]).astype(np.int64)
            ends = np.append(starts[1:], sel.size) if sel.size else starts
            r = self._index[key] = [(int(sel[a]), int(src[a]), int(b - a)) for a, b in zip(starts, ends)
                                    if b > a]
        return r

    def _source_positions(self) -> list:
        """Per source: (dst positions, positions in that source) of the tokens it gives, as int64
        numpy arrays in destination order, derived once from the C engine's index."""
        pos = self._index.get("source positions")
        if pos is None:
            flat = self.host_index()
            pos, off = [], 0
            for g in self.src_grids:
                n = _numel(g)
                sel = np.nonzero((flat >= off) & (flat < off + n))[0]
                pos.append((sel, flat[sel] - off))
                off += n
            self._index["source positions"] = pos
        return pos

    def index(self, device):
        """(per source: (dst positions, source positions)), fill positions, whole-gather index or None)
        as int64 tensors on ``device``, derived once per device."""
        key = str(device)
        e = self._index.get(key)
        if e is None:
            import torch

            flat = self.host_index()
            pairs = []
            for g, (sel, src) in zip(self.src_grids, self._source_positions()):
                n = _numel(g)
                # every token of the source, in order (an unpack's packed source): no gather needed
                identity = src.size == n and bool((src == np.arange(n)).all())
                pairs.append((torch.from_numpy(sel).to(device), None if identity else torch.from_numpy(src).to(device)))
            fills = np.nonzero(flat < 0)[0]
            # one source and no padding: the move is a single gather (flash-attn's index_first_axis)
            whole = None
            if len(self.src_grids) == 1 and fills.size == 0:
                whole = pairs[0][1] if pairs[0][1] is not None else pairs[0][0]  # identity: dst order = src order
            e = self._index[key] = (pairs, torch.from_numpy(fills).to(device), whole)
        return e


def _numel(shape: Tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _plan(srcs: list, dst) -> _Move:
    """The move srcs -> dst, cached on the first source and keyed by the other layouts' ids; a weak
    reference to each confirms it is still the same layout (an id can be reused after death)."""
    check_layout(dst, "dst")  # a TypeError naming the argument, not one from weakref or the cache
    for i, s in enumerate(srcs):
        check_layout(s, "src" if len(srcs) == 1 else f"src[{i}]")
    if len(srcs) == 1:  # the common case, without the generator below (a move takes microseconds)
        c = _cache_of(srcs[0])
        key = id(dst)
        entry = c.get(key)
        if entry is None or entry[0][0]() is not dst:
            entry = c[key] = ([weakref.ref(dst)], _Move.create(srcs, dst))
        return entry[1]
    others = (dst, *srcs[1:])
    c = _cache_of(srcs[0])
    key = tuple(map(id, others))
    entry = c.get(key)
    if entry is None or any(r() is not o for r, o in zip(entry[0], others)):
        entry = c[key] = ([weakref.ref(o) for o in others], _Move.create(srcs, dst))
    return entry[1]


_PACK_PLAN, _UNPACK_PLAN = "pack plan", "unpack plan"  # keys in a layout's cache
_ENGINES = ("c", "torch")


def _check_engine(engine: Optional[str]) -> None:
    if engine is not None and engine not in _ENGINES:
        raise Error(f"engine: expected one of 'c', 'torch' or None, found {engine!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="engine")


def _torch_path(labels: Any, engine: Optional[str]) -> bool:
    """Labels work on the torch path when asked, or when they live on an accelerator."""
    _check_engine(engine)
    on_device = is_torch_tensor(labels) and labels.device.type != "cpu"
    if engine == "c" and on_device:
        raise Error(f"engine: 'c' reads host memory, found labels on {labels.device}", "MASKPACK_ERR_UNSUPPORTED",
                    argument="engine")
    return engine == "torch" or (engine is None and on_device)


def _records(x: Any) -> bool:
    """True when autograd would record a move of x (a torch tensor that requires grad)."""
    if not is_torch_tensor(x) or not x.requires_grad:
        return False
    import torch

    return torch.is_grad_enabled()


def _fast_move(move, x: Any, out: Any, pad_value: Any, threads: Optional[int]) -> bool:
    """The first try of a move whose plan is already cached, into a given ``out`` with zero padding:
    the extension reads host torch/numpy tensors itself. False: the caller takes the full path (which
    also reports any error, a tensor that requires grad or one on another device included)."""
    return (move is not None and out is not None and (pad_value is None or (type(pad_value) is int and pad_value == 0))
            and not _records(x) and _maskpack.move(move.plan, x, out, None, _team(threads)))


def _pick_engine(xs: list, out: Any, engine: Optional[str]) -> str:
    """The engine of a move: "c" for host memory, "torch" for any other torch device (or when asked).
    Every tensor of one call is on one device; the C engine reads host memory only."""
    _check_engine(engine)
    dev, first = None, None
    for i, xi in enumerate(xs):
        if is_torch_tensor(xi):
            if dev is None:
                dev, first = xi.device, f"x[{i}]"
            elif xi.device != dev:
                raise Error(f"x[{i}]: expected a tensor on {dev} (as {first}), found one on {xi.device}",
                            "MASKPACK_ERR_INVALID_ARGUMENT", argument=f"x[{i}]", index=(i,))
    if out is not None and is_torch_tensor(out) and dev is not None and out.device != dev:
        raise Error(f"out: expected a tensor on {dev} (as the input), found one on {out.device}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="out")
    host = dev is None or dev.type == "cpu"
    if engine == "c" and not host:
        raise Error(f"engine: 'c' reads host memory, found tensors on {dev}; use engine='torch' (the default there)",
                    "MASKPACK_ERR_UNSUPPORTED", argument="engine")
    if engine is None:
        engine = "c" if host else "torch"
    return engine


def _as_torch(x: Any, name: str):
    import torch

    if is_torch_tensor(x):
        return x
    d, is_torch = describe(x, name)  # validates the type and dtype
    return d if is_torch else torch.as_tensor(d)


def _check_grid(x, grid: Tuple[int, ...], name: str) -> None:
    lead = len(grid)
    if x.dim() < lead or tuple(x.shape[:lead]) != tuple(grid):
        found = list(x.shape[:lead]) if x.dim() >= lead else list(x.shape)
        raise Error(f"{name}: expected leading dimensions {list(grid)} (the layout's token grid), found {found} "
                    f"(shape {list(x.shape)})", "MASKPACK_ERR_SHAPE", argument=name)


def _torch_empty(shape: Tuple[int, ...], like):
    """An uninitialised output on like's device; on the host a large one comes from the output cache
    (pages already mapped: a fresh 32 MiB allocation costs more in page faults than the move itself)."""
    if like.device.type == "cpu":
        from ._alloc import fresh

        return fresh(shape, like.dtype)
    import torch

    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _run_torch(move: _Move, xs: list, out: Any, pad_value: Any):
    """The torch engine: the move as torch indexing on the tensors' own device (cuda, npu, xpu, mps,
    meta or cpu). One index_select for a gather without padding (pack); else the padding is filled and
    each source's tokens copied in with index_copy_ (unpack, shard, gather)."""
    import torch

    xs = [_as_torch(x, f"x[{i}]") for i, x in enumerate(xs)]
    x0 = xs[0]
    trailing = tuple(x0.shape[len(move.src_grids[0]):])
    for i, (x, g) in enumerate(zip(xs, move.src_grids)):
        _check_grid(x, g, f"x[{i}]")
        if tuple(x.shape[len(g):]) != trailing:
            raise Error(f"x[{i}]: expected per-token shape {list(trailing)} (as x[0]), found {list(x.shape[len(g):])}",
                        "MASKPACK_ERR_SHAPE", argument=f"x[{i}]", index=(i,))
        if x.dtype != x0.dtype:
            raise Error(f"x[{i}]: expected dtype {x0.dtype} (as x[0]), found {x.dtype}", "MASKPACK_ERR_DTYPE",
                        argument=f"x[{i}]", index=(i,))
    shape = tuple(move.dst_grid) + trailing
    if out is not None:
        if not is_torch_tensor(out):
            raise TypeError(f"out: expected a torch tensor on {x0.device}, found {type(out).__name__}")
        if tuple(out.shape) != shape:
            raise Error(f"out: expected shape {list(shape)}, found {list(out.shape)}", "MASKPACK_ERR_SHAPE",
                        argument="out")
        if out.dtype != x0.dtype:
            raise Error(f"out: expected dtype {x0.dtype} (as x), found {out.dtype}", "MASKPACK_ERR_DTYPE",
                        argument="out")
    n_dst = _numel(move.dst_grid)
    flats = [x.reshape((_numel(g),) + trailing) for x, g in zip(xs, move.src_grids)]
    target = out
    if out is not None and not out.is_contiguous():
        target = None  # written through a contiguous result, then copied into out's strides
    pairs, fills, whole = move.index(x0.device)
    # padding or several sources, in few runs: one contiguous copy or fill each, every byte written once
    # (a single gather without padding, a pack, stays one index_select: one launch at copy bandwidth)
    runs = move.runs() if whole is None else None
    if runs is not None:
        toks, fill_runs = runs
        if fill_runs and pad_value is not None:
            _check_pad_value(pad_value, dtype_name(x0.dtype))
        res = (_torch_empty(shape, x0) if target is None else target).view((n_dst,) + trailing)
        for d, k, a, n in toks:
            res[d:d + n].copy_(flats[k][a:a + n])
        for d, n in fill_runs:
            res[d:d + n].fill_(0 if pad_value is None else pad_value)
        return _finish(res, shape, out, target)
    if whole is not None:
        if target is None and x0.device.type == "cpu":  # large host outputs: the output cache's pages
            res = _torch_empty(shape, x0).view((n_dst,) + trailing)
            torch.index_select(flats[0], 0, whole, out=res)
        else:
            res = torch.index_select(flats[0], 0, whole)
        if target is not None:
            target.view((n_dst,) + trailing).copy_(res)
            return out
        res = res.view(shape)
        if out is not None:
            out.copy_(res)
            return out
        return res
    if pad_value is not None:
        _check_pad_value(pad_value, dtype_name(x0.dtype))
    zero_pad = pad_value is None or (not isinstance(pad_value, bool) and pad_value == 0)
    if target is None:  # zero padding: one memset of the whole, as the torch a user writes (zeros + index_put_)
        res = _torch_empty(shape, x0)
        if zero_pad and fills.numel():
            res.zero_()
        res = res.view((n_dst,) + trailing)
        fill = not zero_pad and fills.numel()
    else:
        res = target.view((n_dst,) + trailing)
        fill = fills.numel()
    if fill:
        res.index_fill_(0, fills, 0 if pad_value is None else pad_value)
    for flat, (dst_pos, src_pos) in zip(flats, pairs):
        if dst_pos.numel():
            res.index_copy_(0, dst_pos, flat if src_pos is None else flat.index_select(0, src_pos))
    return _finish(res, shape, out, target)


def _finish(res, shape, out, target):
    """The torch engine's result: res (contiguous, [dst tokens, ...]) as the move's shape, or out itself
    (written through target = out already, else copied into out's own strides)."""
    res = res.view(shape)
    if out is not None:
        if target is None:
            out.copy_(res)
        return out
    return res


def _run_c(move: _Move, srcs: list, dst, xs: list, out: Any, pad_value: Any, threads: Optional[int]):
    """The C engine: host tensors (numpy, torch CPU), one pass of copies."""
    plan = move.plan
    if len(xs) == 1 and out is not None:
        # fast path: the extension reads torch CPU tensors and numpy arrays itself
        x = xs[0]
        if is_torch_tensor(x):
            register_torch()  # once per process
        pad, readable = None, True
        if not (pad_value is None or pad_value == 0):
            try:
                pad = _pad_bytes(pad_value, dtype_name(out.dtype))
            except (AttributeError, TypeError, Error):
                readable = False  # the checked path below reports it
        if readable and _maskpack.move(plan, x, out, pad, _team(threads)):
            return out
    # shapes are checked by the C engine, which names the argument
    descs = [describe(xi, f"x[{i}]")[0] for i, xi in enumerate(xs)]
    if out is None:
        lead = len(move.src_grids[0])
        if descs[0].ndim < lead:
            raise Error(f"x[0]: expected at least {lead} dimensions (the source's token grid), found "
                        f"{descs[0].ndim}", "MASKPACK_ERR_SHAPE", argument="x")
        out = _alloc_like(xs[0], tuple(move.dst_grid) + tuple(descs[0].shape[lead:]))
    od = describe_out(out, "out")[0]
    pad = None if (pad_value is None or pad_value == 0) else _pad_bytes(pad_value, _DTYPE_NAMES[dtype_code(od, "out")])
    _maskpack.plan_execute(plan, tuple(descs), od, pad, _team(threads))
    return out


def _execute(move: _Move, srcs: list, dst, xs: list, out: Any, pad_value: Any, threads: Optional[int], engine: str):
    if engine == "torch":
        return _run_torch(move, xs, out, pad_value)
    return _run_c(move, srcs, dst, xs, out, pad_value, threads)


_FUNCTION: list = []


def _move_function():
    """The torch.autograd.Function of a move, created on first use (``import maskpack`` needs no torch).
    forward: the move; backward: each source's adjoint move of the gradient, through this same function
    (so the backward is differentiable: double backward works)."""
    if _FUNCTION:
        return _FUNCTION[0]
    import torch

    class MoveFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, move, pad_value, threads, engine, *xs):
            ctx.move, ctx.threads, ctx.engine = move, threads, engine
            return _execute(move, None, None, [x.detach() for x in xs], None, pad_value, threads, engine)

        @staticmethod
        def backward(ctx, grad):
            if grad.dim() and not grad.is_contiguous():
                grad = grad.contiguous()  # e.g. the expanded gradient of a sum(): stride 0 per token
            grads = []
            for s in range(len(ctx.move.src_grids)):
                if ctx.needs_input_grad[4 + s]:
                    grads.append(_apply(ctx.move.adjoint(s), None, None, [grad], None, 0, ctx.threads, ctx.engine))
                else:
                    grads.append(None)
            return (None, None, None, None, *grads)

    _FUNCTION.append(MoveFunction)
    return MoveFunction


def _apply(move: _Move, srcs, dst, xs: list, out: Any, pad_value: Any, threads: Optional[int],
           engine: Optional[str]):
    """Runs a move on the engine its tensors call for, recording autograd when an input requires grad."""
    eng = _pick_engine(xs, out, engine)
    if any(_records(x) for x in xs):
        if out is not None:
            raise Error("out: cannot be given while autograd records (an input requires grad): the move's "
                        "output must be a new tensor of the graph; drop out= or call under torch.no_grad()",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="out")
        return _move_function().apply(move, pad_value, threads, eng, *xs)
    return _execute(move, srcs, dst, xs, out, pad_value, threads, eng)


def relayout(x: Any, src, dst, out: Any = None, pad_value: Any = 0, threads: Optional[int] = None,
             engine: Optional[str] = None):
    """Per-token tensor ``x`` of layout ``src`` ([B,S,...] or [T,...]) -> the same tokens in layout
    ``dst``; padding of dst gets ``pad_value``. ``src`` may also be a sequence of CP shard layouts with
    ``x`` the matching sequence of parts (a gather). Writes into ``out`` when given (not while autograd
    records). Differentiable (the gradient goes back to the source tokens, zero to the rest); runs on
    the tensors' device (``engine``: None picks "c" for host memory, "torch" elsewhere). The copy plan
    is computed once per pair of layouts and kept on ``src``."""
    if out is None and compiling():  # under torch.compile: a custom op (maskpack._compile)
        if isinstance(src, (list, tuple)):
            return _above("compile").move(list(x), list(src), dst, "", pad_value, threads, engine)
        return _above("compile").move([x], [src], dst, "", pad_value, threads, engine)
    if getattr(x, "is_nested", False) and not isinstance(src, (list, tuple)):
        x = _nested_values(x, src)
    if not isinstance(src, (list, tuple)):
        c = getattr(src, "_cache", None)  # not a Layout: _plan names the argument
        entry = c.get(id(dst)) if c is not None else None  # a plan made before by _plan
        if (engine is None and entry is not None and entry[0][0]() is dst
                and _fast_move(entry[1], x, out, pad_value, threads)):
            return out
        return _apply(_plan([src], dst), [src], dst, [x], out, pad_value, threads, engine)
    srcs = list(src)
    xs = list(x)
    if len(xs) != len(srcs):
        raise Error(f"x: expected {len(srcs)} tensors (one per source layout), found {len(xs)}",
                    "MASKPACK_ERR_SHAPE", argument="x")
    if not srcs:
        raise Error("src: expected at least one source layout", "MASKPACK_ERR_INVALID_ARGUMENT", argument="src")
    return _apply(_plan(srcs, dst), srcs, dst, xs, out, pad_value, threads, engine)


def _nested_values(x, src):
    """A jagged nested tensor handed to a move: its values, checked to be the packed tokens of ``src``."""
    try:
        offsets = x.offsets()
    except Exception:
        raise Error("x: a strided nested tensor cannot be moved; build it with layout=torch.jagged",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="x") from None
    packed = src.packed_of()
    want = packed.cu_seqlens(dtype="int64")
    got = offsets.detach().to("cpu")
    if x.lengths() is not None or tuple(got.tolist()) != tuple(np.asarray(want).tolist()) or not (
            src.packed and packed is src):
        raise Error("x: a nested tensor moves from the packed layout of its own offsets (Layout.from_nested(x)); "
                    "its offsets do not describe src", "MASKPACK_ERR_SHAPE", argument="x")
    return x.values()


def cp_gather(parts: Sequence[Any], layout, scheme: str = "zigzag", tp: int = 1, align: Optional[str] = "verl",
              pad_value: Any = 0, out: Any = None, threads: Optional[int] = None, engine: Optional[str] = None):
    """The per-rank parts of a per-token tensor (rank order, as ``layout.shard`` produced them) -> the
    tensor in ``layout``. Every token of ``layout`` must be held by exactly one part. Differentiable:
    the gradient of the whole goes back to each part as that rank's shard of it."""
    cp = len(parts)
    if out is None and compiling():
        return _above("compile").move(list(parts), [layout] * cp, layout, f"gather,{scheme},{int(tp)},{align}", pad_value,
                                      threads, engine)
    shards = [layout.cp_shard(cp, r, scheme=scheme, tp=tp, align=align) for r in range(cp)]
    return relayout(list(parts), shards, layout, out=out, pad_value=pad_value, threads=threads, engine=engine)
