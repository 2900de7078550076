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
PINS = {"verl": "0.9.1", "megatron-core": "0.16.1", "ms-swift": "4.6.0", "mcore-bridge": "1.6.5", "twinkle-kit": "0.5.1",
        "transformer-engine": "2.11.0", "tensordict": "0.10.0"}  # tools/install_upstream.sh installs these


def require_upstream(package_dir: str):
    """The pinned upstream packages on sys.path (appended: they never shadow the environment's own), installed
    first by tools/install_upstream.sh when missing; a failed install fails the test (nothing is skipped)."""
    if not (UPSTREAM / package_dir).is_dir():
        import subprocess

        r = subprocess.run(["sh", str(ROOT / "tools" / "install_upstream.sh"), str(UPSTREAM)], capture_output=True,
                           text=True, env=dict(os.environ, PY=sys.executable))
        if r.returncode != 0 or not (UPSTREAM / package_dir).is_dir():
            pytest.fail(f"installing the pinned upstream packages into {UPSTREAM} failed:\n{r.stdout}\n{r.stderr}")
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


def verl_seqlen_balancing():
    """verl/utils/seqlen_balancing.py's rearrange_micro_batches and the functions it calls, their source
    extracted unmodified, with verl's own tensordict_utils module (the real tensordict 0.10.0 underneath) and
    torch.distributed; get_device_name is the CPU (gloo)."""
    if "verl_balancing" not in _CACHE:
        import heapq

        require_upstream("verl")
        require_upstream("tensordict")
        tu = _load_file("upstream_verl_tensordict_utils", UPSTREAM / "verl/utils/tensordict_utils.py", {})
        ns = {"heapq": heapq, "torch": torch, "dist": torch.distributed, "tu": tu, "get_device_name": lambda: "cpu"}
        for name in ("calculate_workload", "karmarkar_karp", "get_seqlen_balanced_partitions", "ceildiv",
                     "roundup_divisible"):
            extract("verl/utils/seqlen_balancing.py", name, ns)
        _CACHE["verl_balancing"] = (extract("verl/utils/seqlen_balancing.py", "rearrange_micro_batches", ns), tu)
    return _CACHE["verl_balancing"]


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
    if not isinstance(a, torch.Tensor):  # a process group and the like: the same object
        assert a is b, f"{what}: {a!r} is not {b!r}"
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


# ---- megatron-core and TransformerEngine ----------------------------------------------------------------

def port_thd_get_partitioned_indices(cu_seqlens, total_tokens, world_size, rank):
    """A line-by-line port (tests only) of TransformerEngine 2.11.0's CUDA kernel
    thd_partition_indices_kernel (common/fused_attn/context_parallel.cu) and its host checks
    (pytorch/csrc/extensions/attention.cpp): TransformerEngine's torch package is CUDA-only."""
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.dim() == 1 and cu_seqlens.size(0) >= 2
    assert 0 <= rank < world_size and world_size > 0
    assert total_tokens > 0 and total_tokens % (world_size * 2) == 0
    batch = cu_seqlens.size(0) - 1
    cu = cu_seqlens.tolist()
    cu_s = []
    for i in range(batch + 1):
        seqlen = cu[i]
        assert seqlen % (world_size * 2) == 0
        cu_s.append(seqlen // world_size)

    def binary_search(target, array, length):
        left, right = 1, length - 1
        while left < right:
            mid = (left + right) // 2
            if array[mid] <= target:
                left = mid + 1
            else:
                right = mid
        return left - 1

    output = [0] * (total_tokens // world_size)
    for token_id in range(total_tokens // world_size):
        seq_id = binary_search(token_id, cu_s, batch + 1)
        seq_len = cu_s[seq_id + 1] - cu_s[seq_id]
        index = token_id - cu_s[seq_id]
        offset = rank if index < seq_len // 2 else (world_size - 1) * 2 - rank
        index += cu_s[seq_id] * world_size + seq_len // 2 * offset
        output[token_id] = index
    return torch.tensor(output, dtype=torch.int32)


class FakeTex:
    thd_get_partitioned_indices = staticmethod(port_thd_get_partitioned_indices)


def megatron_module(name: str):
    require_upstream("megatron")
    import importlib

    return importlib.import_module(name)


def te_functions():
    """TransformerEngine 2.11.0's pure-torch CP helpers, each function's source extracted unmodified from
    transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py (the package import needs
    its CUDA extension) and executed with the few names it needs (jit_fuser: the identity)."""
    if "te" in _CACHE:
        return _CACHE["te"]
    import ast
    from typing import Optional, Tuple

    path = UPSTREAM / "te/transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py"
    require_upstream("te")
    tree = ast.parse(path.read_text())
    names = ("get_cu_seqlens_on_cp_rank", "pad_thd_sequences_for_cp", "generate_positional_ids_for_cp",
             "get_batch_on_this_cp_rank")
    ns = {"torch": torch, "Tuple": Tuple, "Optional": Optional, "jit_fuser": lambda f: f}
    src = path.read_text().splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            exec(compile("".join(src[start:node.end_lineno]), str(path), "exec"), ns)
    _CACHE["te"] = types.SimpleNamespace(**{n: ns[n] for n in names})
    return _CACHE["te"]


class FakeGroup:
    """A process group of `size` with this process at `rank` (torch.distributed.get_world_size/get_rank
    patched to read it)."""

    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


@contextlib.contextmanager
def fake_group_queries():
    def ws(group=None):
        return group.size() if isinstance(group, FakeGroup) else 1

    def rk(group=None):
        return group.rank() if isinstance(group, FakeGroup) else 0

    with patched(torch.distributed, get_world_size=ws, get_rank=rk):
        yield


# ---- one function at a time (packages whose import needs CUDA, TransformerEngine or a framework stack) ----

def extract(relpath: str, name: str, ns: dict, cls: str = None):
    """The function ``name`` (or method ``cls.name``) of ``UPSTREAM/relpath``, its source extracted unmodified
    with ``ast`` and executed in ``ns`` (the few names it needs, faked where they reach a global)."""
    import ast
    import textwrap

    require_upstream(relpath.split("/")[0])
    path = UPSTREAM / relpath
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    body = ast.parse(text).body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
    src = textwrap.dedent("".join(lines[start:node.end_lineno]))
    exec(compile(src, str(path), "exec"), ns)
    return ns[name]
