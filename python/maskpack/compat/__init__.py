"""Drop-in twins of the batch functions of the frameworks maskpack's users run (verl, Megatron-core,
TransformerEngine, ms-swift, mcore-bridge, twinkle), one module per framework, each pinned to an
upstream version named in its docstring and proven equal to the real upstream code by
``make test-conformance`` (tests/python/test_compat_*.py). The twins import nothing from the frameworks;
they are computed from maskpack's own layouts and moves. docs/interop.md lists every twin, its native
maskpack equivalent and each deliberate difference.

    from maskpack.compat import verl
    input_ids_rmpad, params = verl.preprocess_packed_seqs(input_ids, attention_mask, tp=1, cp=2, cp_rank=0)
"""

from importlib import import_module

__all__ = ["verl", "megatron", "te", "swift", "mcore_bridge", "twinkle", "PackedSeqParams"]


def __getattr__(name):
    if name == "PackedSeqParams":
        from . import _common

        return _common._megatron_class()
    if name in __all__:
        return import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
