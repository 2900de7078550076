"""The torch binding's output-buffer cache (maskpack._alloc).

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
from maskpack import _alloc

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
    assert not _alloc.is_cached(t)  # an ordinary torch allocation
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
    with pytest.raises(ValueError, match="byte count >= 0"):
        maskpack.set_output_cache_limit(-1)
    with pytest.raises(RuntimeError):  # torch's own message for a negative size
        _alloc.fresh((-1, 1 << 22), torch.float32)


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


# ---- adversarial uses (review of the cache): what torch users do with outputs ----------------------


def cached(n_floats=2 * MB):
    """A float32 tensor of n_floats from the cache (at least 4 MiB, so fresh() takes this path)."""
    t = _alloc.fresh((n_floats,), torch.float32)
    assert _alloc.is_cached(t) and t.data_ptr() % (2 * MB) == 0  # a cache block, on a huge-page boundary
    return t


def test_save_load_pickle_deepcopy_copy_out_of_the_block(cache):
    import copy
    import io
    import pickle

    t = cached()
    t.copy_(torch.arange(2 * MB, dtype=torch.float32))
    buf = io.BytesIO()
    torch.save(t[1:], buf)  # a view: the whole storage is written
    buf.seek(0)
    copies = [torch.load(buf), pickle.loads(pickle.dumps(t)), copy.deepcopy(t)]
    p = t.data_ptr()
    del t
    assert maskpack.output_cache_info()["cached_blocks"] == 1  # the copies do not hold the block
    u = cached()
    assert u.data_ptr() == p
    u.fill_(-7.0)
    want = torch.arange(2 * MB, dtype=torch.float32)
    assert torch.equal(copies[0], want[1:]) and torch.equal(copies[1], want) and torch.equal(copies[2], want)


def test_share_memory_takes_the_block_out_of_the_cache(cache):
    t = cached()
    t.fill_(2.0)
    view = t[::1024]
    t.share_memory_()  # torch moves the storage into shared memory: another process may map it
    assert t.is_shared() and view.data_ptr() == t.data_ptr() and not _alloc.is_cached(t)
    info = maskpack.output_cache_info()
    assert info["live_blocks"] == 0 and info["cached_blocks"] == 0  # forgotten, not reusable
    u = cached()
    u.fill_(5.0)
    assert bool((t == 2.0).all()) and bool((view == 2.0).all())
    del t, view
    assert maskpack.output_cache_info()["cached_blocks"] == 0  # the shared storage never comes back


def test_storage_set_numpy_as_strided_hold_the_block(cache):
    holders = []
    for make in (lambda t: t.untyped_storage(), lambda t: torch.empty(0).set_(t.untyped_storage(), 0, (10,)),
                 lambda t: t.numpy(), lambda t: t.as_strided((10, 10), (1, 1)), lambda t: t.view(torch.int32)):
        t = cached()
        t.fill_(1.0)
        p = t.data_ptr()
        holders.append((make(t), p))
        del t
    info = maskpack.output_cache_info()
    assert info["live_blocks"] == 5 and info["cached_blocks"] == 0
    fresh_ptrs = {cached().data_ptr() for _ in range(2)}
    assert fresh_ptrs.isdisjoint(p for _, p in holders)
    holders.clear()
    assert maskpack.output_cache_info()["live_blocks"] == 0
    t = cached()
    t.set_(torch.zeros(5))  # set_ drops the tensor's hold on its block at once
    assert maskpack.output_cache_info()["live_blocks"] == 0


def test_resize_and_larger_out_work_as_for_any_tensor(cache):
    t = cached()
    t.fill_(4.0)
    t.resize_(10)
    assert t.shape == (10,) and bool((t == 4.0).all()) and maskpack.output_cache_info()["live_blocks"] == 1
    del t
    assert maskpack.output_cache_info()["live_blocks"] == 0
    # growing reallocates the storage (the storage is torch's own): the old values stay, the new
    # elements are writable, and the block is forgotten (its memory went back to torch)
    t = cached()
    t.copy_(torch.arange(2 * MB, dtype=torch.float32))
    t.resize_(3 * MB)
    t[2 * MB:] = -1.0
    assert torch.equal(t[:2 * MB], torch.arange(2 * MB, dtype=torch.float32)) and float(t[-1]) == -1.0
    assert not _alloc.is_cached(t)
    info = maskpack.output_cache_info()
    assert info["live_blocks"] == 0 and info["cached_blocks"] == 0
    with pytest.warns(UserWarning, match="resized"):  # torch's deprecation note for out= of another shape
        o = torch.add(torch.ones(3 * MB), 1.0, out=cached())
    assert o.shape == (3 * MB,) and bool((o == 2.0).all())


def test_a_grown_output_is_read_without_a_fault(cache):
    # the crash this cache once had: a tensor left larger than its storage after a failed resize_
    code = ("import torch\n"
            "from maskpack import _alloc\n"
            "t = _alloc.fresh((2 << 20,), torch.float32)\n"
            "t.fill_(1.0)\n"
            "t.resize_(3 << 20)\n"
            "t[2 << 20:] = 2.0\n"
            "print(t.shape[0], float(t.clone().sum()), flush=True)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(3 * MB), str(float(2 * MB + 2 * MB))]


def test_zero_numel_never_reaches_the_cache(cache):
    before = maskpack.output_cache_info()
    t = _alloc.fresh((0, 1 << 22), torch.float32)
    assert t.shape == (0, 1 << 22) and not _alloc.is_cached(t)
    assert maskpack.output_cache_info()["misses"] == before["misses"]


def test_block_count_limit_and_least_recently_used_release(cache):
    n = _alloc._MAX_BLOCKS
    ts = [_alloc.fresh((MB,), torch.float32) for _ in range(n + 44)]  # 4 MiB each, never touched
    assert sum(_alloc.is_cached(t) for t in ts) == n  # beyond the bound: plain torch.empty
    assert maskpack.output_cache_info()["live_blocks"] == n
    tracked = [t.data_ptr() for t in ts if _alloc.is_cached(t)]
    ts.clear()
    info = maskpack.output_cache_info()
    assert info["cached_blocks"] == n and info["cached_bytes"] == 4 * MB * n and info["live_blocks"] == 0
    maskpack.set_output_cache_limit(4 * MB * 10)  # keeps the 10 handed out last
    assert maskpack.output_cache_info()["cached_blocks"] == 10
    hits = maskpack.output_cache_info()["hits"]
    again = [_alloc.fresh((MB,), torch.float32) for _ in range(10)]
    assert maskpack.output_cache_info()["hits"] == hits + 10
    assert {t.data_ptr() for t in again} == set(tracked[-10:])


def test_limit_changed_while_blocks_are_live(cache):
    ts = [cached() for _ in range(4)]  # 4 x 8 MiB live
    maskpack.set_output_cache_limit(16 * MB)
    ts.clear()
    info = maskpack.output_cache_info()
    assert info["cached_bytes"] == 16 * MB and info["live_blocks"] == 0
    maskpack.set_output_cache_limit(1 << 30)
    ts = [cached() for _ in range(4)]
    assert maskpack.output_cache_info()["hits"] == info["hits"] + 2
    ts.clear()
    assert maskpack.output_cache_info()["cached_bytes"] == 32 * MB


def test_many_threads_take_and_free_never_share_a_block(cache):
    live, lock, errors = set(), threading.Lock(), []

    def work(seed):
        g = torch.Generator().manual_seed(seed)
        try:
            for _ in range(100):
                n = int(torch.randint(1, 6, (1,), generator=g)) * MB
                t = _alloc.fresh((n,), torch.float32)
                with lock:
                    if t.data_ptr() in live:
                        errors.append(f"block {t.data_ptr():#x} handed out twice")
                    live.add(t.data_ptr())
                t[::65536] = float(seed)  # one element per 256 KiB
                if not bool((t[::65536] == float(seed)).all()):
                    errors.append("a block changed under its holder")
                with lock:
                    live.discard(t.data_ptr())
                del t  # freed here, on this thread, racing the others' requests
        except Exception as exc:  # reported below: an assertion in a thread would be lost
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    info = maskpack.output_cache_info()
    assert info["live_blocks"] == 0 and info["live_bytes"] == 0
    assert info["cached_blocks"] <= 256 and info["cached_bytes"] <= info["limit"]
    assert info["hits"] + info["misses"] >= 800


def poisoned_rerun(fn):
    """Runs fn() (-> tensors), fills its outputs with NaN, frees them and runs fn again: the second
    run takes the same blocks, so an element a kernel leaves unwritten shows up as a NaN."""
    first = fn()
    for t in first:
        t.fill_(float("nan"))
    del first
    hits = maskpack.output_cache_info()["hits"]
    second = fn()
    assert maskpack.output_cache_info()["hits"] > hits  # the poisoned blocks were reused
    return second


def test_stale_blocks_never_leak_into_padded_outputs_and_grads(cache):
    # pad rows and zero-length segments are the elements a kernel could skip; fresh pages are zero
    # there, a reused block is not
    lay = maskpack.Layout.from_lengths([300, 0, 212], placement="right")
    g0 = torch.Generator().manual_seed(5)
    q, k = (torch.randn(3, 300, 2, 64, generator=g0) for _ in range(2))
    v, do = (torch.randn(3, 300, 8, 256, generator=g0) for _ in range(2))
    g = -torch.nn.functional.softplus(torch.randn(3, 300, 8, generator=g0)) * 0.5
    beta = torch.sigmoid(torch.randn(3, 300, 8, generator=g0))

    def gdn():
        xs = [t.clone().requires_grad_(True) for t in (q, k, v, g, beta)]
        o, h = maskpack.gated_delta_rule(*xs, lay)
        ((o * do).sum() + h.sum()).backward()
        return [o.detach(), h.detach()] + [x.grad for x in xs]

    qkv = [torch.randn(3, 1400, 4, 64, generator=g0) for _ in range(3)]  # 4.1 MB each

    def attn():
        xs = [t.clone().requires_grad_(True) for t in qkv]
        la = maskpack.Layout.from_lengths([1400, 0, 848], placement="right")
        o = maskpack.attention_autograd(*xs, la)
        (o * o).sum().backward()
        return [o.detach()] + [x.grad for x in xs]

    for fn in (gdn, attn):
        maskpack.set_output_cache_limit(0)
        want = fn()
        maskpack.set_output_cache_limit(1 << 30)
        got = poisoned_rerun(fn)
        for a, b in zip(want, got):
            assert torch.equal(a, b)


def test_retained_graph_accumulates_into_stolen_cached_grads(cache):
    q, k, v, g, beta, lay = gdn_inputs(seed=3)
    grads = []
    for limit, n_backward in ((0, 1), (1 << 30, 2)):
        maskpack.set_output_cache_limit(limit)
        xs = [t.clone().requires_grad_(True) for t in (q, k, v, g, beta)]
        o, h = maskpack.gated_delta_rule(*xs, lay)
        loss = o.square().sum() + h.sum()
        for _ in range(n_backward):
            loss.backward(retain_graph=True)  # the second pass adds in place into the first's grads
        grads.append([x.grad for x in xs])
    assert _alloc.is_cached(grads[1][2])  # v.grad is the stolen cached dv
    for one, two in zip(*grads):
        assert torch.equal(one * 2, two)


def test_in_place_change_of_a_saved_cached_output_is_caught(cache):
    g0 = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(4096, 4, 64, generator=g0).requires_grad_(True) for _ in range(3))
    lay = maskpack.Layout.from_lengths([2048, 2048], placement="packed")
    out = maskpack.attention_autograd(q, k, v, lay)
    assert _alloc.is_cached(out)
    out.mul_(2.0)  # out is saved for the backward: autograd's version check must see this
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_forked_children_and_dataloader_workers(cache):
    from torch.utils.data import DataLoader, Dataset

    hold = [cached()]  # the parent's live output (a list: the child drops it)
    hold[0].fill_(7.0)
    spare = cached()
    spare_ptr = spare.data_ptr()
    del spare  # a cached block the children inherit
    before = maskpack.output_cache_info()

    class Items(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            # a worker reads the parent's block (copy-on-write) and makes outputs from its own cache
            assert float(hold[0][12345]) == 7.0
            t = cached()
            t.fill_(float(i))
            return t

    got = [float(t[::MB].sum()) for t in DataLoader(Items(), batch_size=None, num_workers=2,
                                                  multiprocessing_context="fork", timeout=60)]
    assert got == [0.0, 2.0, 4.0, 6.0]

    pid = os.fork()
    if pid == 0:  # only small (single-threaded) torch ops here: torch's OpenMP pool hangs after fork
        code = 0
        try:
            info = maskpack.output_cache_info()
            x = _alloc.fresh((2 * MB,), torch.float32)  # takes the inherited cached block
            x[:8] = 1.0
            code |= 0 if (info["cached_blocks"] == 1 and x.data_ptr() == spare_ptr) else 2
            hold.clear()  # nothing else holds it in the child: its block goes back to the child's cache
            code |= 0 if maskpack.output_cache_info()["cached_blocks"] == 1 else 4
        except BaseException:
            code = 8
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    after = maskpack.output_cache_info()
    assert float(hold[0][12345]) == 7.0 and float(hold[0][0]) == 7.0
    assert after["live_blocks"] == before["live_blocks"] and after["cached_blocks"] == before["cached_blocks"]


def test_interpreter_exit_with_live_cached_and_cyclic_blocks():
    code = ("import torch, maskpack\n"
            "from maskpack import _alloc\n"
            "keep = [_alloc.fresh((4 << 20,), torch.float32) for _ in range(3)]\n"
            "cycle = [_alloc.fresh((4 << 20,), torch.float32)]; cycle.append(cycle)\n"
            "x = _alloc.fresh((4 << 20,), torch.float32).requires_grad_(); graph = (x * 3).sum()\n"
            "del keep[0]\n"
            "i = maskpack.output_cache_info()\n"
            "print(i['live_blocks'] >= 4, i['cached_bytes'] >= 16 << 20)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_relayout_outputs_come_from_the_cache(cache, dtype):
    # padded [2, 2048, 1024] -> packed [lengths 2048 + 1500, 1024]: 14 MiB in f32 / 7 MiB in bf16
    g0 = torch.Generator().manual_seed(3)
    mask = torch.zeros(2, 2048, dtype=torch.bool)
    mask[0, :] = True
    mask[1, :1500] = True
    pad = maskpack.Layout.from_mask2d(mask, convention="keep")
    packed = maskpack.Layout.from_lengths([2048, 1500], placement="packed")
    x = torch.randn(2, 2048, 1024, generator=g0).to(dtype)
    before = maskpack.output_cache_info()
    y = maskpack.relayout(x, pad, packed)
    assert maskpack.output_cache_info()["live_blocks"] == before["live_blocks"] + 1
    back = maskpack.relayout(y, packed, pad, pad_value=-2.0)  # every pad row written with -2
    assert torch.equal(back[mask], x[mask]) and bool((back[~mask] == -2.0).all())
    maskpack.set_output_cache_limit(0)
    assert torch.equal(maskpack.relayout(x, pad, packed), y)
