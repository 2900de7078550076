"""The torch binding's output-buffer cache (maskpack._alloc over the C module maskpack._memory).

Pins: a large output's block is reused once torch frees it (and never while a tensor or a view of it
lives, whichever thread drops it), the limit and empty_output_cache release blocks, the limit 0 and
MASKPACK_OUTPUT_CACHE_BYTES=0 turn the cache off, results are bitwise the same as with
caller-provided outputs, gradients through cached outputs match, dtypes and shapes are honoured,
and bad arguments raise.
"""

import os
import subprocess
import sys
import threading

import pytest
import torch

import maskpack
from maskpack import _alloc, _memory

MB = 1 << 20


@pytest.fixture
def cache():
    """A known cache state: limit 1 GiB, nothing cached; restores the previous limit after."""
    old = maskpack.set_output_cache_limit(1 << 30)
    maskpack.empty_output_cache()
    yield
    maskpack.empty_output_cache()
    maskpack.set_output_cache_limit(old)


def gdn_inputs(T=512, H=4, HV=8, K=64, V=256, seed=0):
    g0 = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, K, generator=g0)
    k = torch.randn(T, H, K, generator=g0)
    v = torch.randn(T, HV, V, generator=g0)
    g = -torch.nn.functional.softplus(torch.randn(T, HV, generator=g0)) * 0.5
    beta = torch.sigmoid(torch.randn(T, HV, generator=g0))
    lay = maskpack.Layout.from_lengths([T // 2, T // 2], placement="packed")
    return q, k, v, g, beta, lay


def test_large_output_block_is_reused_after_free(cache):
    t = _alloc.fresh((2048, 1024), torch.float32)  # 8 MiB
    assert t.shape == (2048, 1024) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % (2 * MB) == 0
    p = t.data_ptr()
    info = maskpack.output_cache_info()
    assert info["live_blocks"] == 1 and info["live_bytes"] == 8 * MB and info["cached_blocks"] == 0
    t.fill_(3.0)  # the whole block is writable
    del t
    info = maskpack.output_cache_info()
    assert info["live_blocks"] == 0 and info["cached_blocks"] == 1 and info["cached_bytes"] == 8 * MB
    hits = info["hits"]
    u = _alloc.fresh((1024, 2048), torch.float32)
    assert u.data_ptr() == p
    assert maskpack.output_cache_info()["hits"] == hits + 1


def test_small_outputs_bypass_the_cache(cache):
    before = maskpack.output_cache_info()
    t = _alloc.fresh((100, 100), torch.float32)
    after = maskpack.output_cache_info()
    assert t.shape == (100, 100)
    assert after["live_blocks"] == before["live_blocks"] and after["misses"] == before["misses"]


def test_live_tensor_and_views_keep_their_block(cache):
    a = _alloc.fresh((4 * MB,), torch.float32)  # 16 MiB
    a.copy_(torch.arange(4 * MB, dtype=torch.float32))
    view = a[::1024]
    keep = view.clone()
    pa = a.data_ptr()
    del a  # the view still holds the storage
    assert maskpack.output_cache_info()["cached_blocks"] == 0
    b = _alloc.fresh((4 * MB,), torch.float32)
    assert b.data_ptr() != pa
    b.fill_(-1.0)
    assert torch.equal(view, keep)
    del view
    assert maskpack.output_cache_info()["cached_blocks"] == 1
    c = _alloc.fresh((4 * MB,), torch.float32)
    assert c.data_ptr() == pa


def test_block_freed_on_another_thread_returns(cache):
    t = _alloc.fresh((2 * MB,), torch.float32)
    box = [t]
    del t

    def drop():
        box.clear()

    th = threading.Thread(target=drop)
    th.start()
    th.join()
    info = maskpack.output_cache_info()
    assert info["live_blocks"] == 0 and info["cached_blocks"] == 1


def test_best_fit_and_waste_bound(cache):
    big = _alloc.fresh((16 * MB,), torch.float32)  # 64 MiB
    pb = big.data_ptr()
    del big
    small = _alloc.fresh((2 * MB,), torch.float32)  # 8 MiB: would waste 7/8 of the 64 MiB block
    assert small.data_ptr() != pb
    near = _alloc.fresh((15 * MB,), torch.float32)  # 60 MiB: wastes 1/16, takes it
    assert near.data_ptr() == pb


def test_limit_and_empty_cache_release_blocks(cache):
    ts = [_alloc.fresh((2 * MB,), torch.float32) for _ in range(3)]  # 3 x 8 MiB
    del ts
    assert maskpack.output_cache_info()["cached_bytes"] == 24 * MB
    prev = maskpack.set_output_cache_limit(10 * MB)
    assert prev == 1 << 30
    info = maskpack.output_cache_info()
    assert info["cached_bytes"] == 8 * MB and info["cached_blocks"] == 1
    # a block larger than the limit is unmapped when freed, and older ones make room for a new one
    t = _alloc.fresh((4 * MB,), torch.float32)  # 16 MiB > 10 MiB
    del t
    assert maskpack.output_cache_info()["cached_bytes"] == 8 * MB
    assert maskpack.empty_output_cache() == 8 * MB
    assert maskpack.output_cache_info()["cached_bytes"] == 0


def test_limit_zero_means_torch_empty(cache):
    maskpack.set_output_cache_limit(0)
    before = maskpack.output_cache_info()
    t = _alloc.fresh((4 * MB,), torch.float32)
    assert t.untyped_storage().resizable()  # an ordinary torch allocation
    assert maskpack.output_cache_info()["misses"] == before["misses"]


def test_environment_variable_sets_the_limit():
    code = ("import maskpack, torch\n"
            "from maskpack import _alloc\n"
            "t = _alloc.fresh((4 << 20,), torch.float32)\n"
            "i = maskpack.output_cache_info()\n"
            "print(i['limit'], i['live_blocks'])\n")
    for env, want in (("0", "0 0"), ("0x1000000", "16777216 1")):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MASKPACK_OUTPUT_CACHE_BYTES": env},
                             capture_output=True, text=True, check=True).stdout.split()
        assert " ".join(out) == want
    bad = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MASKPACK_OUTPUT_CACHE_BYTES": "lots"},
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "MASKPACK_OUTPUT_CACHE_BYTES" in bad.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_dtypes_and_shapes(cache, dtype):
    t = _alloc.fresh((3, 1024, 1024), dtype)
    assert t.dtype == dtype and t.shape == (3, 1024, 1024) and t.stride() == (1024 * 1024, 1024, 1)
    t.fill_(1.5)
    assert float(t.double().sum()) == 1.5 * 3 * 1024 * 1024 and bool((t == 1.5).all())


def test_bad_arguments():
    with pytest.raises(ValueError):
        maskpack.set_output_cache_limit(-1)
    with pytest.raises(ValueError):
        _memory.empty((4, 4), 7, 32)  # no such DLPack dtype here
    with pytest.raises(ValueError):
        _memory.empty((-1, 4), 2, 32)
    with pytest.raises(ValueError):
        _memory.empty(tuple([1] * 17), 2, 32)
    with pytest.raises(ValueError):
        _memory.empty((1 << 40, 1 << 40), 2, 32)


def test_unconsumed_capsule_gives_its_block_back(cache):
    cap = _memory.empty((2 * MB,), 2, 32)
    assert maskpack.output_cache_info()["live_blocks"] == 1
    del cap
    info = maskpack.output_cache_info()
    assert info["live_blocks"] == 0 and info["cached_blocks"] == 1


def test_gdn_outputs_come_from_the_cache_and_match_out(cache):
    q, k, v, g, beta, lay = gdn_inputs()
    o1, h1 = maskpack.gated_delta_rule(q, k, v, g, beta, lay)  # o is 512 x 8 x 256 floats = 4 MiB
    assert maskpack.output_cache_info()["live_blocks"] >= 1
    o_ref = torch.empty_like(o1)
    h_ref = torch.empty_like(h1)
    maskpack.gated_delta_rule(q, k, v, g, beta, lay, out=(o_ref, h_ref))
    assert torch.equal(o1, o_ref) and torch.equal(h1, h_ref)
    p = o1.data_ptr()
    del o1
    o2, _ = maskpack.gated_delta_rule(q, k, v, g, beta, lay)
    assert o2.data_ptr() == p  # the same block again, fully rewritten
    assert torch.equal(o2, o_ref)


def test_gdn_gradients_through_cached_outputs(cache):
    q, k, v, g, beta, lay = gdn_inputs(seed=1)
    grads = []
    for limit in (1 << 30, 0):
        maskpack.set_output_cache_limit(limit)
        xs = [t.clone().requires_grad_(True) for t in (q, k, v, g, beta)]
        o, h = maskpack.gated_delta_rule(*xs, lay)
        (o.square().sum() + h.sum()).backward()
        grads.append([x.grad for x in xs])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_attention_outputs_come_from_the_cache(cache):
    g0 = torch.Generator().manual_seed(2)
    T, H, D = 4096, 4, 64  # out: 4 MiB
    q, k, v = (torch.randn(T, H, D, generator=g0) for _ in range(3))
    lay = maskpack.Layout.from_lengths([T // 2, T // 2], placement="packed")
    before = maskpack.output_cache_info()
    out, lse = maskpack.attention(q, k, v, lay)
    assert maskpack.output_cache_info()["live_blocks"] == before["live_blocks"] + 1
    maskpack.set_output_cache_limit(0)
    out0, lse0 = maskpack.attention(q, k, v, lay)
    assert torch.equal(out, out0) and torch.equal(lse, lse0)
