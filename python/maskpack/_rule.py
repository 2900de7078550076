"""The attention rule as keyword arguments (every constructor and with_rule take them).

    causal=True              bool
    window=(-1, -1)          flash-attn (left, right), -1 = unbounded
    window_hf=w              HF sliding_window w -> (w-1, w-1)      (exclusive with window)
    window_gym=w             attention-gym window w -> (w, w)      (exclusive with window)
    alignment="bottom_right" or "top_left" (matters only where q_len != kv_len)
    spans=None               [(segment, start, end), ...] bidirectional spans, segment-local
    prefix=None              [prefix_len per segment] prefix-LM lengths
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _maskpack
from ._errors import Error
from ._runtime import enum
from ._tensors import as_int_list

_ALIGNMENT = enum("alignment")
ALIGNMENTS = {k: v for k, v in _ALIGNMENT.items() if k != "unstated"}
ALIGNMENT_NAMES = {v: k for k, v in ALIGNMENTS.items()}
# MASKPACK_ALIGN_UNSTATED: the rule passed when no ``alignment`` keyword was given, so that the library
# applies its policy (refused where q_len != kv_len under a causal or windowed rule, else bottom-right)
ALIGN_UNSTATED: int = _ALIGNMENT["unstated"]
RULE_KEYS = ("causal", "window", "window_hf", "window_gym", "alignment", "spans", "prefix")

DEFAULT_RULE: Dict[str, Any] = {
    "causal": True,
    "alignment": "bottom_right",
    "window": (-1, -1),
    "spans": [],
    "prefix": None,
}


def window_from_hf(w: int) -> Tuple[int, int]:
    """HF ``sliding_window`` w (keys j > i - w: w keys including self) -> flash-attn (w-1, w-1)."""
    return _maskpack.window_from_hf(_int(w, "sliding_window"))


def window_from_gym(w: int) -> Tuple[int, int]:
    """attention-gym window w (i - j <= w: w+1 keys) -> flash-attn (w, w)."""
    return _maskpack.window_from_gym(_int(w, "window"))


def _int(v: Any, name: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, found {type(v).__name__} {v!r}")
    return int(v)


def _window(v: Any) -> Tuple[int, int]:
    if v is None:
        return (-1, -1)
    if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") or len(v) != 2:
        raise TypeError(f"window: expected a (left, right) pair of ints (-1 = unbounded), found {v!r}")
    return (_int(v[0], "window[0]"), _int(v[1], "window[1]"))


def _spans(v: Any):
    if v is None:
        return []
    out = []
    try:
        items = list(v)
    except TypeError:
        raise TypeError(f"spans: expected a list of (segment, start, end), found {type(v).__name__}") from None
    for k, s in enumerate(items):
        if isinstance(s, (str, bytes)) or not hasattr(s, "__len__") or len(s) != 3:
            raise TypeError(f"spans[{k}]: expected (segment, start, end), found {s!r}")
        out.append(tuple(_int(x, f"spans[{k}]") for x in s))
    return out


def normalize(kwargs: Dict[str, Any], base: Optional[Dict[str, Any]], where: str) -> Tuple[Dict[str, Any], bool]:
    """Rule keyword arguments over a base rule dict -> (rule dict, alignment given explicitly?)."""
    for k in kwargs:
        if k not in RULE_KEYS:
            raise TypeError(f"{where}() got an unexpected keyword argument {k!r}")
    rule = dict(DEFAULT_RULE if base is None else base)
    given = [k for k in ("window", "window_hf", "window_gym") if k in kwargs]
    if len(given) > 1:
        raise TypeError(f"{where}(): {' and '.join(given)} are mutually exclusive (they all set the window)")
    if "causal" in kwargs:
        c = kwargs["causal"]
        if not isinstance(c, (bool, np.bool_)) and not (isinstance(c, (int, np.integer)) and c in (0, 1)):
            raise TypeError(f"causal: expected a bool, found {c!r}")
        rule["causal"] = bool(c)
    if "window" in kwargs:
        rule["window"] = _window(kwargs["window"])
    if "window_hf" in kwargs:
        rule["window"] = tuple(window_from_hf(kwargs["window_hf"]))
    if "window_gym" in kwargs:
        rule["window"] = tuple(window_from_gym(kwargs["window_gym"]))
    if "alignment" in kwargs:
        a = kwargs["alignment"]
        if not isinstance(a, str):
            raise TypeError(f"alignment: expected 'bottom_right' or 'top_left', found {a!r}")
        if a not in ALIGNMENTS:
            raise Error(
                f"alignment: expected 'bottom_right' or 'top_left', found {a!r}",
                "MASKPACK_ERR_CONVENTION",
                argument="alignment",
            )
        rule["alignment"] = a
    if "spans" in kwargs:
        rule["spans"] = _spans(kwargs["spans"])
    if "prefix" in kwargs:
        p = kwargs["prefix"]
        rule["prefix"] = None if p is None else as_int_list(p, "prefix")
    return rule, "alignment" in kwargs


def to_c(rule: Dict[str, Any], explicit: bool = True) -> tuple:
    """Rule dict -> the tuple the extension takes; ``explicit`` False passes the alignment as unstated."""
    left, right = rule["window"]
    return (
        1 if rule["causal"] else 0,
        ALIGNMENTS[rule["alignment"]] if explicit else ALIGN_UNSTATED,
        int(left),
        int(right),
        list(rule["spans"]),
        None if rule["prefix"] is None else list(rule["prefix"]),
    )


def from_c(t: tuple) -> Dict[str, Any]:
    """The extension's rule tuple -> rule dict (keys usable as keyword arguments again)."""
    causal, align, left, right, spans, prefix = t
    return {
        "causal": bool(causal),
        "alignment": ALIGNMENT_NAMES.get(align, str(align)),
        "window": (int(left), int(right)),
        "spans": [tuple(s) for s in spans],
        "prefix": None if prefix is None else list(prefix),
    }
