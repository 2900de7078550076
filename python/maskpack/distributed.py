"""Context-parallel collectives over a communicator the caller owns (a torch.distributed ProcessGroup):
maskpack never initialises or tears down a process group. Every collective is differentiable and runs
on whatever device the tensors are on (gloo on CPUs, NCCL / HCCL on accelerators).

    whole = maskpack.cp_all_gather(part, packed, group)         # this rank's shard -> the whole batch
    logits = bundle.to_padded(out.logits, group=group)           # the gather done by the bundle
    heads = maskpack.ulysses_all_to_all(x, group, 1, 0)          # [T/cp, H, D] -> [T, H/cp, D] and back
    loss = maskpack.cp_loss(per_token_loss, bundle.loss_weights, group)   # the exact mean over all ranks

Adjoints: the all-gather's is a reduce-scatter (each rank's part receives the sum over ranks of the
whole's gradient at its tokens), the all-to-all's the opposite all-to-all, the loss's all-reduce an
all-reduce of the (scalar) gradient.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

from ._errors import Error
from ._runtime import team as _team, threads as _threads
from ._runtime import above as _above  # the layers above this one, by name (see there)
from ._moves import _SCHEMES  # _SCHEMES: the package's one copy of maskpack_cp_scheme (test_header_enums)

__all__ = ["cp_all_gather", "ulysses_all_to_all", "cp_loss", "gated_delta_rule_cp", "causal_conv1d_cp",
           "gated_delta_rule_sp", "causal_conv1d_sp", "attention_cp", "cp_reshard"]


def _is_mpi(group) -> bool:
    """An mpi4py communicator (the C algorithms run over it directly)."""
    return type(group).__module__.startswith("mpi4py")


def _rank_size(group) -> tuple:
    if _is_mpi(group):
        return group.Get_rank(), group.Get_size()
    if not dist.is_available() or not dist.is_initialized():
        raise Error("group: torch.distributed is not initialised; maskpack uses the caller's process group and "
                    "never creates one (init_process_group first)", "MASKPACK_ERR_INVALID_ARGUMENT", argument="group")
    return dist.get_rank(group), dist.get_world_size(group)


def _receive_buffers(like: torch.Tensor, n: int) -> list:
    """n buffers shaped like ``like`` for a collective to receive into: on the host, recycled pages
    (fresh ones cost their page faults, 40 % of a large gather through gloo)."""
    if like.device.type == "cpu":
        from ._alloc import fresh

        return [fresh(tuple(like.shape), like.dtype) for _ in range(n)]
    return [torch.empty_like(like) for _ in range(n)]


def _all_gather(x: torch.Tensor, group) -> list:
    _refuse_mpi(group, "this collective")
    _, n = _rank_size(group)
    parts = _receive_buffers(x, n)
    dist.all_gather(parts, x.contiguous(), group=group)
    return parts


def _fingerprint(layout) -> int:
    """63 bits of a hash of everything the ranks must agree on about a layout (grid, segments, rule),
    computed once per layout (layouts are immutable)."""
    from ._runtime import cached as _cached

    return _cached(layout, ("cp_fingerprint",), lambda: _stable((layout.n_rows, layout.q_width, layout.kv_width,
                                                                  layout.packed, layout.segments,
                                                                  sorted(layout.rule.items()))))


def _stable(value) -> int:
    """A hash that is the same in every process (Python's own is salted per process for strings)."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), "little") >> 1


# ---- the agreement every CP call starts with ------------------------------------------------------------
#
# One all-gather of a fixed-size record (_WORDS int64, the same for every call, so that ranks in different
# calls still meet in it instead of pairing a payload exchange with another collective, which gloo answers
# with SIGABRT or a hang): the group size, which call, whether the rank refused its own arguments, the
# layout's fingerprint (with its segment and token counts, for the message) and up to _SETTINGS settings
# of the call, each as a value the message can show on both sides (a dtype, a per-token shape, the
# scheme, a flag, a number).

_CALLS = ("cp_all_gather", "attention", "gated_delta_rule", "gated_delta_rule_sp", "causal_conv1d",
          "causal_conv1d_sp")
_HEAD = 6  # size, call, refused, layout fingerprint, segments, grid tokens
_SETTINGS = 18
_WORDS = _HEAD + _SETTINGS
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
_NOTHING = -1  # no tensor, no value
_HASHED = 1 << 62  # a value too large or of an unknown kind: its stable hash, with this bit set


def _hashed(value) -> int:
    return _HASHED | (_stable(value) >> 2)


def _encode(kind: str, value, options: tuple = ()) -> int:
    """A setting as one int64 that _decode shows again (equal settings, equal values)."""
    if value is None and kind != "choice":
        return _NOTHING
    if kind == "dtype":
        return _DTYPES.index(value) if value in _DTYPES else _hashed(str(value))
    if kind == "shape":
        dims = tuple(int(d) for d in value)
        if len(dims) <= 3 and all(0 <= d < (1 << 20) for d in dims):
            v = len(dims)
            for i in range(3):
                v = (v << 20) | (dims[i] if i < len(dims) else 0)
            return v
        return _hashed(dims)
    if kind == "choice":
        return options.index(value) if value in options else _hashed(repr(value))
    if kind == "real":
        import struct

        return struct.unpack("<q", struct.pack("<d", float(value)))[0]
    if kind == "flag":
        return 1 if value else 0
    v = int(value)
    return v if -(1 << 62) < v < (1 << 62) else _hashed(v)


def _decode(kind: str, v: int, options: tuple = ()) -> str:
    if v == _NOTHING:
        return "none"
    if kind == "real":
        import struct

        return repr(struct.unpack("<d", struct.pack("<q", v))[0])
    if v >= _HASHED:
        return f"a value hashed to {v:016x}"
    if kind == "dtype":
        return str(_DTYPES[v]) if 0 <= v < len(_DTYPES) else str(v)
    if kind == "shape":
        nd = v >> 60
        return str([(v >> (40 - 20 * i)) & 0xFFFFF for i in range(nd)])
    if kind == "choice":
        return repr(options[v]) if 0 <= v < len(options) else str(v)
    if kind == "flag":
        return "yes" if v else "no"
    return str(v)


def _dtype(x):
    return x.dtype if isinstance(x, torch.Tensor) else None


def _per_token(x, layout, extra: int = 0):
    """x's shape past its token dimensions (1 packed, 2 padded), or None (no tensor)."""
    if not isinstance(x, torch.Tensor):
        return None
    lead = 1 if getattr(layout, "packed", True) else 2
    return tuple(x.shape[lead + extra:])


def _cp_settings(scheme, tp, align) -> list:
    return [("scheme", "CP scheme", "choice", scheme, tuple(_SCHEMES)), ("tp", "tensor-parallel size", "int", tp),
            ("align", "alignment", "choice", align, ("verl", "minimal", None))]


def _tensor_settings(layout, *named) -> list:
    """dtype and per-token shape of each (name, tensor, what the shape holds)."""
    out = []
    for name, x, what in named:
        out.append((name, f"{name} dtype", "dtype", _dtype(x)))
        out.append((name, f"{name} per-token shape {what}".rstrip(), "shape", _per_token(x, layout)))
    return out


def _record(n: int, call: str, refused: bool, layout, settings: list) -> list:
    try:
        fp = 0 if refused else _fingerprint(layout)
        segs, grid = int(layout.n_segments), int(layout.n_rows) * int(layout.q_width)
    except Exception:  # noqa: BLE001  (a rank whose layout is no layout refused it already)
        fp, segs, grid = 0, 0, 0
    assert len(settings) <= _SETTINGS, (call, len(settings))
    words = [n, _CALLS.index(call), 1 if refused else 0, fp, segs, grid]
    for st in settings:
        try:
            words.append(_encode(st[2], st[3], st[4] if len(st) > 4 else ()))
        except Exception:  # noqa: BLE001  (a value that cannot be read: only a refused rank's)
            words.append(-3)
    return words + [0] * (_WORDS - len(words))


# one flat all-gather into one tensor (torch 2.13 names it all_gather_single)
_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _agree(group, layout, call: str, settings: list, local: Optional[list]) -> None:
    """The check every CP call starts with: one all-gather of the call's fixed-size record (see above), so
    that ranks in another call, holding another layout, or passing other settings, or one rank's bad
    argument, raise on every rank alike instead of leaving the others waiting in a collective (or
    crashing gloo with payloads of different sizes). ``settings``: (argument, what, kind, value[,
    options]) of the call, at most _SETTINGS. ``local``: this rank's own argument error (raised here
    after the exchange). A disagreement names the setting, both values and the first rank that differs
    from rank 0, the same on every rank."""
    rank, n = _rank_size(group)
    mine = _record(n, call, bool(local), layout, settings)
    try:
        if _is_mpi(group):
            everyone = group.allgather(mine)
        else:
            dev = _backend_device(group)
            t = torch.tensor(mine, dtype=torch.int64, device=dev if dev in ("cuda", "npu") else "cpu")  # NCCL / HCCL
            out = torch.empty(n * _WORDS, dtype=torch.int64, device=t.device)
            _gather_single(out, t, group=group)
            everyone = out.view(n, _WORDS).cpu().tolist()
    except RuntimeError as exc:  # the backend's timeout or a closed connection: a rank died or never came
        raise Error(f"group: the ranks' agreement exchange failed on rank {rank} (a rank died, never joined, or "
                    f"did not make this call within the group's timeout): {exc}", "MASKPACK_ERR_COMM",
                    argument="group") from exc
    if local:
        # raised from a local that nothing else holds: an exception kept in a frame it passes through
        # (the caller's `local`) makes a reference cycle that keeps the frame, and the group in it,
        # alive past destroy_process_group, and gloo aborts the process when it is freed at exit
        exc = local.pop()
        try:
            raise exc
        finally:
            del exc
    for r in range(n):
        if everyone[r][2]:
            raise Error(f"group: rank {r} refused its arguments; every rank stops with it",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="group", index=(r,))
    a = everyone[0]
    for r in range(1, n):
        b = everyone[r]
        if b == a:
            continue
        if b[0] != a[0]:
            _disagree("group", r, "group size", str(b[0]), str(a[0]))
        if b[1] != a[1]:
            _disagree("group", r, "collective call", _CALLS[b[1]] if 0 <= b[1] < len(_CALLS) else str(b[1]),
                      _CALLS[a[1]], "every rank must make the same CP calls in the same order")
        if b[3:6] != a[3:6]:
            _disagree("layout", r, "layout", f"fingerprint {b[3]:016x} ({b[4]} segments, {b[5]} grid tokens)",
                      f"fingerprint {a[3]:016x} ({a[4]} segments, {a[5]} grid tokens)",
                      "each rank must pass the same whole-batch layout")
        for i, st in enumerate(settings):
            if b[_HEAD + i] != a[_HEAD + i]:
                opts = st[4] if len(st) > 4 else ()
                _disagree(st[0], r, st[1], _decode(st[2], b[_HEAD + i], opts), _decode(st[2], a[_HEAD + i], opts),
                          f"every rank must make the same call of {call}")


def _disagree(arg: str, r: int, what: str, theirs: str, ours: str, why: str = "") -> None:
    raise Error(f"{arg}: rank {r} disagrees with rank 0 about the {what}: {theirs} on rank {r}, {ours} on rank 0"
                + (f" ({why})" if why else ""), "MASKPACK_ERR_INVALID_ARGUMENT", argument=arg, index=(r,))


class _AllGatherParts(torch.autograd.Function):
    """part (this rank's shard) -> the whole, in the layout; backward (grad "sum"): every rank's gradient of
    the whole summed, restricted to this rank's tokens (a reduce-scatter through the layout's shards);
    grad "own": this rank's own gradient of the whole, restricted to its tokens (no communication)."""

    @staticmethod
    def forward(ctx, part, layout, scheme, tp, align, group, grad="sum"):
        from ._moves import cp_gather

        rank, n = _rank_size(group)
        local = None
        try:
            _check_shard("part", part, layout, n, rank, scheme, tp, align, group)
        except (Error, TypeError) as exc:
            local = [exc]  # boxed: _agree takes it out, so no frame keeps it (see _agree)
        _agree(group, layout, "cp_all_gather",
               _cp_settings(scheme, tp, align) + _tensor_settings(layout, ("part", part, "")), local)
        ctx.args = (layout, scheme, tp, align, group, rank, n)
        ctx.grad_mode = grad
        from . import _shm

        views = _shm.all_gather(part.detach().contiguous(), group, rank, n)  # one host: shared memory
        if views is not None:  # moved straight out of the peers' segments into the layout
            whole = cp_gather(views, layout, scheme=scheme, tp=tp, align=align)
            _shm.release(group)
            return whole
        parts = _all_gather(part.detach(), group)
        return cp_gather(parts, layout, scheme=scheme, tp=tp, align=align)

    @staticmethod
    def backward(ctx, grad):
        layout, scheme, tp, align, group, rank, n = ctx.args
        grad = grad.contiguous()
        if ctx.grad_mode == "own":  # the other ranks' parts were constants of this rank's objective
            return layout.shard(grad, n, rank, scheme=scheme, tp=tp, align=align), None, None, None, None, None, None
        shards = [layout.shard(grad, n, r, scheme=scheme, tp=tp, align=align) for r in range(n)]
        out = torch.empty_like(shards[rank])
        try:
            dist.reduce_scatter(out, shards, op=dist.ReduceOp.SUM, group=group)
        except (RuntimeError, NotImplementedError, ValueError):
            # backends without reduce_scatter (gloo on some builds): all-reduce the whole, then cut
            total = grad.clone()
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
            out = layout.shard(total, n, rank, scheme=scheme, tp=tp, align=align)
        return out, None, None, None, None, None, None


# this rank's shard [T_local, ...], whole layout, group -> the whole batch [.., ...] on every rank
def cp_all_gather(part: torch.Tensor, layout, group: Any = None, scheme: str = "zigzag", tp: int = 1,
                  align: Optional[str] = "verl", grad: str = "sum") -> torch.Tensor:
    """This rank's CP shard of a per-token tensor ([local tokens, ...], as ``layout.shard`` cut it) ->
    the whole tensor in ``layout`` (rank order is the group's). Differentiable. ``grad="sum"`` (the
    default): backward is a reduce-scatter of the gradient to the shard, i.e. the objective is the sum over
    ranks of what each rank computes from the whole (when every rank computes the same loss from it, that
    loss counts cp times: scale it by 1/cp, or reduce with :func:`cp_loss` on the shards instead).
    ``grad="own"``: the other ranks' parts are constants, so the shard gets only this rank's own gradient
    at its tokens (verl's ``postprocess_packed_seqs``, which gathers them detached; no communication in
    the backward): with the same loss on every rank, "sum" gives exactly cp times "own". ``group``: a
    torch.distributed ProcessGroup (None: the default group)."""
    if not isinstance(part, torch.Tensor):
        raise TypeError(f"part: expected a torch tensor, found {type(part).__name__}")
    if grad not in ("sum", "own"):
        raise Error(f"grad: expected 'sum' (every rank's gradient) or 'own' (this rank's), found {grad!r}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="grad")
    return _AllGatherParts.apply(part, layout, scheme, tp, align, group, grad)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, scatter_dim, gather_dim):
        ctx.args = (group, scatter_dim, gather_dim)
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        group, scatter_dim, gather_dim = ctx.args
        return _AllToAll.apply(grad.contiguous(), group, gather_dim, scatter_dim), None, None, None


def _all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    _refuse_mpi(group, "the all-to-all")
    _, n = _rank_size(group)
    if x.shape[scatter_dim] % n:
        raise Error(f"x: dimension {scatter_dim} ({x.shape[scatter_dim]}) must divide by the group size {n} "
                    "(Ulysses splits the heads evenly)", "MASKPACK_ERR_SHAPE", argument="x")
    from . import _shm

    # gloo has no all-to-all of device tensors: those go through the host
    staged = x.device.type != "cpu" and str(dist.get_backend(group)).lower() == "gloo"
    src = x.cpu() if staged else x
    out = _shm.all_to_all(src, scatter_dim, gather_dim, group, dist.get_rank(group), n)  # one host: shared memory
    if out is None:
        ins = [c.contiguous() for c in torch.tensor_split(src, n, dim=scatter_dim)]
        outs = _receive_buffers(ins[0], n)
        dist.all_to_all(outs, ins, group=group)
        out = torch.cat(outs, dim=gather_dim)
    return out.to(x.device) if staged else out


# x [.., heads, ..] split on scatter_dim -> gathered on gather_dim (one all-to-all)
def ulysses_all_to_all(x: torch.Tensor, group: Any = None, scatter_dim: int = 1, gather_dim: int = 0) -> torch.Tensor:
    """Ulysses' exchange: split ``scatter_dim`` over the group and concatenate the received pieces along
    ``gather_dim``. Sequence-split -> head-split: ``(x [T/cp, H, D], scatter_dim=1, gather_dim=0)`` gives
    ``[T, H/cp, D]`` (each rank holds every token of H/cp heads, in rank order of the sequence pieces,
    as ``cp_shard(scheme="ulysses")`` cut them); the reverse call ``(scatter_dim=0, gather_dim=1)``
    brings the attention output back. Differentiable (backward: the opposite exchange)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch tensor, found {type(x).__name__}")
    return _AllToAll.apply(x, group, int(scatter_dim) % x.dim(), int(gather_dim) % x.dim())


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        _refuse_mpi(group, "the loss all-reduce")
        ctx.group = group
        y = x.detach().clone()
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)
        return y

    @staticmethod
    def backward(ctx, grad):
        # every rank's loss is the same sum: d(sum_r L_r)/dx_r as each rank backpropagates its own copy
        return grad, None


# this rank's per-token loss and weights [T_local] -> the whole batch's weighted sum (a scalar)
def cp_loss(per_token_loss: torch.Tensor, weights: torch.Tensor, group: Any = None) -> torch.Tensor:
    """sum(per_token_loss * weights) over this rank's tokens, summed over the group: with a bundle's
    ``loss_weights`` the exact mean loss of the whole batch, the same number on every rank. Backward on
    each rank gives the global mean's gradient through the rank's own tokens; sum the parameter
    gradients over the CP group (all-reduce SUM, as Megatron does) for the full gradient."""
    w = torch.as_tensor(weights, device=per_token_loss.device).to(per_token_loss.dtype)
    if w.shape != per_token_loss.shape:
        raise Error(f"weights: expected the loss's shape {list(per_token_loss.shape)}, found {list(w.shape)}",
                    "MASKPACK_ERR_SHAPE", argument="weights")
    if torch.compiler.is_compiling():  # the all-reduce as an opaque op (maskpack._compile.cp_call)
        return _above("compile").cp_call("cp_loss", [per_token_loss, w], None, dist.group.WORLD if group is None else group,
                                         {})[0]
    return _AllReduceSum.apply((per_token_loss * w).sum(), group)


# ---- resharding: one CP split to another, one all-to-all ---------------------------------------------


def _stream_zigzag_ids(T: int, n: int, r: int, tp: int) -> np.ndarray:
    """The whole-stream zigzag split: the packed stream of T slots (sequence boundaries ignored) padded at
    its end to a multiple of 2 * n * tp and cut into 2n equal chunks; rank r holds chunks r and 2n-1-r (so
    causal work is even across ranks, as the per-sequence zigzag makes it per sequence). -> the stream
    positions of rank r's slots, -1 for the end padding."""
    m = 2 * n * max(1, tp)
    c = -(-T // m) * m // (2 * n)
    ids = np.concatenate([np.arange(r * c, (r + 1) * c), np.arange((2 * n - 1 - r) * c, (2 * n - r) * c)])
    return np.where(ids < T, ids, -1).astype(np.int64)


def _split_ids(layout, n: int, r: int, scheme: str, tp: int, align) -> np.ndarray:
    """Rank r's slots under a CP split -> the packed layout's columns they hold (-1: padding)."""
    T = int(layout.q_width)
    if scheme == "stream_zigzag":
        return _stream_zigzag_ids(T, n, r, tp)
    ids_t = torch.arange(T, dtype=torch.int64)
    return layout.shard(ids_t, n, r, scheme=scheme, tp=tp, align=align, pad_value=-1).numpy()


def _reshard_plan(layout, n: int, rank: int, src: tuple, dst: tuple) -> tuple:
    """(per peer: the positions in this rank's src shard it sends there; per peer: the positions in this
    rank's dst shard it receives from there; the dst shard's length). src, dst: (scheme, tp, align). Both
    lists of a pair run in the destination's token order, so sender and receiver agree without a message.
    Derived from the layouts alone (every rank computes the same maps) and kept on the layout."""
    from ._runtime import cached as _cached

    def make():
        T = int(layout.q_width)  # a packed layout: one slot per column
        held = [_split_ids(layout, n, r, *src) for r in range(n)]
        want = [_split_ids(layout, n, r, *dst) for r in range(n)]
        owner = np.full(T, -1, dtype=np.int64)
        place = np.full(T, -1, dtype=np.int64)
        for r in range(n):
            real = np.nonzero(held[r] >= 0)[0]
            owner[held[r][real]] = r
            place[held[r][real]] = real
        send = []
        for s_ in range(n):  # what this rank sends to s_: its tokens s_ wants, in s_'s order
            w = want[s_]
            j = np.nonzero(w >= 0)[0]
            mine = j[owner[w[j]] == rank]
            send.append(torch.from_numpy(place[w[mine]].copy()))
        w = want[rank]
        j = np.nonzero(w >= 0)[0]
        recv = [torch.from_numpy(j[owner[w[j]] == r].copy()) for r in range(n)]
        return send, recv, int(w.shape[0])

    return _cached(layout, ("cp_reshard", n, rank, src, dst), make)


def _reshard_raw(x: torch.Tensor, group, send: list, recv: list, length: int) -> torch.Tensor:
    rest = tuple(x.shape[1:])
    sizes_in, sizes_out = [int(i.numel()) for i in send], [int(i.numel()) for i in recv]
    # one buffer each way with per-peer sizes (gloo's list all-to-all wants equal sizes)
    sent = x.index_select(0, torch.cat(send).to(x.device)).contiguous()
    got = x.new_empty((sum(sizes_out),) + rest)
    dist.all_to_all_single(got, sent, sizes_out, sizes_in, group=group)
    out = x.new_zeros((length,) + rest)  # pad slots of the new split: 0
    out.index_copy_(0, torch.cat(recv).to(x.device), got)
    return out


class _Reshard(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, send, recv, length_in, length_out):
        ctx.args = (group, send, recv, length_in)
        return _reshard_raw(x, group, send, recv, length_out)

    @staticmethod
    def backward(ctx, grad):
        group, send, recv, length_in = ctx.args
        # the adjoint: the same all-to-all the other way (each token is held once, so no sums)
        return _Reshard.apply(grad.contiguous(), group, recv, send, grad.shape[0], length_in), None, None, None, \
            None, None


# this rank's shard [T_local, ...] under scheme -> its shard [T_local', ...] under to_scheme
def cp_reshard(x: torch.Tensor, layout, group: Any, scheme: str = "zigzag", to_scheme: str = "ulysses", tp: int = 1,
               align: Optional[str] = "verl", to_tp: Optional[int] = None,
               to_align: Any = "same") -> torch.Tensor:
    """this rank's shard [T_local, ...] under ``scheme`` -> its shard [T_local', ...] under ``to_scheme``.

    A hybrid model can run its attention layers on one CP split and its linear-attention layers on
    another (maskpack's per-sequence "zigzag" for ring attention, "ulysses" / the whole-stream contiguous
    split for flash-linear-attention's CP, "contiguous", and "stream_zigzag": the whole packed stream cut
    into 2 * cp chunks, rank r holding chunks r and 2cp-1-r, sequence boundaries ignored, the end padded
    to a multiple of 2 * cp * tp; ``align`` does not apply to it): one all-to-all moves every token from the rank
    that holds it to the rank that needs it, pad slots of the new split are 0. Differentiable: the
    backward is the reverse all-to-all. Every rank must call it (and its backward) alike. ``to_tp`` /
    ``to_align``: the new split's, by default the same as the old's. The whole layout, group and splits
    must be the same on every rank: a shard whose length is not the old split's for this rank is an error
    naming ``x`` (a group of another size than the batch was cut for shows so)."""
    _refuse_mpi(group, "cp_reshard")
    for name, sch in (("scheme", scheme), ("to_scheme", to_scheme)):
        if sch not in _CP_SCHEME_NAMES:
            raise Error(f"{name}: expected one of {', '.join(_CP_SCHEME_NAMES)}, found {sch!r}",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument=name)
    if not layout.packed:
        raise Error("layout: cp_reshard moves the shards of a packed layout (layout.packed_of() packs a padded one)",
                    "MASKPACK_ERR_UNSUPPORTED", argument="layout")
    rank, n = _rank_size(group)
    to_tp = tp if to_tp is None else to_tp
    to_align = align if to_align == "same" else to_align
    want = int(_split_ids(layout, n, rank, scheme, tp, align).shape[0])
    if scheme != "stream_zigzag" and isinstance(x, torch.Tensor) and x.dim() >= 1 and int(x.shape[0]) != want:
        # a batch cut for another rank count: name the group (the layout and x agree with each other)
        for m in range(1, 2 * n + 9):
            if m != n and int(layout.cp_shard(m, min(rank, m - 1), scheme=scheme, tp=tp, align=align).q_width) \
                    == int(x.shape[0]) and int(layout._cp_global(m, tp, align, scheme).q_width) % m == 0:
                raise Error(f"group: x is a {scheme} shard of the layout for {m} ranks ({int(x.shape[0])} tokens), "
                            f"the group has {n} (rank {rank} holds {want})", "MASKPACK_ERR_INVALID_ARGUMENT",
                            argument="group")
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or int(x.shape[0]) != want:
        found = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise Error(f"x: expected this rank's {scheme} shard of the layout for {n} ranks (rank {rank}: {want} tokens "
                    f"first), found {found}", "MASKPACK_ERR_SHAPE", argument="x")
    send, recv, length = _reshard_plan(layout, n, rank, (scheme, tp, align), (to_scheme, to_tp, to_align))
    if scheme == to_scheme and tp == to_tp and align == to_align:
        return x
    return _Reshard.apply(x, group, send, recv, int(x.shape[0]), length)


_CP_SCHEME_NAMES = ("zigzag", "contiguous", "ulysses", "stream_zigzag")


# ---- head-parallel Gated DeltaNet and conv1d (the kernel runs unchanged on whole sequences) -----------


def _heads_to_sequences_raw(x: torch.Tensor, layout, group, n: int, scheme, tp, align) -> torch.Tensor:
    from . import _shm
    from ._moves import cp_gather

    t_local = x.shape[0]
    views = None if _is_mpi(group) else _shm.exchange_views(x, 1, group, dist.get_rank(group), n)
    if views is not None:  # one host: each rank's block moved from its segment straight into the layout
        with torch.no_grad():
            whole = cp_gather(views, layout,
                              scheme=scheme, tp=tp, align=align)
        _shm.release(group)
        return whole
    mixed = _all_to_all(x.contiguous(), group, 1, 0)  # [n * T_local, heads/n, ...], rank order
    with torch.no_grad():
        return cp_gather(list(torch.split(mixed, t_local, dim=0)), layout, scheme=scheme, tp=tp, align=align)


def _sequences_to_heads_raw(whole: torch.Tensor, layout, group, n: int, scheme, tp, align) -> torch.Tensor:
    from . import _shm
    from ._alloc import fresh

    sh = layout.cp_shard(n, 0, scheme=scheme, tp=tp, align=align)
    t_local = sh.n_rows * sh.q_width  # every rank's shard holds as many tokens (of the aligned grid)
    if not _is_mpi(group) and whole.device.type == "cpu":
        def fill(s_, dst):  # rank s's shard of the whole, straight into shared memory (or kept: ours)
            with torch.no_grad():
                return layout.shard(whole, n, s_, scheme=scheme, tp=tp, align=align, out=dst)

        out = _shm.gather_blocks(fill, (t_local,) + tuple(whole.shape[1:]), whole.dtype, 1, group,
                                 dist.get_rank(group), n)
        if out is not None:  # one host: one write per shard into the segment, one read into place
            return out
    buf = fresh((n * t_local,) + tuple(whole.shape[1:]), whole.dtype)
    with torch.no_grad():  # each rank's shard straight into its block of the buffer: no concatenation
        for s_ in range(n):
            layout.shard(whole, n, s_, scheme=scheme, tp=tp, align=align, out=buf[s_ * t_local:(s_ + 1) * t_local])
    return _all_to_all(buf, group, 0, 1)


class _HeadsToSequences(torch.autograd.Function):
    """This rank's token shard of every head [T_local, heads, ...] -> every token of this rank's
    heads/n heads in the packed ``layout``: an all-to-all over the heads (rank s receives head group s
    of every shard), then the shards put together in the layout; backward: the reverse move."""

    @staticmethod
    def forward(ctx, x, layout, group, n, scheme, tp, align):
        ctx.args = (layout, group, n, scheme, tp, align)
        return _heads_to_sequences_raw(x.detach(), layout, group, n, scheme, tp, align)

    @staticmethod
    def backward(ctx, grad):
        return (_sequences_to_heads_raw(grad.contiguous(), *ctx.args),) + (None,) * 6


class _SequencesToHeads(torch.autograd.Function):
    """The reverse of _HeadsToSequences (and its adjoint)."""

    @staticmethod
    def forward(ctx, whole, layout, group, n, scheme, tp, align):
        ctx.args = (layout, group, n, scheme, tp, align)
        return _sequences_to_heads_raw(whole.detach(), layout, group, n, scheme, tp, align)

    @staticmethod
    def backward(ctx, grad):
        return (_heads_to_sequences_raw(grad.contiguous(), *ctx.args),) + (None,) * 6


def _heads_to_sequences(parts_dim: torch.Tensor, layout, group, n: int, scheme, tp, align) -> torch.Tensor:
    """This rank's token shard of every head -> every token of this rank's heads/n heads, in
    ``layout``. Differentiable (packed layouts through the fused moves above)."""
    if layout.packed:
        return _HeadsToSequences.apply(parts_dim, layout, group, n, scheme, tp, align)
    t_local = parts_dim.shape[0]
    mixed = _AllToAll.apply(parts_dim.contiguous(), group, 1, 0)
    from ._moves import cp_gather

    return cp_gather(list(torch.split(mixed, t_local, dim=0)), layout, scheme=scheme, tp=tp, align=align)


def _sequences_to_heads(whole: torch.Tensor, layout, group, n: int, scheme, tp, align) -> torch.Tensor:
    """The reverse: every token of this rank's head group in ``layout`` -> this rank's token shard
    of every head, [T_local, heads, ...]. Differentiable."""
    if layout.packed:
        return _SequencesToHeads.apply(whole, layout, group, n, scheme, tp, align)
    shards = [layout.shard(whole, n, s, scheme=scheme, tp=tp, align=align) for s in range(n)]
    return _AllToAll.apply(torch.cat(shards, dim=0).contiguous(), group, 0, 1)


class _GatherReplicated(torch.autograd.Function):
    """Every rank's block -> the blocks concatenated along ``dim``, the same on every rank; backward:
    this rank's block of the gradient, with no collective (the output is replicated: every rank is
    expected to use it alike, as with Megatron's gather from a model-parallel region). A backward
    without a collective cannot hang when only some ranks put the value into their loss."""

    @staticmethod
    def forward(ctx, x, group, dim):
        from . import _shm

        rank, n = _rank_size(group)
        ctx.args = (rank, n, dim)
        views = _shm.all_gather(x.detach().contiguous(), group, rank, n)  # one host: shared memory
        if views is not None:
            whole = torch.cat(views, dim=dim)  # copied out before the segment is written again
            _shm.release(group)
            return whole
        return torch.cat(_all_gather(x.detach(), group), dim=dim)

    @staticmethod
    def backward(ctx, grad):
        rank, n, dim = ctx.args
        return torch.tensor_split(grad, n, dim=dim)[rank].contiguous(), None, None


_CP_METHODS = ("auto", "head", "sequence")


def _cp_method(method: str, group, heads_a: int, heads_b: int) -> str:
    """The GDN / conv way: "head" and "sequence" as asked, "auto" head-parallel when both head
    counts (or the conv's channels) divide by the group size, else sequence-parallel. Decided from
    shapes every rank shares, so every rank takes the same way."""
    if method not in _CP_METHODS:
        raise Error(f"cp_method: expected one of {', '.join(_CP_METHODS)}, found {method!r}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="cp_method")
    if method != "auto":
        return method
    if _is_mpi(group):
        return "sequence"  # the C algorithm; head-parallel runs over torch.distributed
    _, n = _rank_size(group)
    return "head" if heads_a % n == 0 and heads_b % n == 0 else "sequence"


def _check_heads(name: str, heads: int, n: int) -> None:
    if heads % n:
        raise Error(f"{name}: {heads} heads do not divide by the {n} ranks of the group (head-parallel context "
                    f"parallelism gives each rank heads/{n} of them)", "MASKPACK_ERR_SHAPE", argument=name)


# The device types each backend moves. gloo moves CUDA tensors too (through host staging: torch's gloo
# all-gathers, all-reduces and reduce-scatters them, and the all-to-all, which gloo lacks for CUDA, is
# staged here); NCCL and HCCL move only their own devices.
_BACKEND_DEVICES = {"gloo": ("cpu", "cuda"), "mpi": ("cpu",), "nccl": ("cuda",), "hccl": ("npu",)}


def _backend_devices(group) -> Optional[tuple]:
    """The device types the group's backend moves (None: a backend maskpack does not know)."""
    if _is_mpi(group):
        return ("cpu",)  # the C algorithms read host memory
    try:
        return _BACKEND_DEVICES.get(str(dist.get_backend(group)).lower())
    except (RuntimeError, ValueError, AttributeError):
        return None


def _backend_device(group) -> Optional[str]:
    """The device the group's own exchanges (the agreement check) run on: the backend's first."""
    devs = _backend_devices(group)
    return devs[0] if devs else None


def _check_shard(name: str, x: torch.Tensor, layout, n: int, rank: int, scheme, tp, align, group=None,
                 kernel: bool = False) -> None:
    """x is this rank's shard, on a device the group moves; ``kernel``: maskpack's CPU kernels read it."""
    want = layout.cp_shard(n, rank, scheme=scheme, tp=tp, align=align)
    lead = (want.n_rows * want.q_width,) if want.packed else (want.n_rows, want.q_width)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch tensor, found {type(x).__name__}")
    if kernel and x.device.type != "cpu":
        raise Error(f"{name}: maskpack's attention, Gated DeltaNet and conv kernels run on the CPU, this tensor is on "
                    f"{x.device} (on an accelerator, run your device's kernels between maskpack's collectives: "
                    f"ulysses_all_to_all, cp_all_gather)", "MASKPACK_ERR_UNSUPPORTED", argument=name)
    want = _backend_devices(group)
    if want is not None and x.device.type not in want:
        backend = "mpi4py" if _is_mpi(group) else dist.get_backend(group)
        raise Error(f"{name}: the group's {backend} backend moves {' and '.join(want)} tensors, this one is on "
                    f"{x.device} (move it, or pass a group of another backend)", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument=name)
    if tuple(x.shape[:len(lead)]) != lead:
        raise Error(f"{name}: expected this rank's shard (rank {rank} of {n}) with leading dimensions {list(lead)}, "
                    f"found shape {list(x.shape)}", "MASKPACK_ERR_SHAPE", argument=name)


_SCATTER_RUNS = 64  # runs a sender copies one by one; beyond, one index_copy_ per tensor


def _scatter_rows(move, source: int, x: torch.Tensor, dst: torch.Tensor) -> None:
    """Source ``source``'s tokens of a gather ``move`` from x (that source's part) into their rows of
    dst (the whole), leaving every other row as it is (another sender writes those)."""
    runs = move.source_runs(source)
    if len(runs) <= _SCATTER_RUNS:
        for d, s_, length in runs:
            dst.narrow(0, d, length).copy_(x.narrow(0, s_, length))
        return
    pos, src = move.index("cpu")[0][source]
    dst.index_copy_(0, pos, x if src is None else x.index_select(0, src))


def _gdn_cp_no_grad(xs, h0, layout, group, rank: int, n: int, scheme, tp, align, kwargs):
    """Head-parallel GDN without autograd (inference, a reference policy's log-probs, the first pass of
    activation checkpointing) when every rank shares this host: one write per byte each way. Each rank
    writes its tokens of head group s straight into rank s's shared-memory segment, at their rows of
    the whole batch; rank s runs the kernel on its segment and writes o and the final state into the
    same segment; each rank then reads its own tokens of every head group out of every segment into
    its result. The general path copies every byte twice more (into a segment, then into place, each
    way), which with no spare core to hide behind is a quarter of the step. Returns (o [T_local, HV,
    V], final_state [segments, HV, K, V]), or None where the shared-memory path does not apply (the
    caller then runs the general path). Bitwise equal to it: the same kernel on the same inputs."""
    from . import _shm
    from ._alloc import fresh
    from ._moves import _plan
    from .gdn import gated_delta_rule

    if not layout.packed:
        return None
    q, k, v, g, beta = xs
    shards = [layout.cp_shard(n, r_, scheme=scheme, tp=tp, align=align) for r_ in range(n)]
    move = _plan(shards, layout)  # the gather every rank's tokens take into the whole (cached)
    T = layout._per_token_shape()[0]
    HVn, K, V = v.shape[1] // n, q.shape[-1], v.shape[-1]
    shapes = [(T, x.shape[1] // n) + tuple(x.shape[2:]) for x in xs]
    shapes += [(T, HVn, V), (layout.n_segments, HVn, K, V)]
    dtypes = [x.dtype for x in xs] + [v.dtype, torch.float32]
    sizes = [_shm._nbytes(shape, dt) for shape, dt in zip(shapes, dtypes)]
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += (size + 63) & ~63  # each tensor on a cache line of its own
    segs = _shm.segments(group, rank, n, total)
    if segs is None:
        return None

    def view(s_: int, i: int) -> torch.Tensor:  # tensor i of rank s_'s segment
        return segs[s_][offsets[i]:offsets[i] + sizes[i]].view(dtypes[i]).view(shapes[i])

    # rows of the whole that no rank holds (its padding) keep what the segment held: the kernel never
    # reads padded positions (maskpack.h, Gated DeltaNet conventions)
    for i, x in enumerate(xs):
        width = shapes[i][1]
        for s_ in range(n):  # this rank's tokens of head group s_, into rank s_'s whole
            _scatter_rows(move, rank, x.narrow(1, s_ * width, width), view(s_, i))
    _shm.barrier(group)
    ins = [view(rank, i) for i in range(len(xs))]
    gated_delta_rule(*ins, layout, initial_state=h0, out=(view(rank, 5), view(rank, 6)), **kwargs)
    _shm.barrier(group)  # every rank's o and final state written
    o = fresh((q.shape[0], v.shape[1], V), v.dtype)
    ht = fresh((layout.n_segments, v.shape[1], K, V), torch.float32)
    for s_ in range(n):  # this rank's tokens of head group s_, out of rank s_'s segment
        layout.shard(view(s_, 5), n, rank, scheme=scheme, tp=tp, align=align, out=o.narrow(1, s_ * HVn, HVn))
        ht.narrow(1, s_ * HVn, HVn).copy_(view(s_, 6))
    _shm.barrier(group)  # nobody writes a segment again while a peer still reads it
    return o, ht


# shards q, k, v, g, beta [T_local, ..], whole layout, group -> (o [T_local, HV, V], final_state)
def gated_delta_rule_cp(q, k, v, g, beta, layout, group, scale=None, initial_state=None, chunked=True, l2norm=True,
                        threads=None, scheme="zigzag", tp=1, align="verl"):
    """Head-parallel context parallelism for :func:`maskpack.gated_delta_rule` (reached through its
    ``group=``): q, k, v, g, beta are this rank's CP shard ([T_local, heads, ...], as
    ``layout.shard(x, cp, rank, scheme, tp, align)`` cut them) of the whole batch ``layout``. An
    all-to-all gives each rank every token of HV/cp value heads (and the H/cp key heads they read), the
    single-process kernel runs unchanged on whole sequences, and a second all-to-all returns this
    rank's shard of o for every head (as Megatron-core does for GDN). The result equals the
    single-process run bitwise. Returns (o [T_local, HV, V], final_state [segments, HV, K, V], the same
    on every rank). Differentiable end to end; final_state is a replicated value: its gradient on each
    rank reaches that rank's heads (use it alike on every rank, or on none). Every rank must run the
    backward (its all-to-alls pair up across the group)."""
    _refuse_mpi(group, "head-parallel Gated DeltaNet (cp_method='head')")
    from .gdn import gated_delta_rule

    rank, n = _rank_size(group)
    H, HV = q.shape[-2], v.shape[-2]
    local = None
    try:  # this rank's own checks; the exchange below makes every rank raise alike
        _check_heads("q", H, n)
        _check_heads("v", HV, n)
        for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
            _check_shard(name, x, layout, n, rank, scheme, tp, align, group, kernel=True)
        # the gate's values too, before any exchange: the kernel would refuse a growing gate only
        # after the all-to-all, on this rank alone, and leave the others waiting in the next one
        from ._maskpack import gdn as _gdn
        from ._tensors import layout_handle

        _gdn.check_gate(layout_handle(layout.cp_shard(n, rank, scheme=scheme, tp=tp, align=align)),
                        g.detach() if g.requires_grad else g)
    except (Error, TypeError) as exc:
        local = [exc]  # boxed: _agree takes it out, so no frame keeps it (see _agree)
    # whether autograd records decides the exchange (see _gdn_cp_no_grad), so every rank must agree
    records = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                              for t in (q, k, v, g, beta, initial_state))
    _agree(group, layout, "gated_delta_rule", _gdn_settings(layout, scheme, tp, align, (q, k, v, g, beta), scale,
                                                            initial_state, l2norm, chunked)
           + [("group", "autograd recording (an input requiring grad on some ranks only)", "flag", records)], local)
    args = (layout, group, n, scheme, tp, align)
    h0 = None
    if initial_state is not None:
        h0 = torch.tensor_split(initial_state, n, dim=1)[rank]
    if not records:
        done = _gdn_cp_no_grad((q, k, v, g, beta), h0, layout, group, rank, n, scheme, tp, align,
                               dict(scale=scale, chunked=chunked, l2norm=l2norm, threads=threads))
        if done is not None:
            return done
    qw, kw, vw = (_heads_to_sequences(x, *args) for x in (q, k, v))
    gw, bw = (_heads_to_sequences(x, *args) for x in (g, beta))
    o, ht = gated_delta_rule(qw, kw, vw, gw, bw, layout, scale=scale, initial_state=h0, chunked=chunked,
                             l2norm=l2norm, threads=threads)
    o_local = _sequences_to_heads(o, *args)
    return o_local, _GatherReplicated.apply(ht, group, 1)  # every rank's head group, on every rank


# shard x [T_local, C], weight, whole layout, group -> (y [T_local, C], conv_state [segments, C, W-1])
def causal_conv1d_cp(x, weight, layout, group, activation="silu", prefix=None, threads=None, scheme="zigzag", tp=1,
                     align="verl"):
    """Channel-parallel context parallelism for :func:`maskpack.causal_conv1d` (its ``group=``): x is
    this rank's CP shard [T_local, C] of the whole batch ``layout``; each rank convolves C/cp channels
    over whole sequences (so a segment split across ranks reads the inputs before it exactly) and the
    outputs return to the token shards. Returns (y [T_local, C], conv_state [segments, C, W-1], the
    same on every rank, replicated as gated_delta_rule_cp's final state); bitwise equal to the
    single-process run; differentiable."""
    _refuse_mpi(group, "the context-parallel conv")
    from .gdn import causal_conv1d

    rank, n = _rank_size(group)
    C = x.shape[-1]
    local = None
    try:
        _check_heads("x", C, n)
        _check_shard("x", x, layout, n, rank, scheme, tp, align, group, kernel=True)
    except (Error, TypeError) as exc:
        local = [exc]  # boxed: _agree takes it out, so no frame keeps it (see _agree)
    _agree(group, layout, "causal_conv1d", _conv_settings(layout, scheme, tp, align, x, weight, activation, prefix),
           local)
    args = (layout, group, n, scheme, tp, align)
    xw = _heads_to_sequences(x, *args)
    w = torch.tensor_split(weight, n, dim=0)[rank]
    p = torch.tensor_split(prefix, n, dim=1)[rank] if prefix is not None else None
    y, state = causal_conv1d(xw, w, layout, activation=activation, prefix=p, threads=threads)
    return _sequences_to_heads(y, *args), _GatherReplicated.apply(state, group, 1)


# ---- attention across ranks ----------------------------------------------------------------------------


class _TorchComm:
    """The library's communicator callbacks (maskpack_comm) over a torch.distributed group: the C ring
    (src/distributed/cp_ring.c, the same code MPI programs run) calls these with the GIL taken back,
    over writable memoryviews of its own buffers. A failure is kept in ``error`` for the binding to
    re-raise (the C call itself returns MASKPACK_ERR_COMM)."""

    def __init__(self, group):
        self.group = group if group is not None else dist.group.WORLD
        self.rank, self.size = _rank_size(group)
        self.error: Optional[BaseException] = None

    @staticmethod
    def _t(view) -> torch.Tensor:
        return torch.frombuffer(view, dtype=torch.uint8)

    def _peer(self, r: int) -> int:
        return dist.get_global_rank(self.group, r)

    def all_gather(self, send, recv) -> None:
        from . import _shm

        views = _shm.all_gather(self._t(send), self.group, self.rank, self.size)  # one host: shared memory
        if views is not None:
            torch.cat(views, out=self._t(recv))
            _shm.release(self.group)
            return
        dist.all_gather(list(self._t(recv).chunk(self.size)), self._t(send), group=self.group)

    def all_to_all(self, send, recv) -> None:
        from . import _shm

        x = self._t(send).view(self.size, -1)
        out = _shm.all_to_all(x, 0, 0, self.group, self.rank, self.size)  # one host: shared memory
        if out is not None:
            self._t(recv).copy_(out.view(-1))
            return
        dist.all_to_all(list(self._t(recv).chunk(self.size)), list(self._t(send).chunk(self.size)), group=self.group)

    def sendrecv_start(self, send, to: int, recv, frm: int, tag: int) -> list:
        works = []
        if frm >= 0:  # the receive first, so the peer's message lands in place
            works.append(dist.irecv(self._t(recv), src=self._peer(frm), group=self.group, tag=tag))
        if to >= 0:
            works.append(dist.isend(self._t(send), dst=self._peer(to), group=self.group, tag=tag))
        return works

    def wait(self, works: list) -> None:
        for w in works:
            w.wait()


class _MpiComm:
    """The same callbacks over an mpi4py communicator: the library's C algorithms run over MPI from
    Python exactly as from a C program."""

    def __init__(self, comm):
        from mpi4py import MPI

        self.comm, self.MPI = comm, MPI
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.error: Optional[BaseException] = None

    def all_gather(self, send, recv) -> None:
        self.comm.Allgather([send, self.MPI.BYTE], [recv, self.MPI.BYTE])

    def all_to_all(self, send, recv) -> None:
        self.comm.Alltoall([send, self.MPI.BYTE], [recv, self.MPI.BYTE])

    def sendrecv_start(self, send, to: int, recv, frm: int, tag: int) -> list:
        reqs = []
        if frm >= 0:
            reqs.append(self.comm.Irecv([recv, self.MPI.BYTE], source=frm, tag=tag))
        if to >= 0:
            reqs.append(self.comm.Isend([send, self.MPI.BYTE], dest=to, tag=tag))
        return reqs

    def wait(self, reqs: list) -> None:
        self.MPI.Request.Waitall(reqs)


def _comm_for(group):
    return _MpiComm(group) if _is_mpi(group) else _TorchComm(group)


def _refuse_mpi(group, what: str) -> None:
    if _is_mpi(group):
        raise Error(f"group: {what} runs over a torch.distributed group; with an mpi4py communicator maskpack runs "
                    "its C algorithms (ring attention, sequence-parallel Gated DeltaNet)", "MASKPACK_ERR_UNSUPPORTED",
                    argument="group")


def _ring_call(fn, comm, *args) -> None:
    try:
        fn(comm, comm.rank, comm.size, *args)
    except Error as exc:
        if comm.error is not None:  # the transport's own exception (a timeout, a closed peer) as the cause
            raise Error(f"group: ring attention's exchange failed on rank {comm.rank}: {comm.error}",
                        "MASKPACK_ERR_COMM", argument="group") from comm.error
        raise exc


def _ring_supported(q, k, v, layout) -> bool:
    rule = layout.rule
    return (all(x.device.type == "cpu" and x.dtype == torch.float32 for x in (q, k, v))
            and not rule.get("spans") and not rule.get("prefix"))


class _RingAttention(torch.autograd.Function):
    """Ring attention (maskpack_cp_attention_forward / _backward) on this rank's shard -> (out, lse):
    lse is the ring's merged log-sum-exp of this rank's query rows (the C call fills it in the shard's
    token order); out only is differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, whole, group, scheme, scale, softcap, threads):
        from ._maskpack import attention as _attention
        from ._attention import _lse_shape, _scale, _softcap
        from ._tensors import describe, layout_handle

        comm = _comm_for(group)
        q, k, v = (x.detach().contiguous() for x in (q, k, v))
        out = torch.empty_like(q)
        lse = torch.empty(_lse_shape(whole, q), dtype=torch.float32)
        nthreads = _threads(threads)
        descs = [describe(x, name)[0] for name, x in (("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse))]
        _ring_call(_attention.cp_forward, comm, layout_handle(whole), _SCHEMES[scheme], descs[0], descs[1],
                   descs[2], _scale(scale), _softcap(softcap), descs[3], descs[4], _team(nthreads))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (whole, group, scheme, scale, softcap, nthreads)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        from ._maskpack import attention as _attention
        from ._attention import _scale, _softcap
        from ._tensors import describe, layout_handle

        q, k, v, out, lse = ctx.saved_tensors
        whole, group, scheme, scale, softcap, nthreads = ctx.args
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        names = ("dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv")
        d = [describe(x, n)[0] for n, x in zip(names, (dout, q, k, v, out, lse, dq, dk, dv))]
        _ring_call(_attention.cp_backward, _comm_for(group), layout_handle(whole), _SCHEMES[scheme], *d[:6],
                   _scale(scale), _softcap(softcap), *d[6:], _team(nthreads))
        return dq, dk, dv, None, None, None, None, None, None


_CP_ALGORITHMS = ("auto", "ring", "all_gather")


# shards q [T_local, Hq, D], k, v [T_local, Hkv, D], whole layout, group -> (out [T_local, Hq, D], lse [Hq, T_local])
def attention_cp(q, k, v, layout, group, scale=None, softcap=0.0, threads=None, scheme="zigzag", tp=1,
                 align="verl", algorithm="auto"):
    """Context-parallel attention (reached through :func:`maskpack.attention`'s ``group=``): q, k, v are
    this rank's CP shard of the whole batch ``layout``; returns ``(out, lse)`` as the single-process
    call does, for this rank's query rows: out like q (differentiable in q, k, v), lse float32
    ``[Hq, T_local]`` (``[B, Hq, S_local]`` for a padded shard) in the shard's token order, the rows of
    the whole batch's lse this rank holds (not differentiable). Two algorithms, the same result up to
    the rounding of merging:

    - ``"ring"`` (the default where it applies: CPU float32 tensors, a rule without spans or prefix):
      maskpack's ring (the C code MPI programs run, here over the group's point-to-point send and
      receive): key/value blocks travel while each rank computes, partial outputs merge by their
      log-sum-exp, and a block the rule wholly hides from a rank is neither sent nor computed.
      Backward sends the blocks round again and returns each block's key/value gradients to its owner.
      Memory: two blocks in flight, never the whole K/V.
    - ``"all_gather"`` (any device and dtype, every rule): the keys and values of every rank are
      all-gathered and the rank's queries attend to them through its shard layout in one kernel call,
      bitwise equal to the single-process run (lse included); backward reduce-scatters dk, dv.
    """
    from ._moves import relayout
    from ._attention import attention

    rank, n = _rank_size(group)
    local = None
    try:
        if algorithm not in _CP_ALGORITHMS:
            raise Error(f"algorithm: expected one of {', '.join(_CP_ALGORITHMS)}, found {algorithm!r}",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument="algorithm")
        for name, x in (("q", q), ("k", k), ("v", v)):
            _check_shard(name, x, layout, n, rank, scheme, tp, align, group, kernel=True)
        if _is_mpi(group) and (algorithm == "all_gather" or not _ring_supported(q, k, v, layout)):
            raise Error("algorithm: with an mpi4py communicator attention runs as the ring (CPU float32, a rule "
                        "without spans or prefix)", "MASKPACK_ERR_UNSUPPORTED", argument="algorithm")
        if algorithm == "ring" and not _ring_supported(q, k, v, layout):
            raise Error("algorithm: the ring takes CPU float32 tensors and a rule without spans or prefix "
                        f"(found {q.device.type} {q.dtype}); use algorithm='all_gather'",
                        "MASKPACK_ERR_UNSUPPORTED", argument="algorithm")
    except (Error, TypeError) as exc:
        local = [exc]  # boxed: _agree takes it out, so no frame keeps it (see _agree)
    ring = not local and algorithm != "all_gather" and _ring_supported(q, k, v, layout)
    hd = "[heads, head dim]"
    _agree(group, layout, "attention", _cp_settings(scheme, tp, align)
           + [("algorithm", "algorithm (the ring or the all-gather)", "choice", "ring" if ring else "all_gather",
               ("ring", "all_gather"))]
           + _tensor_settings(layout, ("q", q, hd), ("k", k, hd), ("v", v, hd))
           + [("scale", "scale", "real", scale), ("softcap", "softcap", "real", softcap)], local)
    whole = layout._cp_global(n, tp, align, scheme)  # the grid the shard layouts' keys index
    if ring:
        return _RingAttention.apply(q, k, v, whole, group, scheme, scale, softcap, threads)
    mine = layout.cp_shard(n, rank, scheme=scheme, tp=tp, align=align)
    kw, vw = (relayout(cp_all_gather(x, layout, group, scheme=scheme, tp=tp, align=align), layout, whole)
              for x in (k, v))
    # the local call gives the shard layout's lse (its rows are this rank's queries), differentiable in
    # q and, through the gathers, in k, v whenever autograd records
    return attention(q, kw, vw, mine, scale=scale, softcap=softcap, threads=threads)


# ---- sequence-parallel Gated DeltaNet and conv1d (each rank runs its own pieces at once) -------------
#
# The algorithms are the library's (src/distributed/cp_gdn.c, over maskpack_comm: the same code MPI
# programs call); here they run over the group through _TorchComm / _MpiComm. The rule is affine in
# the state: each rank runs its pieces once, from zero states and through identity states side by
# side, the pieces' transitions (P, B) are all-gathered and composed in sequence order, and each rank
# corrects its outputs with the true incoming states (one K x V product per token and head). The
# conv takes each continuing piece's prefix from the all-gathered tails of the pieces before it.


def _gdn_settings(layout, scheme, tp, align, xs, scale, initial_state, l2norm, chunked) -> list:
    """What every rank of a GDN call must share: the CP settings, q, k, v, g, beta (dtype, per-token shape:
    key heads and head dim, value heads and head dim), the options that change the values."""
    hd = "[heads, head dim]"
    q, k, v, g, beta = xs
    return (_cp_settings(scheme, tp, align)
            + _tensor_settings(layout, ("q", q, hd), ("k", k, hd), ("v", v, hd), ("g", g, "[value heads]"),
                               ("beta", beta, "[value heads]"))
            + [("scale", "scale", "real", scale), ("initial_state", "presence of an initial state", "flag",
                                                   initial_state is not None),
               ("l2norm", "l2norm", "flag", l2norm), ("chunked", "chunked form", "flag", chunked)])


def _conv_settings(layout, scheme, tp, align, x, weight, activation, prefix) -> list:
    return (_cp_settings(scheme, tp, align) + _tensor_settings(layout, ("x", x, "[channels]"))
            + [("weight", "weight dtype", "dtype", _dtype(weight)),
               ("weight", "weight shape", "shape", tuple(weight.shape) if isinstance(weight, torch.Tensor) else None),
               ("activation", "activation", "choice", activation, ("silu", None)),
               ("prefix", "presence of a prefix", "flag", prefix is not None)])


def _check_sequence_args(layout, n, rank, scheme, tp, align, group, tensors) -> None:
    if not layout.packed:
        raise Error("layout: sequence-parallel context parallelism takes a packed (THD) layout; pad rows are "
                    "whole sequences already (use the head-parallel way)", "MASKPACK_ERR_UNSUPPORTED",
                    argument="layout")
    for name, x in tensors:
        _check_shard(name, x, layout, n, rank, scheme, tp, align, group, kernel=True)


class _SequenceGDN(torch.autograd.Function):
    """maskpack_cp_gdn_forward / _backward (the C algorithm MPI programs run) over the group."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, h0, whole, group, scheme, scale, chunked, l2norm, threads):
        from ._maskpack import gdn as _gdn
        from ._tensors import describe_kernel as _d, layout_handle

        comm = _comm_for(group)
        q, k, v, g, beta = (x.detach().contiguous() for x in (q, k, v, g, beta))
        h0 = None if h0 is None else h0.detach().contiguous()
        o = torch.empty_like(v)
        ht = torch.empty((whole.n_segments, v.shape[-2], q.shape[-1], v.shape[-1]), dtype=torch.float32)
        descs = (_d(q, "q"), _d(k, "k"), _d(v, "v"), _d(g, "g"), _d(beta, "beta"), _d(h0, "initial_state"),
                 _d(o, "o"), _d(ht, "final_state"))
        _ring_call(_gdn.cp_forward, comm, layout_handle(whole), _SCHEMES[scheme], descs, scale, chunked, l2norm,
                   _team(threads))
        ctx.save_for_backward(q, k, v, g, beta, h0)
        ctx.args = (whole, group, scheme, scale, l2norm, threads)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        from ._maskpack import gdn as _gdn
        from ._tensors import describe_kernel as _d, layout_handle

        q, k, v, g, beta, h0 = ctx.saved_tensors
        whole, group, scheme, scale, l2norm, threads = ctx.args
        do = torch.zeros_like(v) if do is None else do.contiguous()
        dht = None if dht is None else dht.contiguous()
        dq, dk, dv, dg, db = (torch.empty_like(x) for x in (q, k, v, g, beta))
        dh0 = None if h0 is None else torch.empty_like(h0)
        descs = (_d(q, "q"), _d(k, "k"), _d(v, "v"), _d(g, "g"), _d(beta, "beta"), _d(h0, "initial_state"),
                 _d(do, "d_o"), _d(dht, "d_final_state"), _d(dq, "dq"), _d(dk, "dk"), _d(dv, "dv"), _d(dg, "dg"),
                 _d(db, "dbeta"), _d(dh0, "d_initial_state"))
        _ring_call(_gdn.cp_backward, _comm_for(group), layout_handle(whole), _SCHEMES[scheme], descs, scale, l2norm,
                   _team(threads))
        return dq, dk, dv, dg, db, dh0, None, None, None, None, None, None, None


# shards q, k, v, g, beta [T_local, ..], whole layout, group -> (o [T_local, HV, V], final_state)
def gated_delta_rule_sp(q, k, v, g, beta, layout, group, scale=None, initial_state=None, chunked=True, l2norm=True,
                        threads=None, scheme="zigzag", tp=1, align="verl"):
    """Sequence-parallel context parallelism for :func:`maskpack.gated_delta_rule` (its ``group=`` with
    ``cp_method="sequence"``, or "auto" when the heads do not divide by the group): q, k, v, g, beta
    are this rank's CP shard (float32) of the packed whole batch ``layout``, any head counts. The
    library's algorithm (maskpack_cp_gdn_forward, the code MPI programs run) over the group: each rank
    runs its pieces from zero states and through an identity state at once, the pieces' transitions
    (K x K + K x V per value head) are all-gathered and composed in sequence order, and each rank runs
    its pieces again from the true incoming states; no rank waits for the piece before its own. Equal
    to the single-process run up to the rounding of composing the transitions. Returns
    (o [T_local, HV, V], final_state [segments, HV, K, V], the same on every rank; its gradient counts
    once when every rank uses it alike). The initial state's gradient on each rank is its share: sum it
    over the group. Differentiable; every rank runs the backward."""
    import math


    rank, n = _rank_size(group)
    local = None
    try:
        _check_sequence_args(layout, n, rank, scheme, tp, align, group,
                             (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)))
        for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
            if x.dtype != torch.float32:
                raise Error(f"{name}: sequence-parallel Gated DeltaNet takes float32 (found {x.dtype}); bfloat16 "
                            "runs head-parallel (cp_method='head')", "MASKPACK_ERR_DTYPE", argument=name)
    except (Error, TypeError) as exc:
        local = [exc]  # boxed: _agree takes it out, so no frame keeps it (see _agree)
    HV, K, V = v.shape[-2], q.shape[-1], v.shape[-1]
    _agree(group, layout, "gated_delta_rule_sp", _gdn_settings(layout, scheme, tp, align, (q, k, v, g, beta), scale,
                                                               initial_state, l2norm, chunked), local)
    whole = layout._cp_global(n, tp, align, scheme)
    sc = (1.0 / math.sqrt(K)) if scale is None else float(scale)
    h0 = None if initial_state is None else initial_state.float()
    return _SequenceGDN.apply(q, k, v, g, beta, h0, whole, group, scheme, sc, bool(chunked), bool(l2norm),
                              _threads(threads))


class _SequenceConv(torch.autograd.Function):
    """maskpack_cp_causal_conv1d / _backward (the C algorithm) over the group."""

    @staticmethod
    def forward(ctx, x, w, prefix, whole, group, scheme, silu, threads):
        from ._maskpack import gdn as _gdn
        from ._tensors import describe_kernel as _d, layout_handle

        x, w = x.detach().contiguous(), w.detach().contiguous()
        prefix = None if prefix is None else prefix.detach().contiguous()
        y = torch.empty_like(x)
        state = torch.empty((whole.n_segments, x.shape[-1], w.shape[-1] - 1), dtype=torch.float32)
        descs = (_d(x, "x"), _d(w, "weight"), _d(prefix, "prefix"), _d(y, "y"), _d(state, "conv_state"))
        _ring_call(_gdn.cp_conv1d, _comm_for(group), layout_handle(whole), _SCHEMES[scheme], descs, silu, _team(threads))
        ctx.save_for_backward(x, w, prefix)
        ctx.args = (whole, group, scheme, silu, threads)
        return y, state

    @staticmethod
    def backward(ctx, dy, dstate):
        from ._maskpack import gdn as _gdn
        from ._tensors import describe_kernel as _d, layout_handle

        x, w, prefix = ctx.saved_tensors
        whole, group, scheme, silu, threads = ctx.args
        dy = torch.zeros_like(x) if dy is None else dy.contiguous()
        dstate = None if dstate is None else dstate.contiguous()
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        dp = None if prefix is None else torch.empty_like(prefix)
        descs = (_d(x, "x"), _d(w, "weight"), _d(prefix, "prefix"), _d(dy, "dy"), _d(dstate, "d_conv_state"),
                 _d(dx, "dx"), _d(dw, "dweight"), _d(dp, "d_prefix"))
        _ring_call(_gdn.cp_conv1d_backward, _comm_for(group), layout_handle(whole), _SCHEMES[scheme], descs, silu,
                   _team(threads))
        return dx, dw, dp, None, None, None, None, None


# shard x [T_local, C], weight, whole layout, group -> (y [T_local, C], conv_state [segments, C, W-1])
def causal_conv1d_sp(x, weight, layout, group, activation="silu", prefix=None, threads=None, scheme="zigzag", tp=1,
                     align="verl"):
    """Sequence-parallel context parallelism for :func:`maskpack.causal_conv1d`: x is this rank's CP
    shard [T_local, C] (float32) of the packed whole batch; each piece that continues a sequence takes
    the last W-1 inputs before it (the library's maskpack_cp_causal_conv1d: every piece's tail
    all-gathered, prefixes composed in sequence order), so every channel stays on its rank. Returns
    (y [T_local, C], conv_state [segments, C, W-1] the same on every rank); bitwise the single-process
    run; differentiable (the weight's and prefix's gradients are each rank's share: sum them over the
    group)."""

    rank, n = _rank_size(group)
    local = None
    try:
        _check_sequence_args(layout, n, rank, scheme, tp, align, group, (("x", x),))
        if activation not in ("silu", None):
            raise Error(f"activation: expected 'silu' or None, found {activation!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                        argument="activation")
        for name, t in (("x", x), ("weight", weight)) + ((("prefix", prefix),) if prefix is not None else ()):
            if t.dtype != torch.float32:
                raise Error(f"{name}: the sequence-parallel conv takes float32 (found {t.dtype})", "MASKPACK_ERR_DTYPE",
                            argument=name)
    except (Error, TypeError) as exc:
        local = [exc]  # boxed: _agree takes it out, so no frame keeps it (see _agree)
    _agree(group, layout, "causal_conv1d_sp", _conv_settings(layout, scheme, tp, align, x, weight, activation, prefix),
           local)
    whole = layout._cp_global(n, tp, align, scheme)
    w2 = weight.reshape(weight.shape[0], weight.shape[-1])
    return _SequenceConv.apply(x, w2, prefix, whole, group, scheme, activation == "silu", _threads(threads))
