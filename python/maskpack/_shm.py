"""A shared-memory path for the all-to-all of CPU tensors when every rank of a gloo group runs on this
host: gloo moves bytes through loopback TCP (kernel copies and socket buffers on both sides), which on
a CPU node costs more than the GDN kernel itself at long sequence lengths; through shared memory each
byte is copied once into the sender's segment and once out of it. The group is still the
caller's: it carries the two barriers around each exchange and the one-time exchange of segment names.
Any failure to set up (another host, no /dev/shm, not enough room) leaves the group's own collective
in charge; MASKPACK_CP_SHM=0 turns the path off.

Protocol per exchange (n ranks, equal blocks of b bytes): rank r writes its n blocks into its own
segment, barrier, rank r copies block r of every peer's segment out, barrier (so that no rank
overwrites its segment while a peer still reads it).
"""

from __future__ import annotations

import mmap
import os
import socket
import weakref
from typing import List, Optional

import torch
import torch.distributed as dist

_DIR = "/dev/shm"


class _Segments:
    """Every rank's segment of one group, mapped in this process. Files are unlinked as soon as every
    rank has mapped them, so nothing outlives the processes."""

    def __init__(self, group, rank: int, n: int) -> None:
        # a weak reference: holding the group would keep its C++ threads alive past the caller's
        # destroy_process_group, to be torn down during interpreter exit (where gloo aborts)
        self._group, self.rank, self.n = weakref.ref(group), rank, n
        self.capacity = 0
        self.maps: List[Optional[mmap.mmap]] = [None] * n
        self.views: List[Optional[torch.Tensor]] = [None] * n
        self.generation = 0

    @property
    def group(self):
        return self._group()

    def close(self) -> None:
        self.views = [None] * self.n
        for m in self.maps:
            if m is not None:
                try:
                    m.close()
                except BufferError:  # a tensor view still alive: the mapping goes with it
                    pass
        self.maps = [None] * self.n
        self.capacity = 0

    def ensure(self, need: int) -> bool:
        """Every rank's segment holds `need` bytes (collective: every rank calls with the same need)."""
        if need <= self.capacity:
            return True
        cap = max(need, 2 * self.capacity)
        self.generation += 1
        name = os.path.join(_DIR, f"maskpack-cp-{os.getpid()}-{id(self)}-{self.generation}")
        ok = True
        try:
            fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.posix_fallocate(fd, 0, cap)  # reserve the pages now: a full tmpfs fails here, not with SIGBUS
            finally:
                os.close(fd)
        except OSError:
            ok = False
        names: List = [None] * self.n
        dist.all_gather_object(names, (ok, name), group=self.group)
        if not all(o for o, _ in names):
            _unlink(name)
            return False
        self.close()
        try:
            for r, (_, nm) in enumerate(names):
                fd = os.open(nm, os.O_RDWR)
                try:
                    self.maps[r] = mmap.mmap(fd, cap)
                finally:
                    os.close(fd)
                self.views[r] = torch.frombuffer(self.maps[r], dtype=torch.uint8)
            mapped = True
        except OSError:
            mapped = False
        flags: List = [None] * self.n
        dist.all_gather_object(flags, mapped, group=self.group)  # every rank mapped every file: unlink
        _unlink(name)
        if not all(flags):
            self.close()
            return False
        self.capacity = cap
        return True


def _unlink(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass


# per group, held weakly (the caller owns the group and its lifetime)
_STATE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_DISABLED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _segments(group, rank: int, n: int) -> Optional[_Segments]:
    """This group's segments, or None when the path does not apply (decided once per group, the same
    way on every rank)."""
    key = group if group is not None else dist.group.WORLD
    seg = _STATE.get(key)
    if seg is not None:
        return seg
    if _DISABLED.get(key):
        return None
    here = (socket.gethostname(), _boot_id(), os.environ.get("MASKPACK_CP_SHM", "1") != "0",
            os.path.isdir(_DIR), dist.get_backend(key) == "gloo")
    everyone: List = [None] * n
    dist.all_gather_object(everyone, here, group=key)
    if any(e != everyone[0] for e in everyone) or not all(everyone[0][2:]):
        _DISABLED[key] = True
        return None
    seg = _STATE[key] = _Segments(key, rank, n)
    return seg


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def in_use(group) -> bool:
    """Whether this group's all-to-alls run through shared memory (decided at its first exchange)."""
    key = group if group is not None else dist.group.WORLD
    seg = _STATE.get(key)
    return seg is not None and seg.capacity > 0


def _acquire(device_type: str, group, rank: int, n: int, nbytes: int) -> Optional[_Segments]:
    """This group's segments holding nbytes per rank, or None when the path does not apply here (one
    rank, another device, other hosts, no room: the failure disables the path for the group)."""
    if n < 2 or device_type != "cpu":
        return None
    seg = _segments(group, rank, n)
    if seg is None:
        return None
    if not seg.ensure(nbytes):
        _STATE.pop(seg.group, None)
        _DISABLED[seg.group] = True
        return None
    return seg


def _nbytes(shape, dtype) -> int:
    b = torch.empty((), dtype=dtype).element_size()
    for d in shape:
        b *= d
    return b


def _slot(seg: _Segments, owner: int, index: int, nbytes: int, dtype, shape) -> torch.Tensor:
    """Block `index` of `owner`'s segment, viewed as a tensor of `shape`."""
    return seg.views[owner][index * nbytes:(index + 1) * nbytes].view(dtype).view(shape)


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group, rank: int, n: int) -> Optional[torch.Tensor]:
    """Ulysses' exchange of a CPU tensor through shared memory: block s of x along scatter_dim goes to
    rank s, and the blocks received are laid side by side along gather_dim in a recycled result
    (exchange_views, then one copy of each block into place). None (nothing done) when the path does
    not apply here, so the caller runs the group's own exchange."""
    views = exchange_views(x, scatter_dim, group, rank, n)
    if views is None:
        return None
    from ._alloc import fresh  # recycled pages: a fresh allocation of this size costs its page faults

    out_shape = list(views[0].shape)
    width = out_shape[gather_dim]
    out_shape[gather_dim] *= n
    out = fresh(tuple(out_shape), x.dtype)
    for s_, v in enumerate(views):
        out.narrow(gather_dim, s_ * width, width).copy_(v)
    release(group)
    return out


def all_gather(x: torch.Tensor, group, rank: int, n: int) -> Optional[List[torch.Tensor]]:
    """Every rank's x (same shape and dtype) through shared memory: x is copied once into this
    rank's segment, and the result is the list of every rank's segment viewed as x's shape (views of
    shared memory: the caller copies out of them before its next exchange on this group, as
    cp_all_gather's move into the layout does). None when the path does not apply here."""
    b = _nbytes(x.shape, x.dtype)
    seg = _acquire(x.device.type, group, rank, n, b)
    if seg is None:
        return None
    _slot(seg, rank, 0, b, x.dtype, x.shape).copy_(x)
    dist.barrier(group=seg.group)
    return [_slot(seg, r, 0, b, x.dtype, x.shape) for r in range(n)]


def release(group) -> None:
    """The end of a read of all_gather's views: no rank writes its segment again before every rank
    is done reading (one barrier)."""
    key = group if group is not None else dist.group.WORLD
    seg = _STATE.get(key)
    if seg is not None:
        dist.barrier(group=key)


def exchange_views(x: torch.Tensor, scatter_dim: int, group, rank: int, n: int) -> Optional[List[torch.Tensor]]:
    """The first half of an all-to-all, for a caller that moves the blocks onward itself: block s of x
    along scatter_dim (s != rank) is copied into slot s of this rank's segment, and the result lists,
    in rank order, the block each rank sends here (a view of its segment) with this rank's own block
    as a view of x (never copied). The caller reads the views, then calls release(group). None when
    the path does not apply here."""
    chunk = x.shape[scatter_dim] // n if n else 0
    shape = list(x.shape)
    shape[scatter_dim] = chunk
    b = _nbytes(shape, x.dtype)
    seg = _acquire(x.device.type, group, rank, n, n * b)
    if seg is None:
        return None
    for s_ in range(n):
        if s_ != rank:
            _slot(seg, rank, s_, b, x.dtype, shape).copy_(x.narrow(scatter_dim, s_ * chunk, chunk))
    dist.barrier(group=seg.group)
    return [x.narrow(scatter_dim, rank * chunk, chunk) if s_ == rank else _slot(seg, s_, rank, b, x.dtype, shape)
            for s_ in range(n)]


def gather_blocks(fill, block_shape, dtype, gather_dim: int, group, rank: int, n: int) -> Optional[torch.Tensor]:
    """The reverse of exchange_views, for a sender that produces its blocks itself: fill(s, dst) writes
    the block for rank s into dst (this rank's segment slot s), or, with dst None, returns this rank's
    own block; the result lays the block every rank made for this one side by side along gather_dim.
    One write per block, straight from the producer into shared memory, and one read into place."""
    b = _nbytes(block_shape, dtype)
    seg = _acquire("cpu", group, rank, n, n * b)
    if seg is None:
        return None
    for s_ in range(n):
        if s_ != rank:
            fill(s_, _slot(seg, rank, s_, b, dtype, block_shape))
    own = fill(rank, None)
    dist.barrier(group=seg.group)
    out_shape = list(block_shape)
    out_shape[gather_dim] *= n
    from ._alloc import fresh

    out = fresh(tuple(out_shape), dtype)
    width = block_shape[gather_dim]
    for s_ in range(n):
        src = own if s_ == rank else _slot(seg, s_, rank, b, dtype, block_shape)
        out.narrow(gather_dim, s_ * width, width).copy_(src)
    dist.barrier(group=seg.group)
    return out


def segments(group, rank: int, n: int, nbytes: int) -> Optional[List[torch.Tensor]]:
    """Every rank's segment (rank order) as uint8 tensors of at least nbytes, for a caller that writes
    straight into its peers' segments (collective: every rank asks for the same nbytes). The caller
    brackets its writes and reads with barrier(group) and ends with one, as the exchanges above do, so
    that no rank writes a segment its owner still reads. None when the path does not apply here."""
    seg = _acquire("cpu", group, rank, n, nbytes)
    return None if seg is None else list(seg.views)


def barrier(group) -> None:
    """The group's barrier between the phases of an exchange through segments()."""
    dist.barrier(group=group if group is not None else dist.group.WORLD)
