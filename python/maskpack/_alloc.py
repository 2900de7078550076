"""Output buffers for the torch binding: large ones come from a cache of already-mapped blocks.

Why: a GDN or attention call's large outputs (o, the final state, the gradients) as fresh
``torch.empty`` buffers would be above glibc's mmap threshold, where every free returns them to the OS,
so every call would fault them in again while the OS clears each page: 13-19 % of the chunked GDN
forward on the benchmark's 2-core machine. A training loop allocates the same outputs step after step, so outputs of
at least ``CACHE_MIN_BYTES`` come from blocks this module keeps once torch no longer uses them (as the
caching allocators of GPU frameworks do).

How: a block is an ordinary torch CPU allocation (a uint8 tensor, 2 MiB more than needed so the part
handed out starts on a huge-page boundary, with a transparent-huge-page hint). An output is a tensor
over the block's storage (``set_``, not a view, so autograd sees an ordinary tensor). The block is free
again when nothing but the cache holds its storage: no tensor, view, numpy array or Python storage
object of it lives (torch's storage reference count, plus the Python reference count of the storage
object torch keeps for it). A block whose storage left it (moved to shared memory by
``share_memory_`` or a DataLoader worker sending it; reallocated by a growing ``resize_``) is
forgotten and never handed out again. A request takes the smallest free block that
fits and wastes at most a quarter of it (packed batches change length from step to step), else makes
a new one. Blocks over the limit are released when a request needs a new block and on every call of
the functions below, so a freed block stays mapped until the next of these.

Because the storage is torch's own, such tensors behave as any other: ``resize_`` to a larger size
grows the storage (torch copies it elsewhere), ``out=`` of a larger result works.

The cache keeps at most ``output_cache_info()["limit"]`` bytes of free blocks (1 GiB unless the
environment variable ``MASKPACK_OUTPUT_CACHE_BYTES`` says otherwise; 0 turns the cache off).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Dict, List, Optional, Tuple

import torch

CACHE_MIN_BYTES = 4 << 20  # smaller buffers: glibc already reuses them without faulting
_ALIGN = 2 << 20  # a transparent huge page
_MAX_BLOCKS = 256  # blocks tracked at most (a bound on the linear searches); beyond: plain torch.empty
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
# torch's count of references to a storage (tensors and storage objects): private, so checked once;
# without it the cache stays off and every output is a plain torch.empty
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _madvise_hugepage(addr: int, nbytes: int) -> None:
    """A hint (Linux): 512x fewer first-touch faults where transparent huge pages are honoured."""
    lo = (addr + _ALIGN - 1) & ~(_ALIGN - 1)
    hi = (addr + nbytes) & ~(_ALIGN - 1)
    if hi > lo and _LIBC is not None:
        _LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), 14)  # MADV_HUGEPAGE


try:
    _LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except OSError:  # pragma: no cover - a libc that cannot be opened: no hint
    _LIBC = None


def _counts(base: torch.Tensor) -> Tuple[int, int]:
    """(torch's references to base's storage, Python references to its storage object), both
    counting the storage object made here."""
    st = base.untyped_storage()
    return _use_count(st._cdata), sys.getrefcount(st)


# the counts of a tensor nothing else holds, measured the same way (they depend on how torch keeps
# the Python object of a storage, so they are measured, not assumed)
_IDLE = _counts(torch.empty(1, dtype=torch.uint8)) if _use_count is not None else (0, 0)


class _Block:
    __slots__ = ("base", "cap", "offset", "stamp", "ptr")

    def __init__(self, cap: int, stamp: int):
        self.base = torch.empty(cap + _ALIGN, dtype=torch.uint8)
        p = self.ptr = self.base.data_ptr()
        self.offset = ((p + _ALIGN - 1) & ~(_ALIGN - 1)) - p  # bytes to the first huge-page boundary
        self.cap = cap
        self.stamp = stamp
        _madvise_hugepage(p, cap + _ALIGN)

    def free(self) -> bool:
        """Nothing but the cache holds the storage: the counts are those of a tensor nobody else
        holds (_IDLE). A storage object someone else holds is the same Python object torch returns
        here, so it shows as more Python references rather than more storage references."""
        return _counts(self.base) == _IDLE

    def foreign(self) -> bool:
        """The storage left the block: moved to shared memory (another process may hold it) or
        reallocated by a resize_ that grew it. Such a block is never handed out again."""
        st = self.base.untyped_storage()
        return st.is_shared() or st.data_ptr() != self.ptr


class _Cache:
    """The process's blocks; one lock (torch frees tensors on any thread, and fork copies the state:
    a child sees the parent's blocks, copy-on-write, and uses them as its own)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.blocks: List[_Block] = []
        self.limit = 1 << 30
        self.clock = 0
        self.hits = 0
        self.misses = 0

    def _sweep_locked(self) -> None:
        """Forgets blocks whose storage left them (shared memory, a grown resize_), and releases the
        least recently handed-out free blocks while the free bytes exceed the limit."""
        keep, free = [], []
        for b in self.blocks:
            if b.foreign():
                continue  # forgotten: torch frees it with its last tensor
            keep.append(b)
            if b.free():
                free.append(b)
        over = sum(b.cap for b in free) - self.limit
        if over > 0:
            drop = set()
            # a block larger than the whole limit goes first, then the least recently handed out
            for b in sorted(free, key=lambda b: (b.cap <= self.limit, b.stamp)):
                if over <= 0:
                    break
                drop.add(id(b))
                over -= b.cap
            keep = [b for b in keep if id(b) not in drop]
        self.blocks = keep

    def take(self, nbytes: int, shape: Tuple[int, ...], strides: Tuple[int, ...],
             dtype: torch.dtype) -> Optional[torch.Tensor]:
        """A tensor over a free block (or a new one) of at least nbytes, or None when the cache tracks
        as many blocks as it may. The tensor is made under the lock: until it exists the block looks
        free to every other thread."""
        with self.lock:
            need = (nbytes + _ALIGN - 1) & ~(_ALIGN - 1)  # blocks come in whole huge pages
            best = None
            for b in self.blocks:  # only blocks of a fitting size are examined: the steady state
                if b.cap >= need and 4 * (b.cap - need) <= b.cap and (best is None or b.cap < best.cap):
                    if b.free() and not b.foreign():
                        best = b
            self.clock += 1
            if best is not None:
                self.hits += 1
                best.stamp = self.clock
            else:
                self.misses += 1
                self._sweep_locked()  # memory grows: first release what the limit says
                if len(self.blocks) >= _MAX_BLOCKS:
                    return None
                best = _Block(need, self.clock)
                self.blocks.append(best)
            itemsize = torch.empty(0, dtype=dtype).element_size()
            return torch.empty(0, dtype=dtype).set_(best.base.untyped_storage(), best.offset // itemsize,
                                                    shape, strides)

    def info(self) -> Dict[str, int]:
        with self.lock:
            self._sweep_locked()
            free = [b for b in self.blocks if b.free()]
            live = [b for b in self.blocks if not b.free()]
            return {"cached_bytes": sum(b.cap for b in free), "cached_blocks": len(free),
                    "live_bytes": sum(b.cap for b in live), "live_blocks": len(live),
                    "limit": self.limit, "hits": self.hits, "misses": self.misses}

    def set_limit(self, n: int) -> int:
        with self.lock:
            old, self.limit = self.limit, n
            self._sweep_locked()
            return old

    def empty(self) -> int:
        with self.lock:
            self._sweep_locked()
            free = [b for b in self.blocks if b.free()]
            self.blocks = [b for b in self.blocks if not any(b is f for f in free)]
            return sum(b.cap for b in free)


_CACHE = _Cache()


def _limit_from_env() -> None:
    raw = os.environ.get("MASKPACK_OUTPUT_CACHE_BYTES")
    if raw is None or raw.strip() == "":
        return
    try:
        n = int(raw, 0)
    except ValueError:
        raise ValueError(f"MASKPACK_OUTPUT_CACHE_BYTES: expected a byte count, found {raw!r}") from None
    if n < 0:
        raise ValueError(f"MASKPACK_OUTPUT_CACHE_BYTES: expected a byte count >= 0, found {n}")
    _CACHE.set_limit(n)


_limit_from_env()


def fresh(shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor for a kernel to fill (every element): from the cache
    when large, else torch.empty."""
    shape = tuple(int(s) for s in shape)
    n = 1
    for s in shape:
        n *= s
    nbytes = n * (torch.finfo(dtype).bits // 8) if dtype in _DTYPES else 0
    if nbytes < CACHE_MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    t = None
    if _CACHE.limit > 0 and _use_count is not None:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        t = _CACHE.take(nbytes, shape, tuple(reversed(strides)), dtype)
    if t is None:
        t = torch.empty(shape, dtype=dtype)
        _madvise_hugepage(int(t.data_ptr()), nbytes)
    return t


def is_cached(t: torch.Tensor) -> bool:
    """Whether t's storage is one of the cache's blocks (for tests and diagnostics)."""
    with _CACHE.lock:
        p = t.untyped_storage().data_ptr()
        return any(b.ptr == p and not b.foreign() for b in _CACHE.blocks)


def output_cache_info() -> Dict[str, int]:
    """The output cache's counters: ``cached_bytes``/``cached_blocks`` (free, kept mapped),
    ``live_bytes``/``live_blocks`` (held by tensors), ``limit``, ``hits``, ``misses``."""
    return _CACHE.info()


def set_output_cache_limit(nbytes: int) -> int:
    """Bytes of free blocks the cache may keep (0: no cache, outputs are torch.empty); free blocks
    beyond it are released at once. Returns the previous limit."""
    n = int(nbytes)
    if n < 0:
        raise ValueError(f"set_output_cache_limit(): expected a byte count >= 0, found {n}")
    return _CACHE.set_limit(n)


def empty_output_cache() -> int:
    """Releases every free cached block to the OS (blocks held by tensors stay); returns the bytes
    released."""
    return _CACHE.empty()
