"""Loads the pinned upstream functions the maskpack.compat twins are compared with, unmodified, from
build/upstream (installed without dependencies by tools/install_upstream.sh: make test-conformance), and
fakes what they read from globals: Megatron's parallel_state, verl's is_npu_available, and, to run several
CP ranks in one process, torch.distributed.all_gather."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = Path(os.environ.get("MASKPACK_UPSTREAM", ROOT / "build" / "upstream"))
PINS = {"verl": "0.9.1", "megatron-core": "0.16.1", "ms-swift": "4.6.0", "mcore-bridge": "1.6.5"}


def require_upstream(package_dir: str):
    if not (UPSTREAM / package_dir).is_dir():
        pytest.skip(f"{UPSTREAM / package_dir} missing: run `make test-conformance` (installs the pinned wheels)")
    if str(UPSTREAM) not in sys.path:
        sys.path.append(str(UPSTREAM))  # appended: never shadows the environment's own packages


class FakeParallelState:
    """Megatron's parallel_state, per case."""

    def __init__(self, tp=1, cp=1, cp_rank=0, group=None, sequence_parallel=False):
        self.tp, self.cp, self.cp_rank, self.group = tp, cp, cp_rank, group

    def get_tensor_model_parallel_world_size(self):
        return self.tp

    def get_tensor_model_parallel_rank(self):
        return 0

    def get_context_parallel_world_size(self):
        return self.cp

    def get_context_parallel_rank(self):
        return self.cp_rank

    def get_context_parallel_group(self):
        return self.group

    def model_parallel_is_initialized(self):
        return True


def _load_file(name: str, path: Path, stubs: dict):
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return mod


_CACHE: dict = {}


def verl_mcore_util():
    """verl/models/mcore/util.py (verl's package __init__ needs ray: its two verl imports are stubbed;
    megatron.core is the real 0.16.1)."""
    if "verl" not in _CACHE:
        require_upstream("verl")
        import transformers.utils.logging  # noqa: F401  (adds logging.Logger.warning_once, which verl calls)

        def pkg(n):
            m = types.ModuleType(n)
            m.__path__ = []
            return m

        device = types.ModuleType("verl.utils.device")
        device.is_npu_available = False
        model = types.ModuleType("verl.utils.model")
        model.CausalLMOutputForPPO = object
        stubs = {"verl": pkg("verl"), "verl.utils": pkg("verl.utils"), "verl.utils.device": device,
                 "verl.utils.model": model}
        _CACHE["verl"] = _load_file("upstream_verl_mcore_util", UPSTREAM / "verl/models/mcore/util.py", stubs)
    return _CACHE["verl"]


@contextlib.contextmanager
def patched(mod, **values):
    old = {k: getattr(mod, k) for k in values}
    for k, v in values.items():
        setattr(mod, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(mod, k, v)


@contextlib.contextmanager
def fake_all_gather(parts):
    """torch.distributed.all_gather in one process: rank j's tensor is parts[j]."""
    def all_gather(tensor_list, tensor, group=None, async_op=False):
        for j, t in enumerate(tensor_list):
            t.copy_(parts[j].detach())

    with patched(torch.distributed, all_gather=all_gather):
        yield


# ---- case counting: every comparison that held, per twin (written to build/conformance/counts.json) ----

COUNTS: dict = {}


def count(twin: str, n: int = 1) -> None:
    COUNTS[twin] = COUNTS.get(twin, 0) + n


def write_counts() -> None:
    import json

    out = ROOT / "build" / "conformance"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "counts.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    old.update(COUNTS)
    path.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")


def assert_same(a, b, what: str) -> None:
    """Bit for bit: same type, dtype, shape, device and values (nested tensors: values and offsets)."""
    if a is None or b is None or isinstance(a, (int, float, str, bool)):
        assert a == b and type(a) is type(b), f"{what}: {a!r} != {b!r}"
        return
    assert isinstance(b, torch.Tensor), f"{what}: {type(b)}"
    assert a.is_nested == b.is_nested, what
    if a.is_nested:
        assert_same(a.offsets(), b.offsets(), what + ".offsets()")
        assert_same(a.values(), b.values(), what + ".values()")
        return
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert a.device == b.device, what
    assert torch.equal(a, b), f"{what}: values differ\n{a}\n{b}"


def assert_params(a, b, what: str) -> None:
    """Every dataclass field of upstream's PackedSeqParams, equal in the twin's."""
    import dataclasses

    for f in dataclasses.fields(a):
        assert_same(getattr(a, f.name), getattr(b, f.name), f"{what}.{f.name}")
