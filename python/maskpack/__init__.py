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
from .collator import Collator, LengthBucketSampler  # noqa: E402
from ._npu import NPU_FINDING_NAMES, validate_npu_args  # noqa: E402
from ._rule import window_from_gym, window_from_hf  # noqa: E402

__version__ = _maskpack.version()
version_number = _maskpack.version_number()

__all__ = [
    "Batch",
    "Collator",
    "LengthBucketSampler",
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

from .plan import Plan, Rows, attention_coefficient, plan  # noqa: E402,F401
__all__ += ["Plan", "Rows", "attention_coefficient", "plan"]

# Gated DeltaNet (maskpack.gdn) needs torch: its names load on first use, so `import maskpack`
# stays torch-free.
_GDN_NAMES = ("gated_delta_rule", "causal_conv1d", "gdn_gates", "gdn_l2norm", "gdn_isa", "GatedDeltaNet", "GatedRMSNorm",
              "patch_linear_attention")
__all__ += list(_GDN_NAMES)


# Context-parallel collectives over torch.distributed (maskpack.distributed): loaded on use.
_DIST_NAMES = ("cp_all_gather", "ulysses_all_to_all", "cp_loss")
__all__ += list(_DIST_NAMES)

# The output-buffer cache of the torch binding (maskpack._alloc) needs torch too: loaded on use.
_ALLOC_NAMES = ("output_cache_info", "set_output_cache_limit", "empty_output_cache")
__all__ += list(_ALLOC_NAMES)


# maskpack.hf (a transformers model on maskpack in one call: prepare_model) needs torch and transformers:
# the submodule loads on first use.
__all__ += ["hf"]


def __getattr__(name):
    if name == "hf":
        import importlib

        return importlib.import_module(".hf", __name__)
    if name in _GDN_NAMES:
        from . import gdn

        return getattr(gdn, name)
    if name in _DIST_NAMES:
        from . import distributed

        return getattr(distributed, name)
    if name in _ALLOC_NAMES:
        from . import _alloc

        return getattr(_alloc, name)
    raise AttributeError(f"module 'maskpack' has no attribute {name!r}")

# Fused CPU attention over a layout (torch is imported only when a torch tensor is passed).
from .attention import AttentionFunction, attention, attention_autograd, attention_backward, attention_isa  # noqa: E402,F401
__all__ += ["AttentionFunction", "attention", "attention_autograd", "attention_backward", "attention_isa"]
