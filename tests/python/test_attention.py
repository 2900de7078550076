"""maskpack.attention: fused CPU attention over layouts, against torch.

Checks: a float64 torch reference whose mask is the test's own predicate (_reference.allowed, from
the header's rule formula, not the library's mask4d) for every kernel this CPU has, f32 and bf16
(bf16 outputs in units in the last place of bf16; bf16 gradients against a reference backward fed
the kernel's own out and lse), padded / left-padded / packed / packed-row / cross / window / span+prefix
layouts, GQA, softcap); torch's scaled_dot_product_attention on padded batches with the equivalent
dense mask; packed == padded bitwise in f32; varlen == each sequence alone; gradients against
torch autograd (and a small torch model training through the autograd wrapper); NaN planted in
padding never reaches an output; bad input raises maskpack.Error.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import maskpack

import _reference as ref

torch.manual_seed(0)


def _isa_resolves(name):
    """Whether this machine runs the attention kernel ``name`` (forced through MASKPACK_ISA, it must be
    the one bfloat16 resolves to; one it lacks must be an UNSUPPORTED error)."""
    import os

    old = os.environ.get("MASKPACK_ISA")
    try:
        os.environ["MASKPACK_ISA"] = name
        assert maskpack.attention_isa("bfloat16") == name
        return True
    except maskpack.Error as e:
        assert e.status == "MASKPACK_ERR_UNSUPPORTED"
        return False
    finally:
        if old is None:
            os.environ.pop("MASKPACK_ISA", None)
        else:
            os.environ["MASKPACK_ISA"] = old


def available_isas():
    """The kernels this machine runs (a forced one it lacks must be an UNSUPPORTED error)."""
    return [name for name in ("ref", "avx2", "avx512", "amx") if _isa_resolves(name)]


ISAS = available_isas()


def test_isa_names():
    assert ISAS[0] == "ref"
    assert maskpack.attention_isa() in ISAS


def test_isa_auto_order(monkeypatch):
    """Unforced: avx512 > avx2 > ref for float32; bfloat16 adds amx on top."""
    monkeypatch.delenv("MASKPACK_ISA", raising=False)
    best32 = "avx512" if "avx512" in ISAS else "avx2" if "avx2" in ISAS else "ref"
    assert maskpack.attention_isa("float32") == best32
    assert maskpack.attention_isa("bfloat16") == ("amx" if "amx" in ISAS else best32)
    monkeypatch.setenv("MASKPACK_ISA", "sse9")
    with pytest.raises(maskpack.Error) as e:
        maskpack.attention_isa("float32")
    assert e.value.status == "MASKPACK_ERR_INVALID_ARGUMENT" and "avx2" in str(e.value)


def grid(x, layout):
    """[T,H,D] of a packed layout -> [1,T,H,D]; padded tensors unchanged."""
    return x.unsqueeze(0) if layout.packed else x


def ref_attention(q, k, v, keep, scale, softcap=0.0):
    """float64 masked attention: q [B,S,Hq,D], k, v [B,Skv,Hkv,D], keep [B,1,S,Skv] bool ->
    out [B,S,Hq,D], lse [B,Hq,S]; rows that see nothing give 0 and -inf. Differentiable."""
    g = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(g, dim=2)
    v = v.repeat_interleave(g, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    keep = keep.expand(s.shape)
    any_row = keep.any(-1, keepdim=True)
    s_m = torch.where(keep, s, torch.tensor(-math.inf, dtype=s.dtype))
    lse = torch.logsumexp(s_m.detach(), -1)
    p = torch.softmax(torch.where(any_row, s_m, torch.zeros_like(s)), -1) * keep
    out = torch.einsum("bhij,bjhd->bihd", p, v)
    return out, lse


def keep_mask(layout):
    """[B,1,S,Skv] bool from the test's own predicate over the layout's segments and rule."""
    a = ref.allowed(layout.segments, layout.rule, layout.n_rows, layout.q_width, layout.kv_width)
    return torch.from_numpy(a)[:, None]


def _cpu_vendor():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


# bf16 forwards that round the softmax weights P to bf16 before the P V product: AVX512-BF16 (the
# avx512 ISA on a CPU whose bf16 dot products pay: AMD's; Intel's run them at half the f32 FMA rate,
# so there bf16 is widened to f32) and AMX. The others compute in f32 and round the output once. Whether
# the library runs AVX512-BF16 is its own answer (the emulated-AMX extension of
# tools/test_python_emulated_amx.sh runs it on any CPU, an AMD Zen 3 included); the vendor is the CPU's.
P_ROUNDED = {"amx"} | ({"avx512"} if _isa_resolves("avx512_bf16") and _cpu_vendor() == "AuthenticAMD" else set())

# kernels this CPU cannot run: a skip each below, and conftest.py names them in the run's summary
NOT_RUN_ON_THIS_CPU = ["attention " + k for k in ("avx2", "avx512", "amx") if k not in ISAS] + (
    ["attention avx512bf16 (bf16 forward)"] if "avx512" in ISAS and "avx512" not in P_ROUNDED else [])


@pytest.mark.parametrize("isa", ["avx2", "avx512", "avx512bf16", "amx"])
def test_kernel_runs_here_or_is_reported(isa, monkeypatch):
    """Each vector kernel is checked by every test above on a CPU that has it; on one that lacks it
    the loops run without it, and this says so (a skip with its reason, and the summary line)."""
    name = "attention " + isa + (" (bf16 forward)" if isa == "avx512bf16" else "")
    if name in NOT_RUN_ON_THIS_CPU:
        pytest.skip(f"{name} NOT RUN: this CPU lacks its ISA")
    monkeypatch.setenv("MASKPACK_ISA", "avx512" if isa == "avx512bf16" else isa)
    assert maskpack.attention_isa("bfloat16") == ("avx512" if isa == "avx512bf16" else isa)
    assert isa in ISAS or isa == "avx512bf16"

# Bounds, from the errors measured on a Zen 4 (ref, avx2, avx512 with AVX512-BF16): a bf16 output
# rounded once is within 0.75 ulp of the exact value (measured 0.54: 0.5 is the rounding; under the
# 1 ulp a truncating store can be off); a P-rounding forward within 1 ulp plus 1.5 times
# 2^-8 sum_j P_j |v_j| (measured 0.69) and its lse within 2e-3 (measured 1.0e-3); bf16 gradients
# within 0.75 ulp of the reference backward on the kernel's own out and lse (measured 0.53).
BF16_OUT_ULPS = 0.75
P_ROUNDED_UNITS = 1.5
BF16_GRAD_ULPS = 0.75


def bf16_ulp(x):
    """One unit in the last place of bf16 (8 significant bits) at |x| (float64 tensor)."""
    _, e = torch.frexp(x.abs())
    return torch.ldexp(torch.ones_like(x), e - 8)


def bf16_ulps(got, want):
    """max |got - want| in bf16 ulps of max(|want|, rms(want) / 64) (values that cancel below the floor
    are held to the floor's ulp: the f32 sums before the rounding are only that exact)."""
    got, want = got.double(), want.double()
    floor = want.pow(2).mean().sqrt() / 64 if want.numel() else torch.tensor(0.0, dtype=torch.float64)
    scale = bf16_ulp(torch.maximum(want.abs(), torch.clamp(floor, min=1e-30).expand_as(want)))
    err = (got - want).abs() / scale
    return float(err.max()) if err.numel() else 0.0


def assert_bf16_forward(got, want, absout, isa):
    """A bf16 out against the exact one: 0.75 ulp, or for a P-rounding kernel 1 ulp + 1.5 P-roundings."""
    got, want = got.double(), want.double()
    assert torch.isfinite(got).all()
    if isa in P_ROUNDED:
        excess = ((got - want).abs() - bf16_ulp(want)).clamp(min=0)
        units = float((excess / (absout * 2.0 ** -8 + 1e-30)).max()) if got.numel() else 0.0
        assert units <= P_ROUNDED_UNITS, (isa, units)
    else:
        e = bf16_ulps(got, want)
        assert e <= BF16_OUT_ULPS, (isa, e)


# bf16 backwards that round P and dS to bf16 as operands of dQ, dK, dV (AVX512-BF16 by name; AMX,
# also under AUTO): within one ulp plus 1.5 * 2^-8 of the sum of each gradient's terms' magnitudes (the
# rounding of the terms alone is 0.5 of that; tests/c/test_attention.c derives the same bound).
PAIR_BWD = {"amx", "avx512_bf16"}
PAIR_UNITS = 1.5


def assert_bf16_grads(grads, layout, dout, q, k, v, out, lse, keep, scale, isa):
    """bf16 gradients (dq, dk, dv in the layout) against the float64 backward on the kernel's own out and
    lse (lse already in the grid's [B,Hq,S] form): 0.75 ulp, or for a pair-rounding kernel (PAIR_BWD)
    one ulp plus PAIR_UNITS * 2^-8 sum |terms|; values under rms / 64 are held to that floor."""
    g = [grid(x, layout) for x in (dout, q, k, v, out)]
    want, terms = ref_backward(*g, lse, keep, scale, terms=True)
    for got, w, t, name in zip(grads, want, terms, ("dq", "dk", "dv")):
        got = grid(got, layout).double()
        assert torch.isfinite(got).all(), (isa, name)
        if isa not in PAIR_BWD:
            e = bf16_ulps(got, w)
            assert e <= BF16_GRAD_ULPS, (isa, name, e)
            continue
        floor = w.pow(2).mean().sqrt() / 64
        excess = ((got - w).abs() - bf16_ulp(torch.maximum(w.abs(), floor.expand_as(w)))).clamp(min=0)
        units = float((excess / (torch.maximum(t, floor.expand_as(t)) * 2.0 ** -8)).max())
        assert units <= PAIR_UNITS, (isa, name, units)


def ref_backward(dout, q, k, v, out, lse, keep, scale, softcap=0.0, terms=False):
    """float64 gradients of masked attention given the forward's out [B,S,Hq,D] and lse [B,Hq,S] (those
    a kernel wrote: the backward is a function of them). Rows with lse = -inf have no gradient. With
    terms, also the sums of the magnitudes of each gradient's terms: ((dq, dk, dv), (|dq|, |dk|, |dv|))."""
    q, k, v, dout, out, lse = (x.double() for x in (q, k, v, dout, out, lse))
    g = q.shape[2] // k.shape[2]
    kr, vr = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, kr) * scale
    t = None
    if softcap:
        t = torch.tanh(s / softcap)
        s = softcap * t
    keep = keep.expand(s.shape) & torch.isfinite(lse)[..., None]
    p = torch.where(keep, torch.exp(s - torch.where(torch.isfinite(lse), lse, 0)[..., None]), 0)
    delta = torch.einsum("bihd,bihd->bhi", dout, out)
    dp = torch.einsum("bihd,bjhd->bhij", dout, vr)
    ds = p * (dp - delta[..., None])
    if softcap:
        ds = ds * (1 - t * t)
    dq = torch.einsum("bhij,bjhd->bihd", ds, kr) * scale
    dk = torch.einsum("bhij,bihd->bjhd", ds, q) * scale
    dv = torch.einsum("bhij,bihd->bjhd", p, dout)
    sh = k.shape
    heads = lambda x: x.reshape(sh[0], sh[1], sh[2], g, sh[3]).sum(3)  # noqa: E731 (key heads' sums)
    if not terms:
        return dq, heads(dk), heads(dv)
    # the sizes of each gradient's terms: what a backward that rounds P and dS moves by 2^-9 each
    t_dq = torch.einsum("bhij,bjhd->bihd", ds.abs(), kr.abs()) * scale
    t_dk = torch.einsum("bhij,bihd->bjhd", ds.abs(), q.abs()) * scale
    t_dv = torch.einsum("bhij,bihd->bjhd", p, dout.abs())
    return (dq, heads(dk), heads(dv)), (t_dq, heads(t_dk), heads(t_dv))


def abs_out(q, k, v, keep, scale, softcap=0.0):
    """sum_j P_j |v_j| [B,S,Hq,D] (the size of the terms a P-rounding kernel rounds)."""
    g = q.shape[2] // k.shape[2]
    av = torch.abs(v.double()).repeat_interleave(g, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k.double().repeat_interleave(g, dim=2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    kp = keep.expand(s.shape)
    s = torch.where(kp, s, -math.inf)
    p = torch.where(kp.any(-1, keepdim=True), torch.softmax(torch.where(kp.any(-1, keepdim=True), s, 0), -1), 0) * kp
    return torch.einsum("bhij,bjhd->bihd", p, av)


def rand_qkv(layout, hq, hkv, d, dtype=torch.float32):
    if layout.packed:
        sq, sk = (layout.q_width,), (layout.kv_width,)
    else:
        sq, sk = (layout.n_rows, layout.q_width), (layout.n_rows, layout.kv_width)
    q = torch.randn(*sq, hq, d).to(dtype)
    k = torch.randn(*sk, hkv, d).to(dtype)
    v = torch.randn(*sk, hkv, d).to(dtype)
    return q, k, v


LAYOUTS = {
    "padded": lambda: maskpack.Layout.from_lengths([70, 0, 1, 49], placement="right"),
    "left": lambda: maskpack.Layout.from_lengths([33, 64], placement="left"),
    "packed-bidir": lambda: maskpack.Layout.from_lengths([97, 47], placement="packed", causal=False),
    "packed-rows": lambda: maskpack.Layout.from_lengths([20, 31, 5, 40], placement="packed", capacity=64),
    "window": lambda: maskpack.Layout.from_lengths([90, 30], placement="packed", window=(10, 0)),
    "span-prefix": lambda: maskpack.Layout.from_lengths(
        [80, 12], placement="packed", spans=[(0, 10, 50)], prefix=[5, 3]
    ),
    "cross": lambda: maskpack.Layout.from_cu_seqlens([0, 40, 50], cu_kv=[0, 20, 70], alignment="bottom_right"),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vs_float64_reference(name, dtype, monkeypatch):
    layout = LAYOUTS[name]()
    q, k, v = rand_qkv(layout, 4, 2, 64, dtype)
    keep = keep_mask(layout)
    ref_out, ref_lse = ref_attention(grid(q, layout).double(), grid(k, layout).double(), grid(v, layout).double(),
                                     keep, 0.125)
    absout = abs_out(grid(q, layout), grid(k, layout), grid(v, layout), keep, 0.125)
    for isa in ISAS:
        monkeypatch.setenv("MASKPACK_ISA", isa)
        out, lse = maskpack.attention(q, k, v, layout, scale=0.125)
        assert out.dtype == dtype and out.shape == q.shape and lse.dtype == torch.float32
        out = grid(out, layout).double()
        lse = lse.unsqueeze(0) if layout.packed else lse
        if dtype == torch.float32:
            torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
        else:
            assert_bf16_forward(out, ref_out, absout, isa)
        tol = 2e-3 if dtype == torch.bfloat16 and isa in P_ROUNDED else 1e-6
        empty = torch.isinf(ref_lse)
        assert torch.equal(torch.isinf(lse), empty)
        torch.testing.assert_close(lse.double()[~empty], ref_lse[~empty], atol=tol, rtol=tol)
        # rows that see nothing: exactly 0
        rows = empty.transpose(1, 2)  # [B,S,H]
        assert torch.all(out[rows] == 0)


def test_softcap_against_reference():
    layout = maskpack.Layout.from_lengths([60, 100], placement="packed")
    q, k, v = rand_qkv(layout, 2, 1, 32)
    q = q * 3
    out, lse = maskpack.attention(q, k, v, layout, softcap=5.0)
    ref, ref_lse = ref_attention(grid(q, layout).double(), grid(k, layout).double(), grid(v, layout).double(),
                                 keep_mask(layout), 1 / math.sqrt(32), softcap=5.0)
    torch.testing.assert_close(grid(out, layout).double(), ref, atol=2e-5, rtol=2e-5)


def test_vs_sdpa_padded_batch():
    """torch SDPA on the padded batch with the equivalent dense bool mask (valid tokens)."""
    layout = maskpack.Layout.from_lengths([100, 37, 64], placement="right")
    q, k, v = rand_qkv(layout, 4, 4, 64)
    keep = keep_mask(layout)
    out, _ = maskpack.attention(q, k, v, layout)
    # SDPA takes [B,H,S,D]; a fully masked (pad) row is undefined there, so only valid rows compare
    sd = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                        attn_mask=keep).transpose(1, 2)
    valid = torch.as_tensor(np.asarray(layout.mask2d()))
    torch.testing.assert_close(out[valid], sd[valid], atol=2e-5, rtol=2e-5)
    assert torch.all(out[~valid] == 0)


def test_packed_equals_padded_bitwise(monkeypatch):
    lens = [130, 1, 49, 96]
    packed = maskpack.Layout.from_lengths(lens, placement="packed")
    padded = maskpack.Layout.from_lengths(lens, placement="right", capacity=160)
    q, k, v = rand_qkv(packed, 2, 1, 64)
    valid = torch.as_tensor(np.asarray(padded.mask2d()))
    def to_padded(x):
        y = torch.full((4, 160) + tuple(x.shape[1:]), float("nan"))  # NaN in the padding
        y[valid] = x
        return y
    for isa in ISAS:
        monkeypatch.setenv("MASKPACK_ISA", isa)
        op, lp = maskpack.attention(q, k, v, packed)
        od, ld = maskpack.attention(to_padded(q), to_padded(k), to_padded(v), padded)
        assert torch.equal(od[valid], op)
        assert torch.equal(ld.transpose(1, 2)[valid], lp.t())
        assert torch.all(od[~valid] == 0)


def test_varlen_equals_each_sequence_alone():
    lens = [77, 3, 128, 50]
    layout = maskpack.Layout.from_lengths(lens, placement="packed")
    q, k, v = rand_qkv(layout, 4, 2, 64)
    out, lse = maskpack.attention(q, k, v, layout)
    start = 0
    for n in lens:
        alone = maskpack.Layout.from_lengths([n], placement="packed")
        o1, l1 = maskpack.attention(q[start:start + n], k[start:start + n], v[start:start + n], alone)
        assert torch.equal(o1, out[start:start + n])
        assert torch.equal(l1, lse[:, start:start + n])
        start += n


@pytest.mark.parametrize("name", ["padded", "packed-rows", "span-prefix", "cross", "window"])
def test_gradients_vs_torch_autograd(name, monkeypatch):
    layout = LAYOUTS[name]()
    q, k, v = rand_qkv(layout, 4, 2, 32)
    dout = torch.randn_like(q)
    qd, kd, vd = (grid(x, layout).double().requires_grad_(True) for x in (q, k, v))
    ref_out, _ = ref_attention(qd, kd, vd, keep_mask(layout), 0.2)
    ref_out.backward(grid(dout, layout).double())
    for isa in ISAS:
        monkeypatch.setenv("MASKPACK_ISA", isa)
        qa, ka, va = (x.clone().requires_grad_(True) for x in (q, k, v))
        out, lse = maskpack.attention(qa, ka, va, layout, scale=0.2)
        assert out.requires_grad and not lse.requires_grad
        out.backward(dout)
        for got, want in ((qa.grad, qd.grad), (ka.grad, kd.grad), (va.grad, vd.grad)):
            torch.testing.assert_close(grid(got, layout).double(), want, atol=5e-5, rtol=5e-5)
        # the explicit backward gives the same
        o2, l2 = maskpack.attention(q, k, v, layout, scale=0.2)
        dq, dk, dv = maskpack.attention_backward(dout, q, k, v, o2, l2, layout, scale=0.2)
        assert torch.equal(dq, qa.grad) and torch.equal(dk, ka.grad) and torch.equal(dv, va.grad)


@pytest.mark.parametrize("isa", ISAS)
def test_bf16_gradients(isa, monkeypatch):
    """bf16 gradients within 0.75 ulp of the float64 backward on the kernel's own out and lse
    (measured 0.53): a gradient 5% off, or truncated instead of rounded, fails."""
    monkeypatch.setenv("MASKPACK_ISA", isa)
    layout = maskpack.Layout.from_lengths([50, 70], placement="packed")
    q, k, v = rand_qkv(layout, 4, 2, 64, torch.bfloat16)
    dout = torch.randn_like(q)
    out, lse = maskpack.attention(q, k, v, layout, scale=0.125)
    dq, dk, dv = maskpack.attention_backward(dout, q, k, v, out, lse, layout, scale=0.125)
    assert dq.dtype == torch.bfloat16
    assert_bf16_grads((dq, dk, dv), layout, dout, q, k, v, out, lse.unsqueeze(0), keep_mask(layout), 0.125, isa)


def test_nan_in_padding_never_reaches_outputs():
    layout = maskpack.Layout.from_lengths([40, 100, 7], placement="left")
    q, k, v = rand_qkv(layout, 2, 1, 64)
    dout = torch.randn_like(q)
    valid = torch.as_tensor(np.asarray(layout.mask2d()))
    clean = maskpack.attention(q, k, v, layout)
    gclean = maskpack.attention_backward(dout, q, k, v, clean[0], clean[1], layout)
    for x in (q, k, v, dout):
        x[~valid] = float("nan")
    out, lse = maskpack.attention(q, k, v, layout)
    assert torch.equal(out[valid], clean[0][valid])
    assert torch.all(out[~valid] == 0)
    assert torch.all(torch.isinf(lse.transpose(1, 2)[~valid]))
    out_nan = out.clone()
    out_nan[~valid] = float("nan")
    dq, dk, dv = maskpack.attention_backward(dout, q, k, v, out_nan, lse, layout)
    for got, want in zip((dq, dk, dv), gclean):
        assert torch.equal(got[valid], want[valid])
        assert torch.all(got[~valid] == 0)


def test_numpy_in_numpy_out():
    layout = maskpack.Layout.from_lengths([30, 20], placement="packed")
    q, k, v = (x.numpy() for x in rand_qkv(layout, 2, 2, 16))
    out, lse = maskpack.attention(q, k, v, layout)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and lse.shape == (2, 50)
    ref, _ = ref_attention(*(torch.from_numpy(x).unsqueeze(0).double() for x in (q, k, v)), keep_mask(layout),
                           0.25)
    np.testing.assert_allclose(out, ref[0].numpy(), atol=1e-5)
    dq, dk, dv = maskpack.attention_backward(np.ones_like(out), q, k, v, out, lse, layout)
    assert isinstance(dq, np.ndarray) and dk.shape == k.shape


def test_out_argument_and_strided_inputs():
    layout = maskpack.Layout.from_lengths([64, 40], placement="packed")
    qkv = torch.randn(104, 3, 2, 32)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # token stride 3*2*32, not contiguous
    out = torch.empty(104, 2, 32)
    got, _ = maskpack.attention(q, k, v, layout, out=out)
    assert got is out
    want, _ = maskpack.attention(q.contiguous(), k.contiguous(), v.contiguous(), layout)
    assert torch.equal(out, want)


def test_bad_input_raises():
    layout = maskpack.Layout.from_lengths([10, 5], placement="packed")
    q, k, v = rand_qkv(layout, 2, 2, 16)
    with pytest.raises(maskpack.Error) as e:
        maskpack.attention(q, k, v, layout, scale=float("nan"))
    assert e.value.status == "MASKPACK_ERR_INVALID_ARGUMENT" and e.value.argument == "scale"
    with pytest.raises(maskpack.Error) as e:
        maskpack.attention(q, k[:, :1].repeat(1, 3, 1), v[:, :1].repeat(1, 3, 1), layout)
    assert e.value.status == "MASKPACK_ERR_SHAPE"
    with pytest.raises(maskpack.Error) as e:
        maskpack.attention(q, k.bfloat16(), v, layout)
    assert e.value.status == "MASKPACK_ERR_DTYPE"
    with pytest.raises(maskpack.Error) as e:
        maskpack.attention(q[:14], k[:14], v[:14], layout)
    assert e.value.status == "MASKPACK_ERR_SHAPE"
    with pytest.raises(maskpack.Error) as e:
        maskpack.attention(q, k, v, layout, softcap=-1.0)
    assert e.value.status == "MASKPACK_ERR_INVALID_ARGUMENT"
    with pytest.raises(TypeError):
        maskpack.attention(q, k, v, "not a layout")


def test_torch_model_trains_through_autograd():
    """A one-layer attention model on packed documents learns to copy its input (loss falls), and
    its gradients equal those of the same model on torch SDPA with the dense mask."""
    torch.manual_seed(1)
    layout = maskpack.Layout.from_lengths([24, 40, 16], placement="packed")
    keep = keep_mask(layout)
    T, E, H, D = 80, 32, 2, 16

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(E, 3 * H * D)
            self.o = torch.nn.Linear(H * D, E)

        def forward(self, x, use_sdpa=False):
            q, k, v = self.qkv(x).view(T, 3, H, D).unbind(1)
            if use_sdpa:
                a = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                   v.transpose(0, 1)[None], attn_mask=keep)[0].transpose(0, 1)
            else:
                a = maskpack.attention_autograd(q, k, v, layout)
            return self.o(a.reshape(T, H * D))

    model = Block()
    x = torch.randn(T, E)
    # gradients against SDPA
    model.zero_grad()
    model(x).square().mean().backward()
    g1 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x, use_sdpa=True).square().mean().backward()
    for a, b in zip(g1, (p.grad for p in model.parameters())):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    # training
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(40):
        opt.zero_grad()
        loss = (model(x) - x).square().mean()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < 0.5 * first


def test_read_only_out_is_refused_untouched():
    lay = maskpack.Layout.from_lengths([3, 2])
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 2, 16)).astype(np.float32) for _ in range(3))
    out = np.full((2, 3, 2, 16), 4.0, dtype=np.float32)
    out.setflags(write=False)
    with pytest.raises(TypeError, match="writable"):
        maskpack.attention(q, k, v, lay, out=out)
    assert (out == 4.0).all()


VECTOR_ISAS = [i for i in ISAS if i in ("avx2", "avx512")]


@pytest.mark.skipif(not VECTOR_ISAS, reason="no AVX2 or AVX-512 on this CPU")
@pytest.mark.parametrize("D", [64, 128, 72, 129, 200, 256])
@pytest.mark.parametrize("rule", ["causal", "bidirectional", "window", "span-prefix", "cross"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vector_kernels_vs_reference_head_dims(D, rule, dtype, monkeypatch):
    """The AVX2 / AVX-512 f32 kernels (bf16 widened) against the float64 reference, forward and
    backward, for head dims 64, 128 and odd ones up to 256, under every kind of rule."""
    lens = [70, 1, 130]
    if rule == "cross":
        layout = maskpack.Layout.from_cu_seqlens([0, 40, 50], cu_kv=[0, 20, 70], alignment="bottom_right")
    elif rule == "span-prefix":
        layout = LAYOUTS["span-prefix"]()
    elif rule == "window":
        layout = maskpack.Layout.from_lengths(lens, placement="packed", window=(17, 5))
    else:
        layout = maskpack.Layout.from_lengths(lens, placement="packed", causal=(rule == "causal"))
    q, k, v = rand_qkv(layout, 2, 1, D, dtype)
    dout = torch.randn_like(q)
    scale = 1 / math.sqrt(D)
    qd, kd, vd = (grid(x, layout).double().requires_grad_(True) for x in (q, k, v))
    ref_out, ref_lse = ref_attention(qd, kd, vd, keep_mask(layout), scale)
    ref_out.backward(grid(dout, layout).double())
    keep = keep_mask(layout)
    absout = abs_out(grid(q, layout), grid(k, layout), grid(v, layout), keep, scale)
    for isa in VECTOR_ISAS:
        monkeypatch.setenv("MASKPACK_ISA", isa)
        out, lse = maskpack.attention(q, k, v, layout, scale=scale)
        dq, dk, dv = maskpack.attention_backward(dout, q, k, v, out, lse, layout, scale=scale)
        if dtype == torch.float32:
            torch.testing.assert_close(grid(out, layout).double(), ref_out.detach(), atol=2e-5, rtol=2e-5)
            for got, want in ((dq, qd.grad), (dk, kd.grad), (dv, vd.grad)):
                torch.testing.assert_close(grid(got, layout).double(), want, atol=1e-4, rtol=1e-4)
        else:
            assert_bf16_forward(grid(out, layout), ref_out.detach(), absout, isa)
            assert_bf16_grads((dq, dk, dv), layout, dout, q, k, v, out, lse.unsqueeze(0) if layout.packed else lse,
                              keep, scale, isa)


@pytest.mark.skipif(not {"avx2", "avx512"} <= set(ISAS), reason="needs both the AVX2 and AVX-512 kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_avx2_equals_avx512_bitwise(dtype, monkeypatch):
    """The AVX2 kernels are the AVX-512 f32 kernels compiled through a lane-exact shim with the same
    summation orders: forward and backward outputs are bitwise equal (bf16: against plain AVX-512
    widening, so only where the bf16 forward is not on AVX512-BF16 or AMX: backward always)."""
    for name in ("padded", "window", "span-prefix", "cross"):
        layout = LAYOUTS[name]()
        q, k, v = rand_qkv(layout, 4, 2, 96, dtype)
        dout = torch.randn_like(q)
        res = {}
        for isa in ("avx2", "avx512"):
            monkeypatch.setenv("MASKPACK_ISA", isa)
            out, lse = maskpack.attention(q.float(), k.float(), v.float(), layout, scale=0.1)
            grads = maskpack.attention_backward(dout, q, k, v, out.to(dtype), lse, layout, scale=0.1)
            res[isa] = (out, lse) + tuple(grads)
        for a, b in zip(res["avx2"], res["avx512"]):
            assert torch.equal(a, b)


# ---- the operator kept per layout ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
def test_operator_is_kept_per_layout_and_gives_the_plain_calls_bits(monkeypatch, dtype, threads):
    """attention plans a layout once: one C operator per (heads, head dim, dtype, threads,
    MASKPACK_ISA) in the layout's cache, reused by the next call and by the backward, with the bits of
    the plain per-call path (out, lse and the gradients)."""
    import sys

    attn_mod = sys.modules["maskpack._attention"]  # the module behind maskpack.attention
    lengths = [64, 64, 1, 70]
    lay = maskpack.Layout.from_lengths(lengths, placement="packed")
    g = torch.Generator().manual_seed(7)
    T = sum(lengths)
    xs = [torch.randn(T, h, 32, generator=g).to(dtype) for h in (4, 2, 2)]

    def run():
        leaves = [x.clone().requires_grad_(True) for x in xs]
        out, lse = maskpack.attention(*leaves, lay, threads=threads)
        out.float().square().sum().backward()
        return out.detach(), lse, [x.grad for x in leaves]

    def ops():
        return {k: v for k, v in (lay._cache or {}).items() if isinstance(k, tuple) and k[0] == "attention_op"}

    o1, l1, g1 = run()
    first = ops()
    assert len(first) == 1
    o2, l2, g2 = run()
    assert ops() == first and all(ops()[k] is first[k] for k in first)  # the same operator object
    monkeypatch.setattr(attn_mod, "_op", lambda *a: None)  # the plain calls
    o3, l3, g3 = run()
    for a, b, c in zip((o1, l1, *g1), (o2, l2, *g2), (o3, l3, *g3)):
        assert torch.equal(a, b) and torch.equal(a, c)
    monkeypatch.undo()
    # another thread count or MASKPACK_ISA is another operator
    maskpack.attention(*xs, lay, threads=3 - threads)
    assert len(ops()) == 2
    monkeypatch.setenv("MASKPACK_ISA", "ref")
    o4, _ = maskpack.attention(*xs, lay, threads=threads)
    assert len(ops()) == 3
    assert (o4.float() - o1.float()).abs().max() < (1e-4 if dtype == torch.float32 else 0.05)


def test_shapes_no_operator_takes_are_named_by_the_plain_call():
    """Query heads that are not a multiple of the key heads make no operator: the call still raises
    the plain call's error naming the argument, and nothing is cached."""
    lay = maskpack.Layout.from_lengths([8, 8], placement="packed")
    q, k = torch.randn(16, 3, 16), torch.randn(16, 2, 16)
    with pytest.raises(maskpack.Error) as e:
        maskpack.attention(q, k, k, lay)
    assert e.value.status == "MASKPACK_ERR_SHAPE" and e.value.argument == "k"
    assert not any(isinstance(key, tuple) and key[0] == "attention_op" for key in (lay._cache or {}))


@pytest.mark.parametrize("isa", sorted(PAIR_BWD))
def test_bf16_pair_backward(isa):
    """The backwards on bf16 pairs (P and dS rounded to bf16 as operands: AVX512-BF16 by name, AMX):
    through autograd their gradients are the explicit backward's bit for bit, differ from the widened
    AVX-512 kernel's (the pair kernel ran), and stay within assert_bf16_grads' pair bound."""
    if not _isa_resolves(isa):
        pytest.skip(f"attention {isa} NOT RUN: this CPU lacks its ISA")
    layout = maskpack.Layout.from_lengths([50, 97], placement="packed", causal=True)
    q, k, v = rand_qkv(layout, 4, 2, 64, torch.bfloat16)
    dout = torch.randn_like(q)
    qa, ka, va = (x.clone().requires_grad_(True) for x in (q, k, v))
    out, lse = maskpack.attention(qa, ka, va, layout, scale=0.125, isa=isa)
    out.backward(dout)
    o2, l2 = maskpack.attention(q, k, v, layout, scale=0.125, isa=isa)
    grads = maskpack.attention_backward(dout, q, k, v, o2, l2, layout, scale=0.125, isa=isa)
    for a, b in zip((qa.grad, ka.grad, va.grad), grads):
        assert torch.equal(a, b)
    widened = maskpack.attention_backward(dout, q, k, v, o2, l2, layout, scale=0.125, isa="avx512")
    assert any(not torch.equal(a, b) for a, b in zip(grads, widened))
    assert_bf16_grads(grads, layout, dout, q, k, v, o2, l2.unsqueeze(0), keep_mask(layout), 0.125, isa)
