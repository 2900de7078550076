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
from ._errors import ArgumentError as _ArgumentError, Error, _STATUS_NAMES

_STATUS_NAMES.extend(_maskpack.status_names())
_maskpack._set_error_type(Error, _ArgumentError)

# The public names, in one table: module -> the names it gives the package. Modules marked lazy need torch
# (or transformers) and load on first use of one of their names, so `import maskpack` stays torch-free;
# the others load now, bottom layer first.
_EAGER = {
    "._layout": ("Layout", "mask2d_from_mask4d"),
    "._moves": ("cp_gather", "cp_multiple", "relayout"),
    ".batch": ("Batch", "prepare_batch"),
    ".collator": ("Collator", "LengthBucketSampler"),
    "._npu": ("NPU_FINDING_NAMES", "validate_npu_args"),
    "._rule": ("window_from_gym", "window_from_hf"),
    "._plan": ("Plan", "Rows", "attention_coefficient", "plan"),
    # fused CPU attention over a layout (torch is imported only when a torch tensor is passed)
    "._attention": ("AttentionFunction", "attention", "attention_autograd", "attention_backward", "attention_isa"),
}
_LAZY = {
    ".gdn": ("gated_delta_rule", "causal_conv1d", "gdn_gates", "gdn_l2norm", "gdn_isa", "GatedDeltaNet",
             "GatedRMSNorm", "patch_linear_attention"),
    ".distributed": ("cp_all_gather", "ulysses_all_to_all", "cp_loss"),  # collectives over torch.distributed
    "._alloc": ("output_cache_info", "set_output_cache_limit", "empty_output_cache"),  # the output-buffer cache
}
_SUBMODULES = ("hf",)  # maskpack.hf (a transformers model on maskpack in one call) loads on first use

import importlib as _importlib  # noqa: E402

from . import _runtime  # noqa: E402


# The paths a lower layer takes through a layer above it, by name (maskpack._runtime.above), each loading the
# module above that provides it on the first call that takes it: nothing below imports a module above it.
# Each is an import statement, which torch.compile's tracer runs as it traces (importlib would break the
# graph), so a traced call may be the first.
def _above_cp():
    from . import distributed  # a kernel given group=: its context-parallel path; Batch.to_padded(group=)

    return distributed


def _above_compile():
    from . import _compile  # a call under torch.compile: its custom op

    return _compile


def _above_gdn():
    from . import gdn  # Batch.fla_kwargs under CP

    return gdn


def _above_hf():
    from . import hf  # Batch.hf_kwargs under CP

    return hf


_ABOVE = {"cp": _above_cp, "compile": _above_compile, "gdn": _above_gdn, "hf": _above_hf}
for _path, _load in _ABOVE.items():
    _runtime.provide(_path, _load)
del _path, _load

for _mod, _names in _EAGER.items():
    _m = _importlib.import_module(_mod, __name__)
    globals().update({_n: getattr(_m, _n) for _n in _names})
del _mod, _names, _m

__version__ = _maskpack.version()
version_number = _maskpack.version_number()

_LAZY_OF = {n: m for m, names in _LAZY.items() for n in names}
__all__ = sorted({n for names in _EAGER.values() for n in names} | set(_LAZY_OF) | set(_SUBMODULES)
                 | {"Error", "__version__"})


def __getattr__(name):
    if name in _SUBMODULES:
        return _importlib.import_module("." + name, __name__)
    mod = _LAZY_OF.get(name)
    if mod is not None:
        return getattr(_importlib.import_module(mod, __name__), name)
    raise AttributeError(f"module 'maskpack' has no attribute {name!r}")
