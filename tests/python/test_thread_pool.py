"""Which thread pool maskpack's calls run on (maskpack._runtime: MASKPACK_THREAD_POOL).

With torch imported, a team runs on torch's own OpenMP pool (maskpack_workers_create_hosted), so a call
right after a torch operator does not share its cores with torch's spinning idle threads; the results
are those of maskpack's own threads bit for bit, for every kernel family and the moves; a forked child
(a DataLoader worker) keeps to maskpack's own threads; a bad MASKPACK_THREAD_POOL is refused by name."""
import multiprocessing as mp

import numpy as np
import pytest
import torch

import maskpack
from maskpack import _runtime

LENGTHS = [131, 17, 64, 1, 260, 47]


def _torch_runs_openmp() -> bool:
    return "OpenMP" in torch.__config__.parallel_info().split("ATen parallel backend:")[-1]


@pytest.fixture
def pool(monkeypatch):
    """Sets MASKPACK_THREAD_POOL for the test (teams are cached per pool, so both kinds coexist)."""
    def set_pool(kind):
        monkeypatch.setenv("MASKPACK_THREAD_POOL", kind)
    return set_pool


def test_torch_imported_means_torchs_openmp_pool(pool):
    pool("auto")
    if not _torch_runs_openmp():
        pytest.skip("this torch build does not run its CPU operators on OpenMP")
    assert _runtime.team_pool(2) == "openmp"
    assert _runtime.team_pool(3) == "openmp"
    assert _runtime.team_pool(1) == "own"  # one thread: no team at all, the caller alone
    pool("own")
    assert _runtime.team_pool(2) == "own"
    pool("openmp")
    assert _runtime.team_pool(2) == "openmp"


def test_bad_pool_name_refused(pool):
    pool("tbb")
    with pytest.raises(maskpack.Error) as e:
        _runtime.team_pool(2)
    assert e.value.argument == "MASKPACK_THREAD_POOL"
    assert "auto, own, openmp" in str(e.value)


def _every_family(threads):
    """Outputs and gradients of attention, the gated delta rule, the conv and a move round trip."""
    g = torch.Generator().manual_seed(7)
    lay = maskpack.Layout.from_lengths(LENGTHS, placement="packed")
    T = sum(LENGTHS)
    q = torch.randn(T, 4, 32, generator=g, requires_grad=True)
    k = torch.randn(T, 2, 32, generator=g, requires_grad=True)
    v = torch.randn(T, 2, 32, generator=g, requires_grad=True)
    out = maskpack.attention_autograd(q, k, v, lay, threads=threads)
    gq = torch.randn(T, 2, 16, generator=g, requires_grad=True)
    gk = torch.randn(T, 2, 16, generator=g, requires_grad=True)
    gv = torch.randn(T, 4, 24, generator=g, requires_grad=True)
    gg = (-torch.rand(T, 4, generator=g)).requires_grad_()
    gb = torch.rand(T, 4, generator=g).requires_grad_()
    o, ht = maskpack.gated_delta_rule(gq, gk, gv, gg, gb, lay, threads=threads)
    x = torch.randn(T, 40, generator=g, requires_grad=True)
    w = torch.randn(40, 4, generator=g, requires_grad=True)
    y, st = maskpack.causal_conv1d(x, w, lay, threads=threads)
    loss = out.square().sum() + o.square().sum() + ht.square().sum() + y.square().sum() + st.square().sum()
    loss.backward()
    big = torch.randn(T, 8192, generator=g)  # past the moves' team threshold
    padded = lay.unpack(big, pad_value=-1.0, threads=threads)
    back = lay.pack(padded, threads=threads)
    return [t.detach().clone() for t in (out, o, ht, y, st, q.grad, k.grad, v.grad, gq.grad, gk.grad, gv.grad,
                                         gg.grad, gb.grad, x.grad, w.grad, padded, back)]


@pytest.mark.parametrize("threads", [2, 3])
def test_same_bits_on_either_pool(pool, threads):
    pool("own")
    want = _every_family(threads)
    pool("openmp")
    got = _every_family(threads)
    for a, b in zip(want, got):
        assert torch.equal(a, b)
    # and as the one-thread call: every kernel's result depends on the thread count only
    pool("auto")
    assert all(torch.equal(a, b) for a, b in zip(want, _every_family(threads)))


def _child(queue):
    lay = maskpack.Layout.from_lengths(LENGTHS, placement="packed")
    g = torch.Generator().manual_seed(3)
    T = sum(LENGTHS)
    q, k, v = (torch.randn(T, 4, 32, generator=g) for _ in range(3))
    out, _ = maskpack.attention(q, k, v, lay, threads=2)
    queue.put((_runtime.team_pool(2), out.numpy()))


def test_forked_child_keeps_to_its_own_threads(pool):
    pool("auto")
    # the parent has used the OpenMP pool (torch and maskpack) before forking, as a trainer has
    parent = _every_family(2)
    del parent
    lay = maskpack.Layout.from_lengths(LENGTHS, placement="packed")
    g = torch.Generator().manual_seed(3)
    T = sum(LENGTHS)
    q, k, v = (torch.randn(T, 4, 32, generator=g) for _ in range(3))
    want, _ = maskpack.attention(q, k, v, lay, threads=2)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue,))
    proc.start()
    kind, got = queue.get(timeout=120)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert kind == "own"
    assert np.array_equal(got, want.numpy())


def test_without_torch_maskpacks_own_threads():
    """A process that never imports torch (numpy callers) runs maskpack's own threads; asked for
    OpenMP without any runtime loaded, it keeps them too."""
    import subprocess
    import sys

    code = ("import sys, numpy as np, maskpack\n"
            "from maskpack import _runtime\n"
            "lay = maskpack.Layout.from_lengths([300, 200], placement='right')\n"
            "x = np.arange(lay.n_rows * lay.q_width * 4096, dtype=np.float32).reshape(lay.n_rows, lay.q_width, 4096)\n"
            "assert np.array_equal(lay.unpack(lay.pack(x, threads=2), threads=2)[:, :200], x[:, :200])\n"
            "assert 'torch' not in sys.modules\n"
            "print(_runtime.team_pool(2))\n")
    for pool, want in (("auto", "own"), ("openmp", "own"), ("own", "own")):
        env = dict(__import__("os").environ, MASKPACK_THREAD_POOL=pool)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == want


CP_LENGTHS = [37, 5, 64, 20, 3]


def _cp_worker(rank, world, init_file, out_dir):
    """Ring attention, the sequence-parallel rule and conv (the C algorithms) with threads=2, on each
    pool in turn: their outputs and gradients saved for the parent."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        lay = maskpack.Layout.from_lengths(CP_LENGTHS, placement="packed")
        T = lay.q_width
        g = torch.Generator().manual_seed(11)
        q, k, v = torch.randn(T, 4, 16, generator=g), torch.randn(T, 2, 16, generator=g), torch.randn(T, 2, 16, generator=g)
        gq, gk = torch.randn(T, 3, 8, generator=g), torch.randn(T, 3, 8, generator=g)
        gv = torch.randn(T, 6, 4, generator=g)
        gg = -torch.rand(T, 6, generator=g) * 0.3
        gb = torch.rand(T, 6, generator=g)
        x, w = torch.randn(T, 6, generator=g), torch.randn(6, 4, generator=g) * 0.5
        res = {}
        for pool in ("own", "auto"):
            import os as _os

            _os.environ["MASKPACK_THREAD_POOL"] = pool
            cut = [lay.shard(t, world, rank).clone().requires_grad_() for t in (q, k, v, gq, gk, gv, gg, gb, x)]
            wl = w.clone().requires_grad_()
            o, _ = maskpack.attention(*cut[:3], lay, group=dist.group.WORLD, threads=2, cp_algorithm="ring")
            go, ht = maskpack.gated_delta_rule(*cut[3:8], lay, group=dist.group.WORLD, threads=2, cp_method="sequence")
            y, st = maskpack.causal_conv1d(cut[8], wl, lay, group=dist.group.WORLD, threads=2, cp_method="sequence")
            (o.square().sum() + go.square().sum() + ht.square().sum() + y.square().sum() + st.sum()).backward()
            res[pool] = {"pool": _runtime.team_pool(2),
                         "values": [t.detach() for t in (o, go, ht, y, st)] + [t.grad for t in cut] + [wl.grad]}
        torch.save(res, f"{out_dir}/cp{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_context_parallel_c_algorithms_same_bits_on_either_pool():
    import os
    import tempfile

    import torch.multiprocessing as tmp

    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        tmp.start_processes(_cp_worker, args=(2, init, d), nprocs=2, join=True, start_method="spawn")
        for r in range(2):
            res = torch.load(os.path.join(d, f"cp{r}.pt"))
            assert res["own"]["pool"] == "own"
            if _torch_runs_openmp():
                assert res["auto"]["pool"] == "openmp"
            for a, b in zip(res["own"]["values"], res["auto"]["values"]):
                assert torch.equal(a, b)


def test_team_threshold_set_low_still_moves_every_byte():
    """MASKPACK_TEAM_MIN_BYTES set below one chunk: a small move split over a team is one job, not zero (it once
    copied nothing and returned success)."""
    import os
    import subprocess
    import sys

    code = ("import numpy as np, maskpack\n"
            "lay = maskpack.Layout.from_lengths([5, 3, 7], placement='right')\n"
            "x = np.arange(lay.n_rows * lay.q_width * 4, dtype=np.float32).reshape(lay.n_rows, lay.q_width, 4)\n"
            "want = lay.pack(x, threads=1)\n"
            "for t in (2, 3):\n"
            "    got = lay.pack(x, threads=t)\n"
            "    assert np.array_equal(got, want), (t, got, want)\n"
            "    back = lay.unpack(got, threads=t)\n"
            "    assert np.array_equal(back, lay.unpack(want, threads=1)), t\n"
            "print('moved', want.shape)\n")
    env = dict(os.environ, MASKPACK_TEAM_MIN_BYTES="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "moved (15, 4)" in out.stdout, out.stdout + out.stderr
