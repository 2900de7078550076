"""maskpack: describe a variable-length training batch once, derive every attention backend's input.

    >>> import maskpack
    >>> lay = maskpack.Layout.from_lengths([3, 1, 2], placement="packed")
    >>> lay.cu_seqlens()                     # TE / flash-attn form
    array([0, 3, 4, 6], dtype=int32)
    >>> lay.cu_seqlens(form="npu")           # Ascend actual_seq_qlen form
    array([3, 4, 6], dtype=int32)

Every mask crossing the API names its convention ("keep", "masked", "additive", "doc_id"); every
failure raises :class:`maskpack.Error` (a ValueError) with ``status``, ``code``, ``argument`` and
``index`` taken from the C library's error report.
"""

from . import _maskpack
from ._errors import Error, _STATUS_NAMES

_STATUS_NAMES.extend(_maskpack.status_names())
_maskpack._set_error_type(Error)

from ._layout import Layout, mask2d_from_mask4d  # noqa: E402
from ._moves import cp_gather, cp_multiple, relayout  # noqa: E402
from .batch import Batch, prepare_batch  # noqa: E402
from ._npu import NPU_FINDING_NAMES, validate_npu_args  # noqa: E402
from ._rule import window_from_gym, window_from_hf  # noqa: E402

__version__ = _maskpack.version()
version_number = _maskpack.version_number()

__all__ = [
    "Batch",
    "Error",
    "Layout",
    "cp_gather",
    "cp_multiple",
    "prepare_batch",
    "relayout",
    "NPU_FINDING_NAMES",
    "mask2d_from_mask4d",
    "validate_npu_args",
    "window_from_gym",
    "window_from_hf",
    "__version__",
]
