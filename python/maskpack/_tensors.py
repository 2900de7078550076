"""Tensor arguments for the C extension, converted here, read (and checked) there.

The extension reads torch CPU tensors (through DLPack) and numpy arrays (through the buffer protocol)
itself, with one reader (python/ext_common.c), which is the package's one gate for tensor arguments: it
refuses another device, a dtype maskpack lacks, a lazily negated view, a read-only output, each with one
message (a maskpack.Error naming the argument, which is also a TypeError). This module only converts what
users pass (lists, DLPack producers, buffer objects, lazily negated torch inputs, ml_dtypes bfloat16
arrays) into one of those two, without copying where it can, and names the argument when it cannot; it
allocates outputs (numpy, or torch when the caller works in torch) for the C library to fill. The caller
keeps the returned objects referenced until the C call returns.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from . import _maskpack
from ._errors import Error
from ._runtime import enum

DTYPE_NAMES = _maskpack.DTYPE_NAMES  # maskpack_dtype_name of every code, in code order
DTYPE_CODE = enum("dtype")

# numpy dtype -> code, from the one table above (numpy has no bfloat16: ml_dtypes' is matched by name)
_NP_CODE = {np.dtype(n): c for n, c in DTYPE_CODE.items() if n != "bfloat16"}


def _torch():
    """The torch module if it is already imported (a torch tensor cannot exist otherwise)."""
    return sys.modules.get("torch")


# > 0 while maskpack's own custom ops run their eager or fake implementation (maskpack._compile), which
# call the ordinary methods: those must not route back into the ops.
IN_OP = [0]


def compiling() -> bool:
    """True while torch.compile traces the caller (then the C extension is reached through custom ops)."""
    t = _torch()
    return IN_OP[0] == 0 and t is not None and t.compiler.is_compiling()


def is_torch_tensor(x: Any) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


_TORCH_CODES: dict = {}


def _torch_code(t, dtype) -> Optional[int]:
    """torch dtype -> dtype code (the table is built once: this runs on every call into C)."""
    if not _TORCH_CODES:
        _TORCH_CODES.update({getattr(t, n): c for n, c in DTYPE_CODE.items()})
    return _TORCH_CODES.get(dtype)


def _np_code(dtype: np.dtype) -> Optional[int]:
    if dtype.name == "bfloat16" and dtype.itemsize == 2:  # ml_dtypes.bfloat16
        return DTYPE_CODE["bfloat16"]
    if not dtype.isnative:
        return None
    return _NP_CODE.get(dtype)


_TORCH_REGISTERED: list = []


def register_torch() -> None:
    """Lets the extension read torch tensors itself (it never imports torch on its own): once per
    process, before the first torch tensor reaches it."""
    if not _TORCH_REGISTERED:
        import torch
        import torch.utils.dlpack

        _maskpack.register_torch(torch.Tensor, torch.utils.dlpack.to_dlpack)
        _TORCH_REGISTERED.append(True)


# a dtype (torch's, numpy's, or its name: "float32", "bfloat16") -> its code, for the ISA queries
def named_dtype_code(dtype: Any) -> int:
    name = str(dtype)
    name = name[6:] if name.startswith("torch.") else name
    if name not in DTYPE_CODE:
        name = np.dtype(dtype).name
    return DTYPE_CODE[name]


def dtype_code(x: Any, name: Optional[str] = None) -> Optional[int]:
    """The dtype code of a tensor or array describe() returned; a dtype maskpack lacks: None, or with
    ``name`` the tensor reader's refusal naming it (the one message for that failure)."""
    code = _np_code(x.dtype) if isinstance(x, np.ndarray) else _torch_code(_torch(), x.dtype)
    if code is None and name is not None:
        _maskpack.tensor_info(x, name)  # raises the reader's refusal
        raise TypeError(f"{name}: dtype {x.dtype} is not supported")  # not reached: the reader refuses it
    return code


def _describe_numpy(a: np.ndarray, name: str):  # -> what the extension reads (its dtype: the reader's to check)
    item = a.dtype.itemsize
    if item and any(s % item for s in a.strides):
        # strides that are not whole elements (a view into a record array): the only case that copies
        a = np.ascontiguousarray(a)
    if a.dtype.name == "bfloat16" and item == 2:  # ml_dtypes' bfloat16 has no buffer format: read as a torch view
        t = _torch()
        if t is None:
            try:
                import torch as t  # noqa: F811
            except ImportError:
                raise TypeError(f"{name}: a bfloat16 numpy array needs torch to cross into maskpack") from None
        register_torch()
        return t.from_numpy(a.view(np.uint16)).view(t.bfloat16)  # (the view holds a)
    return a


def _describe_torch(x, resolve: bool):  # -> the tensor the extension reads (its device, layout, dtype: the reader's)
    if resolve and x.is_neg():  # an input lazily negated (e.g. conj().imag): its memory holds -x, read a resolved copy
        x = x.resolve_neg()
    register_torch()
    return x


def describe_kernel(t: Any, name: str) -> Any:
    """A kernel argument (a torch CPU tensor, or None) -> the tensor for the extension, or None.

    The kernels (GDN, conv) take torch tensors only, as they are: their bindings read them in the
    reader's torch-only mode, which refuses anything but a torch tensor, a tensor on another device, a
    dtype maskpack lacks, a lazily negated view (its memory holds -t; a resolved copy would not be the
    tensor autograd tracks) -- each one maskpack.Error naming the argument. Nothing is checked here."""
    if t is not None and is_torch_tensor(t):
        register_torch()
    return t


def describe(x: Any, name: str, list_dtype=None) -> Tuple[Any, bool]:
    """Input object -> (what the extension reads: a torch CPU tensor or a numpy array, is_torch).
    Never copies numpy arrays or tensors; what it returns holds whatever memory it reads (a numpy
    array its DLPack producer or buffer object, a torch view of a bfloat16 numpy array that array).

    Python lists and tuples are converted with ``np.asarray`` (``list_dtype`` when given, so that an
    empty list of lengths is an int64 array rather than float64).
    """
    return _describe(x, name, list_dtype, True)


def _describe(x: Any, name: str, list_dtype, resolve: bool) -> Tuple[Any, bool]:
    """describe() (resolve: read a lazily negated torch input resolved; an output is read as it is, and
    refused) -> (what the extension reads, is_torch)."""
    if x is None:
        _maskpack.tensor_info(None, name)  # raises the reader's refusal of a missing tensor
    if is_torch_tensor(x):
        return _describe_torch(x, resolve), True
    if isinstance(x, np.ndarray):
        return _describe_numpy(x, name), False
    if isinstance(x, (str, bytes, bytearray, dict, set)):  # (bytes would read as uint8: refused as the reader refuses str)
        _refuse_object(x, name)
    if isinstance(x, (list, tuple)):
        try:
            a = np.asarray(x, dtype=list_dtype) if list_dtype is not None else np.asarray(x)
        except OverflowError:  # a Python int past the dtype (int64 for lengths and offsets)
            raise Error(f"{name}: a value does not fit {np.dtype(list_dtype or np.int64).name}",
                        "MASKPACK_ERR_OVERFLOW", argument=name) from None
        except (TypeError, ValueError) as e:
            raise TypeError(f"{name}: cannot read a {type(x).__name__} as an array ({e})") from None
        if a.dtype == object:
            raise TypeError(f"{name}: ragged or non-numeric {type(x).__name__}")
        if list_dtype is not None and len(x) and not all(_is_intlike(v) for v in np.ravel(np.asarray(x, dtype=object))):
            raise TypeError(f"{name}: expected integers")
        return _describe_numpy(a, name), False
    if hasattr(x, "__dlpack__"):
        try:
            a = np.from_dlpack(x)
        except (TypeError, ValueError, RuntimeError, BufferError) as e:
            raise TypeError(f"{name}: cannot read {type(x).__name__} through DLPack ({e})") from None
        return _describe_numpy(a, name), False
    try:
        mv = memoryview(x)
    except TypeError:
        _refuse_object(x, name)
    try:
        a = np.asarray(mv)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name}: unsupported buffer format ({e})") from None
    return _describe_numpy(a, name), False


def describe_out(x: Any, name: str = "out") -> Tuple[Any, bool]:
    """As describe, for a buffer the C library writes, passed as it is: the reader refuses read-only memory
    (a numpy array with writeable=False, a view of bytes) instead of writing through a raw pointer, and a
    lazily negated torch view, whose memory would receive the values with the wrong sign."""
    return _describe(x, name, None, False)


def _refuse_object(x: Any, name: str) -> None:
    """An object that is no tensor and converts to none: the reader's refusal (python/ext_common.c), in its
    words and type."""
    from ._errors import ArgumentError

    raise ArgumentError(f"{name}: expected a torch tensor or a numpy array, found {type(x).__name__}",
                        "MASKPACK_ERR_INVALID_ARGUMENT", argument=name) from None


def _is_intlike(v) -> bool:
    return isinstance(v, (int, np.integer, np.bool_))


# maskpack_isa (maskpack.h): the kernel every attention, Gated DeltaNet and conv call takes as isa=, by the
# library's names (maskpack_isa_name)
ISA_CODES = enum("isa")


def isa_code(isa: Optional[str]) -> int:
    """isa= of a kernel call -> its maskpack_isa code. None or "auto": MASKPACK_ISA, else the best this
    CPU runs; a name this CPU cannot run is refused by the library, naming the missing feature."""
    if isa is None:
        return 0
    if not isinstance(isa, str):
        raise TypeError(f"isa: expected None or one of {', '.join(ISA_CODES)}, found {type(isa).__name__}")
    code = ISA_CODES.get(isa.strip().lower().replace("-", "_"))
    if code is None:
        raise Error(f"isa: expected one of {', '.join(ISA_CODES)}, found {isa!r}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="isa")
    return code


def dtype_name(dtype: Any, what: str = "dtype") -> str:
    """str / numpy dtype / Python type / torch dtype -> one of DTYPE_NAMES."""
    if isinstance(dtype, str):
        name = dtype[6:] if dtype.startswith("torch.") else dtype
        if name in DTYPE_CODE:
            return name
        raise Error(
            f"{what}: expected one of {', '.join(DTYPE_NAMES)}, found {dtype!r}",
            "MASKPACK_ERR_DTYPE",
            argument=what,
        )
    t = _torch()
    if t is not None and isinstance(dtype, t.dtype):
        name = str(dtype)[6:]
        if name in DTYPE_CODE:
            return name
        raise Error(f"{what}: torch dtype {dtype} is not supported", "MASKPACK_ERR_DTYPE", argument=what)
    try:
        d = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{what}: expected a dtype name, numpy dtype or torch dtype, found {dtype!r}") from None
    if d.name in DTYPE_CODE and (d.isnative or d.itemsize == 1):
        return d.name
    raise Error(f"{what}: dtype {d} is not supported", "MASKPACK_ERR_DTYPE", argument=what)


def placed(obj: Any, device: Any, pin_memory: bool) -> Any:
    """A derived output (built in host memory by the C library) on ``device``, or pinned for an
    asynchronous copy to one. ``device=None, pin_memory=False``: as built (numpy or torch CPU)."""
    if device is None and not pin_memory:
        return obj
    import torch

    t = obj if isinstance(obj, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(obj))
    if pin_memory:
        acc = getattr(torch, "accelerator", None)
        if acc is None or not acc.is_available():
            raise Error("pin_memory: page-locked host memory needs an accelerator (cuda, npu, xpu), and this "
                        "process has none", "MASKPACK_ERR_UNSUPPORTED", argument="pin_memory")
        t = t.pin_memory()
    if device is not None:
        t = t.to(device, non_blocking=pin_memory)
    return t


def alloc(shape: Sequence[int], dtype: str, use_torch: bool) -> Any:
    """Zero-filled output: a torch tensor or numpy array, which the extension writes into. bfloat16
    is always a torch tensor (numpy has none)."""
    shape = tuple(int(s) for s in shape)
    if dtype == "bfloat16" or use_torch:
        t = _torch()
        if t is None:
            try:
                import torch as t  # noqa: F811  (only needed for bfloat16 outputs)
            except ImportError:
                raise TypeError("bfloat16 outputs need torch (numpy has no bfloat16); install torch") from None
        x = t.zeros(shape, dtype=getattr(t, dtype))
        register_torch()
        return x
    return np.zeros(shape, dtype=np.dtype(dtype))


def as_int_list(x: Any, name: str) -> list:
    """Sequence / array / tensor of integers -> list of Python ints."""
    if is_torch_tensor(x):
        if x.dtype.is_floating_point or x.dtype.is_complex:
            raise TypeError(f"{name}: expected integers, found {x.dtype}")
        return [int(v) for v in x.reshape(-1).tolist()]
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "iub":
            raise TypeError(f"{name}: expected integers, found {x.dtype}")
        return [int(v) for v in x.reshape(-1).tolist()]
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{name}: expected a sequence of integers, found {type(x).__name__}")
    try:
        items = list(x)
    except TypeError:
        raise TypeError(f"{name}: expected a sequence of integers, found {type(x).__name__}") from None
    out = []
    for v in items:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name}: expected integers, found {type(v).__name__} {v!r}")
        out.append(int(v))
    return out


# ---- arguments every kernel family shares -------------------------------------------------------

from ._runtime import MAX_THREADS, check_threads  # noqa: E402,F401  (the one rule: maskpack._runtime)


_LAYOUT_TYPE: list = []  # maskpack.Layout: _layout (a layer above this one) enters it when it defines the class


def check_layout(layout: Any, name: str = "layout") -> None:
    """A maskpack.Layout, else a TypeError naming the argument (not an AttributeError from inside a
    call)."""
    if not (_LAYOUT_TYPE and isinstance(layout, _LAYOUT_TYPE[0])):
        raise TypeError(f"{name}: expected a maskpack.Layout, found {type(layout).__name__}")


def layout_handle(layout: Any, name: str = "layout") -> Any:
    """The C layout handle behind a maskpack.Layout, for the kernel bindings (checked as check_layout;
    the extension checks the handle's type again)."""
    check_layout(layout, name)
    return layout._h
