"""Output buffers for the torch binding: large ones come from a cache of already-mapped blocks.

A GDN or attention call's large outputs (o, the final state, the gradients) used to be fresh
``torch.empty`` buffers. Above glibc's mmap threshold every free returns them to the OS, so every
call faulted them in again while the OS cleared each page: 13-19 % of the chunked GDN forward on the
benchmark's 2-core machine. Outputs of at least ``CACHE_MIN_BYTES`` now come from maskpack's own
cache (``maskpack._memory``, C): a block goes back to it when torch frees the last tensor or view
using it, and the next call of a similar size takes it again, already mapped. The cache keeps at
most ``output_cache_info()["limit"]`` bytes of unused blocks (1 GiB unless the environment variable
``MASKPACK_OUTPUT_CACHE_BYTES`` says otherwise; 0 turns the cache off).

Such tensors are ordinary CPU tensors whose storage cannot be resized in place (``resize_`` to a
larger size, or an ``out=`` argument of a larger result, raises), as for any tensor torch imports
through DLPack or numpy. Torch then leaves the tensor with the larger shape over the old storage:
drop it. (Touching its elements past the block faults on the inaccessible page that follows every
block, instead of reading or overwriting another output.)
"""

from __future__ import annotations

import os
from typing import Any, Dict, Tuple

import torch

from . import _memory

CACHE_MIN_BYTES = 4 << 20  # smaller buffers: glibc already reuses them without faulting

_DL_CODES = {torch.float32: (2, 32), torch.bfloat16: (4, 16), torch.float16: (2, 16), torch.float64: (2, 64)}


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
    _memory.set_limit(n)


_limit_from_env()


def fresh(shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor for a kernel to fill (every element): from the cache
    when large, else torch.empty."""
    shape = tuple(int(s) for s in shape)
    code = _DL_CODES.get(dtype)
    n = 1
    for s in shape:
        n *= s
    nbytes = n * code[1] // 8 if code else 0
    if code is None or nbytes < CACHE_MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    if _memory.limit() == 0:
        t = torch.empty(shape, dtype=dtype)
        _memory.advise(int(t.data_ptr()), nbytes)
        return t
    return torch.from_dlpack(_memory.empty(shape, code[0], code[1]))


def output_cache_info() -> Dict[str, int]:
    """The output cache's counters: ``cached_bytes``/``cached_blocks`` (unused, kept mapped),
    ``live_bytes``/``live_blocks`` (held by tensors), ``limit``, ``hits``, ``misses``."""
    return dict(_memory.info())


def set_output_cache_limit(nbytes: int) -> int:
    """Bytes of unused blocks the cache may keep (0: no cache, outputs are torch.empty); unused
    blocks beyond it are released at once. Returns the previous limit."""
    n = int(nbytes)
    if n < 0:
        raise ValueError(f"set_output_cache_limit(): expected a byte count >= 0, found {n}")
    return int(_memory.set_limit(n))


def empty_output_cache() -> int:
    """Releases every unused cached block to the OS (blocks held by tensors stay); returns the bytes
    released."""
    return int(_memory.empty_cache())

