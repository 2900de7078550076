"""Padding recipes of the training frameworks as named presets: how far each sequence's slot and the packed
total are padded before a batch is split for tensor / context parallelism or quantized.

    >>> from maskpack.padding import padding_recipe
    >>> padding_recipe("verl", tp=2, cp=2)                  # each slot a multiple of tp*cp*2
    PaddingRecipe(per_sequence=8, total=1)
    >>> padding_recipe("verl", tp=2, cp=2, fp8=True)        # FP8: lcm(16, align) per slot, align*128 in all
    PaddingRecipe(per_sequence=16, total=1024)
    >>> padding_recipe("swift", tp=4, cp=2, sequence_parallel=True, fp8_recipe="mxfp8").total
    256

A recipe applies to a packed layout as ``layout.pad_to_multiple(r.per_sequence).pad_total_to_multiple(r.total)``
(maskpack pads the total with one padding run after the last slot; verl grows the last slot instead, which
its twins in maskpack.compat.verl reproduce).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ._errors import Error

__all__ = ["PaddingRecipe", "padding_recipe", "swift_padding_to", "verl_alignment"]


@dataclass(frozen=True)
class PaddingRecipe:
    """``per_sequence``: each sequence's slot is padded to a multiple of it; ``total``: the packed total then
    to a multiple of it (1: no total padding)."""

    per_sequence: int = 1
    total: int = 1


def _pos(name: str, v: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise Error(f"{name}: expected an int >= 1, found {v!r}", "MASKPACK_ERR_INVALID_ARGUMENT", argument=name)
    return v


def verl_alignment(tp: int = 1, cp: int = 1, fp8: bool = False, zigzag: bool = True) -> PaddingRecipe:
    """verl 0.9.1 (``preprocess_packed_seqs``, ``preprocess_thd_engine``): each slot a multiple of ``tp*cp*2``
    (zigzag CP; ``tp*cp`` contiguous; ``tp`` without CP); FP8 (``use_fp8_padding``): ``lcm(16, align)`` per slot
    and the total a multiple of ``align*128``."""
    tp, cp = _pos("tp", tp), _pos("cp", cp)
    align = tp * cp * (2 if zigzag and cp > 1 else 1)
    if fp8:
        return PaddingRecipe(math.lcm(16, align), align * 128)
    return PaddingRecipe(align, 1)


def swift_padding_to(tp: int = 1, sequence_parallel: bool = False, cp: int = 1, fp8_recipe: Optional[str] = None,
                     fp8: Optional[str] = None, fp4: Optional[str] = None,
                     attention_backend: Optional[str] = None) -> Optional[int]:
    """ms-swift 4.6.0 ``get_padding_to``: tp under sequence parallelism, times cp; then times 128 (FP8
    ``blockwise``), 32 (``mxfp8``: each TP shard a multiple of 32) or 16 (any other FP8 / FP4 format); with the
    ``fused`` attention backend at least 64 times the tp*cp part. None when no padding is needed."""
    padding_to = None
    if tp > 1 and sequence_parallel:
        padding_to = tp
    if cp > 1:
        padding_to = (padding_to or 1) * cp
    origin = padding_to
    if fp8_recipe == "blockwise":
        padding_to = (padding_to or 1) * 128
    elif fp8_recipe == "mxfp8":
        padding_to = (padding_to or 1) * 32
    elif fp8 is not None or fp4 is not None:
        padding_to = (padding_to or 1) * 16
    if attention_backend == "fused":
        padding_to = max(padding_to or 1, (origin or 1) * 64)
    return padding_to


def padding_recipe(name: str, *, tp: int = 1, cp: int = 1, fp8: bool = False, zigzag: bool = True,
                   sequence_parallel: bool = False, fp8_recipe: Optional[str] = None,
                   attention_backend: Optional[str] = None, bucket: Optional[int] = None,
                   forced_max: Optional[int] = None) -> PaddingRecipe:
    """A named recipe: ``"verl"`` (:func:`verl_alignment`), ``"swift"`` (the total to :func:`swift_padding_to`),
    ``"bucket"`` (the total to a multiple of ``lcm(bucket, cp)``, verl's ``pad_to_length_bucket``),
    ``"forced_max"`` (a padded batch's row width ``forced_max`` rounded to ``tp*cp*2``, verl's
    ``forced_max_seqlen``: returned as ``per_sequence`` = that width)."""
    if name == "verl":
        return verl_alignment(tp, cp, fp8, zigzag)
    if name == "swift":
        p = swift_padding_to(tp, sequence_parallel, cp, fp8_recipe, "e4m3" if fp8 else None, None, attention_backend)
        return PaddingRecipe(1, p or 1)
    if name == "bucket":
        return PaddingRecipe(1, math.lcm(_pos("bucket", bucket), _pos("cp", cp)))
    if name == "forced_max":
        align = verl_alignment(tp, cp).per_sequence
        w = _pos("forced_max", forced_max)
        return PaddingRecipe(-(-w // align) * align, 1)
    raise Error(f"name: expected 'verl', 'swift', 'bucket' or 'forced_max', found {name!r}",
                "MASKPACK_ERR_INVALID_ARGUMENT", argument="name")
