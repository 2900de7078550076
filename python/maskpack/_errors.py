"""maskpack.Error: every failure the C library reports, with its structured details."""

from __future__ import annotations

from typing import Optional, Tuple

__all__ = ["Error"]


class Error(ValueError):
    """A maskpack call failed.

    Attributes mirror the C library's ``maskpack_error``:

    * ``status``: the status name, e.g. ``"MASKPACK_ERR_HOLE"``
    * ``code``: its integer value
    * ``argument``: the offending argument's name (``"mask"``, ``"cu_seqlens"``...) or None
    * ``index``: the first offending element, e.g. ``(row, column)``; ``()`` when not applicable
    * ``message``: what was expected and what was found
    """

    def __init__(
        self,
        message: str,
        status: str = "MASKPACK_ERR_INVALID_ARGUMENT",
        code: Optional[int] = None,
        argument: Optional[str] = None,
        index: Tuple[int, ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = _code_of(status) if code is None else int(code)
        self.argument = argument
        self.index = tuple(int(i) for i in index)

    def __str__(self) -> str:
        return f"{self.message} [{self.status}]"

    def __reduce__(self):
        return (type(self), (self.message, self.status, self.code, self.argument, self.index))


class ArgumentError(Error, TypeError):
    """A tensor argument the extension's reader refused (another device, a dtype maskpack lacks, a lazily
    negated view, a read-only output, an object that is no tensor): a maskpack.Error with its status and
    argument, and a TypeError, as such refusals have always been. The reader raises it, once per failure
    (python/ext_common.c)."""


_STATUS_NAMES: list = []


def _code_of(status: str) -> int:
    try:
        return _STATUS_NAMES.index(status)
    except ValueError:
        return -1
