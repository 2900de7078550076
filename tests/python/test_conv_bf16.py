"""maskpack.causal_conv1d on bfloat16 tensors (the vector rows serve bf16 natively: widened on load,
rounded to nearest even on store, the f32 rows' arithmetic in between).

Claims: the bf16 call equals, bit for bit, the f32 call on the widened inputs with its outputs
rounded to bf16 (forward and every gradient); it agrees with a float64 F.conv1d reference within
the bf16 rounding of the outputs (bound derived below); padded == packed and the thread count are
bitwise; the vector kernels (auto, avx2, avx512) give the same bits; an ISA this CPU lacks forced
is refused.
"""

import pytest
import torch
import torch.nn.functional as F

import maskpack


def _runs(isa):
    lay = maskpack.Layout.from_lengths([3], placement="packed")
    try:
        maskpack.causal_conv1d(torch.zeros(3, 8, dtype=torch.bfloat16), torch.zeros(8, 2), lay, isa=isa)
        return True
    except maskpack.Error as e:
        assert e.status == "MASKPACK_ERR_UNSUPPORTED"
        return False


ALL_ISAS = ("ref", "avx2", "avx512", "avx512_bf16", "amx")
RUNNABLE = [i for i in ALL_ISAS if _runs(i)]
VECTOR = [i for i in RUNNABLE if i != "ref"]
LENGTHS = [0, 1, 2, 5, 70, 33]


def _inputs(C, W, wdtype, seed, lengths=LENGTHS):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lengths), C, generator=g).to(torch.bfloat16)
    w = (0.7 * torch.randn(C, 1, W, generator=g)).to(wdtype)
    prefix = torch.randn(len(lengths), C, W - 1, generator=g).to(torch.bfloat16)
    gy = torch.randn(sum(lengths), C, generator=g).to(torch.bfloat16)
    gs = torch.randn(len(lengths), C, W - 1, generator=g)
    return x, w, prefix, gy, gs


def _run(x, w, prefix, gy, gs, lay, silu, **kw):
    """-> (y, state, dx, dw, dprefix) of one forward + backward"""
    xl, wl, pl = (t.clone().requires_grad_(True) for t in (x, w, prefix))
    y, st = maskpack.causal_conv1d(xl, wl, lay, "silu" if silu else None, prefix=pl, **kw)
    ((y.float() * gy.float()).sum() + (st * gs).sum()).backward()
    return y.detach(), st.detach(), xl.grad, wl.grad, pl.grad


def _bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16
                                                                      else a, b.view(torch.int16)
                                                                      if b.dtype == torch.bfloat16 else b)


@pytest.mark.parametrize("isa", VECTOR or ["ref"])
@pytest.mark.parametrize("C,W", [(8, 4), (24, 3), (70, 2), (131, 1)])
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("silu", [False, True])
def test_bf16_is_the_f32_kernel_on_widened_inputs_rounded(isa, C, W, wdtype, silu):
    lay = maskpack.Layout.from_lengths(LENGTHS, placement="packed")
    x, w, prefix, gy, gs = _inputs(C, W, wdtype, seed=C * 10 + W)
    y, st, dx, dw, dp = _run(x, w, prefix, gy, gs, lay, silu, isa=isa)
    assert y.dtype == dx.dtype == dp.dtype == torch.bfloat16 and dw.dtype == wdtype
    y32, st32, dx32, dw32, dp32 = _run(x.float(), w, prefix.float(), gy.float(), gs, lay, silu, isa=isa)
    # bit for bit: every bf16 output is the f32 kernel's output rounded once (torch's .to rounds to
    # nearest even, as mp_f32_to_bf16); dweight and conv_state are the f32 call's own
    assert _bits_equal(y, y32.to(torch.bfloat16))
    assert _bits_equal(dx, dx32.to(torch.bfloat16))
    assert _bits_equal(dp, dp32.to(torch.bfloat16))
    assert torch.equal(st, st32) and torch.equal(dw, dw32)
    assert torch.count_nonzero(dx) > 0 and torch.count_nonzero(y) > 0


@pytest.mark.parametrize("isa", RUNNABLE)
@pytest.mark.parametrize("W", [1, 3, 4])
def test_bf16_matches_float64_conv1d(isa, W):
    """Bound: the kernel's f32 value is within E = 2^-20 (S + 1) of the float64 result r, S the sum of
    the terms' magnitudes (at most W + 1 <= 5 f32 roundings of 2^-24 each, and the vector exp's few
    ulps in silu: a margin of 3 and more); rounding it to bf16 moves it by at most half an ulp, 2^-8
    of its magnitude (8 significant bits). So |out - r| <= 2^-8 (|r| + E) + E, elementwise; bf16
    rounding of the outputs is the only term that is not float32's."""
    C = 40
    lay = maskpack.Layout.from_lengths(LENGTHS, placement="packed")
    x, w, prefix, gy, gs = _inputs(C, W, torch.float32, seed=W)
    y, st, dx, dw, dp = _run(x, w, prefix, gy, gs, lay, True, isa=isa)
    wd = w.double().requires_grad_(True)
    xd = x.double().requires_grad_(True)
    pd = prefix.double().requires_grad_(True)
    loss, at = 0.0, 0
    for i, n in enumerate(LENGTHS):
        seq = torch.cat([pd[i], xd[at:at + n].T], dim=1)[None]  # [1, C, W-1+n]
        if n:
            pre = F.conv1d(seq, wd, groups=C)[0].T  # [n, C]
            S = F.conv1d(seq.abs(), wd.abs(), groups=C)[0].T.detach()
            ref = F.silu(pre)
            E = (S + 1) * 2.0 ** -20
            err = (y[at:at + n].double() - ref.detach()).abs()
            assert bool((err <= 2.0 ** -8 * (ref.detach().abs() + E) + E).all()), float(err.max())
            loss = loss + (ref * gy[at:at + n].double()).sum()
        if W > 1:
            loss = loss + (seq[0, :, seq.shape[-1] - (W - 1):] * gs[i].double()).sum()
            assert torch.equal(st[i].double(), seq[0, :, seq.shape[-1] - (W - 1):].detach())
        at += n
    loss.backward()
    # gradients: dx and d_prefix are bf16 outputs (the same bound, S from |w| |dpre| + |d state|,
    # bounded here by the sum with |dy| in place of |dpre|, silu' <= 1.1); dweight is f32
    # (no bf16 rounding): 2^-18 of the magnitudes' sum
    dpre_mag = 1.1 * gy.double().abs()
    gs_max = float(gs.abs().max()) if gs.numel() else 0.0
    for got, want in ((dx, xd.grad), (dp, pd.grad)) if W > 1 else ((dx, xd.grad),):
        Sg = torch.full_like(want, W * float(dpre_mag.max()) * float(w.abs().max()) + gs_max)
        E = (Sg + 1) * 2.0 ** -20
        assert bool(((got.double() - want).abs() <= 2.0 ** -8 * (want.abs() + E) + E).all())
    dwS = float(dpre_mag.sum(0).max()) * float(x.float().abs().max().clamp(min=1)) + 1
    assert float((dw.double() - wd.grad).abs().max()) <= 2.0 ** -18 * dwS


@pytest.mark.parametrize("isa", RUNNABLE)
def test_bf16_padded_equals_packed_and_threads_bitwise(isa):
    C, W = 70, 4
    lengths = [5, 70, 0, 33]
    packed = maskpack.Layout.from_lengths(lengths, placement="packed")
    padded = maskpack.Layout.from_lengths(lengths, placement="right")
    x, w, prefix, gy, gs = _inputs(C, W, torch.bfloat16, seed=7, lengths=lengths)
    a = _run(x, w, prefix, gy, gs, packed, True, isa=isa, threads=1)
    for threads in (2, 3):
        b = _run(x, w, prefix, gy, gs, packed, True, isa=isa, threads=threads)
        assert all(_bits_equal(u, v) for u, v in zip(a, b))
    S = max(lengths)
    xp = torch.zeros(len(lengths), S, C, dtype=torch.bfloat16)
    gyp = torch.zeros(len(lengths), S, C, dtype=torch.bfloat16)
    at = 0
    for i, n in enumerate(lengths):
        xp[i, :n], gyp[i, :n] = x[at:at + n], gy[at:at + n]
        xp[i, n:] = 1e30  # pads are never read
        at += n
    yp, stp, dxp, dwp, dpp = _run(xp, w, prefix, gyp, gs, padded, True, isa=isa, threads=2)
    at = 0
    for i, n in enumerate(lengths):
        assert _bits_equal(yp[i, :n], a[0][at:at + n]) and _bits_equal(dxp[i, :n], a[2][at:at + n])
        assert torch.count_nonzero(yp[i, n:]) == 0 and torch.count_nonzero(dxp[i, n:]) == 0
        at += n
    assert torch.equal(stp, a[1]) and _bits_equal(dwp, a[3]) and _bits_equal(dpp, a[4])


def test_vector_isas_give_the_same_bits_and_missing_ones_are_refused(monkeypatch):
    monkeypatch.delenv("MASKPACK_ISA", raising=False)
    lay = maskpack.Layout.from_lengths(LENGTHS, placement="packed")
    x, w, prefix, gy, gs = _inputs(70, 4, torch.bfloat16, seed=11)
    auto = _run(x, w, prefix, gy, gs, lay, True)
    for isa in VECTOR:  # AUTO takes the vector rows for bf16 (the table serves it natively)
        assert all(_bits_equal(u, v) for u, v in zip(auto, _run(x, w, prefix, gy, gs, lay, True, isa=isa)))
    for isa in ALL_ISAS:
        if isa in RUNNABLE:
            continue
        with pytest.raises(maskpack.Error) as e:
            maskpack.causal_conv1d(x, w, lay, prefix=prefix, isa=isa)
        assert e.value.status == "MASKPACK_ERR_UNSUPPORTED"
        monkeypatch.setenv("MASKPACK_ISA", isa)
        with pytest.raises(maskpack.Error) as e:
            maskpack.causal_conv1d(x, w, lay, prefix=prefix)
        assert e.value.status == "MASKPACK_ERR_UNSUPPORTED"
        monkeypatch.delenv("MASKPACK_ISA")
