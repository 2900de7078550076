"""The package's bottom layer: the one ``threads=`` rule and its one default, the teams of worker threads
the calls run on, the values cached on a layout, and the one way up: the paths that live above their
caller, by name (see ``above``). It imports only the extension and the error type, so every other module
can import it without a cycle.

The default (``threads=None``) is the same for every call, moves and kernels alike: torch's intra-op thread
count when torch is loaded (the caller sized it for this process, and maskpack's teams run on torch's
OpenMP pool: more threads than that would share its cores), else the CPUs this process may run on. Small
moves stay on the calling thread whatever the count (the C engine's MASKPACK_TEAM_MIN_BYTES)."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from . import _maskpack
from ._errors import Error

__all__ = ["MAX_THREADS", "enum", "check_threads", "default_threads", "threads", "team", "team_pool", "cache_of",
           "cached", "provide", "above"]

# the library's one thread limit (MASKPACK_MAX_THREADS: maskpack_workers_create, the kernels), as the extension
# was built with it
MAX_THREADS: int = _maskpack.MAX_THREADS

_ENUMS = _maskpack.enums()  # every C enum in the package's words, with the header's values (read once)


def enum(table: str) -> dict:
    """The C enum ``table`` as the extension exports it: {the package's name: the header's value} (a copy).
    Every module reads its codes here; none keeps a copy of a C value."""
    return dict(_ENUMS[table])

try:
    _CPUS = len(os.sched_getaffinity(0))  # read once: it is a system call
except AttributeError:  # not Linux
    _CPUS = os.cpu_count() or 1

# Set by benchmarks that compare the calling thread with the default team (bench/bench_small_moves.py);
# None in every user's process.
default_override: Optional[int] = None


def default_threads() -> int:
    """The thread count of a call given ``threads=None`` (see the module docstring), in [1, MAX_THREADS]."""
    if default_override is not None:
        return default_override
    torch = sys.modules.get("torch")
    n = torch.get_num_threads() if torch is not None and hasattr(torch, "get_num_threads") else _CPUS
    return max(1, min(MAX_THREADS, int(n)))


def check_threads(threads: Any, default: Optional[int] = None) -> int:
    """The ``threads=`` rule of every call: None -> ``default`` (by default :func:`default_threads`); an int
    (numpy integers too) in [1, MAX_THREADS], else a TypeError (not an int) or a maskpack.Error naming
    ``threads``."""
    if threads is None:
        return default_threads() if default is None else max(1, min(MAX_THREADS, int(default)))
    if isinstance(threads, bool) or not isinstance(threads, int) and not _is_np_integer(threads):
        raise TypeError(f"threads: expected an int, found {type(threads).__name__} {threads!r}")
    n = int(threads)
    if not 1 <= n <= MAX_THREADS:
        raise Error(f"threads: expected in [1, {MAX_THREADS}], found {n}", "MASKPACK_ERR_INVALID_ARGUMENT",
                    argument="threads")
    return n


def _is_np_integer(x: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.integer)


def threads(n: Any) -> int:
    """``threads=`` of a call, resolved: the count it runs with."""
    return check_threads(n)


# ---- teams ---------------------------------------------------------------------------------------------
# One team per (thread count, pool), made on first use and kept for the process. With torch imported,
# maskpack's own threads would share each core with one of torch's OpenMP threads, at half speed, on every
# call that follows a torch operator (in a training step: all of them). MASKPACK_THREAD_POOL=own keeps
# maskpack's own threads; =openmp asks for the OpenMP pool whether or not torch is imported (any OpenMP
# runtime the process has loaded); the default, auto, takes torch's when torch is imported and runs on
# OpenMP (a torch built without OpenMP keeps maskpack's threads). A forked child (a DataLoader worker) keeps
# to maskpack's own threads: GNU's OpenMP runtime is not safe to use after fork() once the parent has used it.
_TEAMS: dict = {}
_FORKED: list = []


def _after_fork_in_child() -> None:
    _TEAMS.clear()
    _FORKED.append(True)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

_POOLS = ("auto", "own", "openmp")


def _pool_wanted() -> str:
    """The pool a team made now asks for: "own", "torch" (auto, torch imported: torch's OpenMP
    runtime only) or "openmp" (MASKPACK_THREAD_POOL=openmp: torch's, else any loaded runtime)."""
    want = os.environ.get("MASKPACK_THREAD_POOL", "auto") or "auto"
    if want not in _POOLS:
        raise Error(f"MASKPACK_THREAD_POOL: expected one of {', '.join(_POOLS)}, found {want!r}",
                    "MASKPACK_ERR_INVALID_ARGUMENT", argument="MASKPACK_THREAD_POOL")
    if _FORKED or want == "own":
        return "own"
    if want == "auto":
        return "torch" if "torch" in sys.modules else "own"
    return "openmp"


def _openmp_team(n: int, any_runtime: bool):
    """A team on torch's OpenMP pool (the runtime loaded from torch's own folder), or with any_runtime
    on whichever OpenMP runtime the process has loaded; None where there is none."""
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        folder = os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib"))
        t = _maskpack.workers_create_openmp(n, folder)
        if t is not None:
            return t
    return _maskpack.workers_create_openmp(n, None) if any_runtime else None


def team(n_threads: Any):
    """The team a call with ``threads=n_threads`` runs on (None: the calling thread alone)."""
    n = check_threads(n_threads)
    if n == 1:
        return None
    want = _pool_wanted()
    t = _TEAMS.get((n, want))
    if t is None:
        t = None if want == "own" else _openmp_team(n, any_runtime=want == "openmp")
        if t is None:  # no such OpenMP runtime in the process: maskpack's own threads
            t = _maskpack.workers_create(n)
        _TEAMS[(n, want)] = t
    return t


def team_pool(n_threads: int) -> str:
    """The pool the team of this many threads runs on: "openmp" or "own" (see MASKPACK_THREAD_POOL)."""
    t = team(n_threads)
    return "own" if t is None else _maskpack.workers_pool(t)


# ---- values derived from a layout ----------------------------------------------------------------------

def cache_of(layout) -> dict:
    """The dict of values derived from an (immutable) layout, kept on it."""
    c = layout._cache
    if c is None:
        c = layout._cache = {}
    return c


def cached(layout, key, make):
    """A value derived from an (immutable) layout, computed once and kept on it."""
    c = cache_of(layout)
    v = c.get(key)
    if v is None:
        v = c[key] = make()
    return v


# ---- the layers above the caller ------------------------------------------------------------------------
# A few calls take a path that lives in a layer above the module that takes the call: a kernel given
# ``group=`` runs its context-parallel path (maskpack.distributed, which imports the kernels), every call
# under torch.compile runs as a custom op (maskpack._compile, over every layer), a Batch hands its torch
# integrations to maskpack.gdn and maskpack.hf. The lower module never imports the upper one: it asks for
# the path by name, and the package's top (maskpack/__init__.py, ``_ABOVE``) gives the loader of the module
# that provides each, run on the first call that takes it (each needs torch, which ``import maskpack`` does
# not load).
_PROVIDERS: dict = {}


def provide(path: str, load) -> None:
    """Enters the loader of the module that provides ``path``; maskpack/__init__.py does, once per path."""
    _PROVIDERS[path] = load


def above(path: str):
    """The module that provides ``path`` ("cp", "compile", "gdn", "hf"), imported on first use."""
    return _PROVIDERS[path]()
