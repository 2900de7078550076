"""Drop-in twins of mcore-bridge's batch functions, pinned to **mcore-bridge 1.6.5**
(``mcore_bridge/utils/megatron_utils.py``, ``mcore_bridge/model/gpts/qwen3_next.py``). They import nothing
from mcore-bridge or Megatron: ``cp=`` / ``cp_rank=`` are keyword-only (falling back to an initialized
``parallel_state``), ``npu=`` replaces ``is_torch_npu_available()``.

``split_cp_inputs`` is maskpack's per-sequence zigzag shard without realignment
(``Layout.from_cu_seqlens(cu).cp_shard_indices(cp, rank, align=None)``), or a contiguous piece of the
whole stream. Where mcore-bridge crashes or drops tokens silently (a sequence that does not divide by
``2 cp``: its ``view`` fails; tokens past ``cu_seqlens[-1]``: left out of the shard) the twin raises
``maskpack.Error`` naming the argument.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .._errors import Error
from .._layout import Layout
from ._common import resolve_parallel, take

__all__ = ["split_cp_inputs", "resolve_gdn_attention_mask"]

UPSTREAM = "mcore-bridge==1.6.5"


def _npu(npu: Optional[bool]) -> bool:
    if npu is not None:
        return bool(npu)
    mod = getattr(torch, "npu", None)
    try:
        return bool(mod is not None and mod.is_available())
    except Exception:
        return False


def shard_index(fn: str, n: int, cu_seqlens: Optional[torch.Tensor], cp: int, rank: int, mode: str) -> torch.Tensor:
    """int64 index of rank ``rank``'s tokens along a sequence dimension of ``n`` tokens."""
    if mode == "contiguous":
        if n % cp:
            raise Error(f"{fn}: {n} tokens do not divide by cp = {cp} (contiguous CP)", "MASKPACK_ERR_SHAPE",
                        argument="inputs")
        lay = Layout.from_lengths([n], "packed")
        return torch.as_tensor(lay.cp_shard_indices(cp, rank, scheme="contiguous", align=None))
    if cu_seqlens is None:
        lens = torch.tensor([n])
        lay = Layout.from_lengths([n], "packed")
    else:
        c = cu_seqlens.detach().to("cpu", torch.int64)
        if int(c[0]) != 0 or int(c[-1]) != n:
            raise Error(f"{fn}: cu_seqlens span [{int(c[0])}, {int(c[-1])}) but the inputs hold {n} tokens along dim; "
                        "cu_seqlens must cover the tokens", "MASKPACK_ERR_SHAPE", argument="cu_seqlens")
        lens = c.diff()
        try:
            lay = Layout.from_cu_seqlens(c)
        except Error as e:
            raise Error(f"{fn}: cu_seqlens: {e.message}", e.status, argument="cu_seqlens", index=e.index) from None
    bad = torch.nonzero(lens % (2 * cp)).flatten()
    if bad.numel():
        i = int(bad[0])
        raise Error(f"{fn}: sequence {i} has {int(lens[i])} tokens, which does not divide by 2*cp = {2 * cp}; pad it "
                    "first (Layout.pad_to_multiple)", "MASKPACK_ERR_SHAPE", argument="cu_seqlens" if cu_seqlens is not None
                    else "inputs", index=(i,))
    if cp == 1:
        return torch.arange(n)
    return torch.as_tensor(lay.cp_shard_indices(cp, rank, align=None))


def split_cp_inputs(inputs: torch.Tensor, cu_seqlens: Optional[torch.Tensor], dim: int,
                    cp_partition_mode: str = "zigzag", *, cp: Optional[int] = None, cp_rank: Optional[int] = None):
    """mcore-bridge's ``split_cp_inputs``: the rank's CP part of ``inputs`` along ``dim``: zigzag (each
    sequence of ``cu_seqlens``, or the whole dimension when None, in ``2 cp`` chunks; chunks r and
    ``2 cp - 1 - r``) or one contiguous piece of the whole dimension."""
    fn = "split_cp_inputs"
    if dim < 0:
        dim = (dim + inputs.ndim) % inputs.ndim
    _, cp, cp_rank = resolve_parallel(fn, 1, cp, cp_rank, need=("cp", "cp_rank"))
    idx = shard_index(fn, inputs.shape[dim], cu_seqlens, cp, cp_rank, cp_partition_mode)
    return take(inputs, dim, idx)


def resolve_gdn_attention_mask(kwargs: dict, *, npu: Optional[bool] = None) -> Optional[torch.Tensor]:
    """mcore-bridge's ``resolve_gdn_attention_mask``: the ``[B, S]`` bool keep mask a Gated DeltaNet layer
    needs: on an NPU ``attention_mask_2d`` when given, else the 4D masked ``attention_mask`` read by maskpack's
    4D-to-2D rule (a column is a token iff some query attends to it), None without a mask."""
    if _npu(npu):
        m2 = kwargs.get("attention_mask_2d")
        if m2 is not None:
            return m2.to(torch.bool)
    mask = kwargs.get("attention_mask")
    if mask is None:
        return None
    if mask.dtype != torch.bool:
        raise Error(f"resolve_gdn_attention_mask: attention_mask must be a bool masked mask [B, 1, S, S], found "
                    f"{mask.dtype} (~ on an integer mask is not a logical not)", "MASKPACK_ERR_DTYPE",
                    argument="attention_mask")
    from .._layout import mask2d_from_mask4d

    return torch.as_tensor(mask2d_from_mask4d(mask.cpu(), "masked")).to(mask.device)
