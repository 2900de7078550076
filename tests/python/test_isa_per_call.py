"""isa= on every kernel call (attention, Gated DeltaNet, causal conv1d): the kernel chosen per call is the
one MASKPACK_ISA would choose for the whole process (bit for bit), it overrides the variable, the
backward of an autograd call runs the forward's kernel, and bad names or ISAs this CPU lacks are refused
by name (issue 20, item 1)."""

import pytest
import torch

import maskpack

LAY = maskpack.Layout.from_lengths([5, 70, 3, 33], placement="packed")  # 70 tokens cross a 64-token chunk


def _gdn_inputs():
    g0 = torch.Generator().manual_seed(1)
    T = LAY.n_tokens
    q, k = torch.randn(T, 2, 32, generator=g0), torch.randn(T, 2, 32, generator=g0)
    v = torch.randn(T, 4, 16, generator=g0)
    g = -torch.rand(T, 4, generator=g0) * 0.3
    beta = torch.rand(T, 4, generator=g0)
    return q, k, v, g, beta


def _attn_inputs(dtype=torch.float32):
    g0 = torch.Generator().manual_seed(2)
    T = LAY.n_tokens
    return tuple(torch.randn(T, h, 64, generator=g0).to(dtype) for h in (4, 2, 2))


CALLS = {
    "attention": lambda isa: maskpack.attention(*_attn_inputs(), LAY, isa=isa)[0],
    "attention_bf16": lambda isa: maskpack.attention(*_attn_inputs(torch.bfloat16), LAY, isa=isa)[0],
    "gdn": lambda isa: maskpack.gated_delta_rule(*_gdn_inputs(), LAY, isa=isa)[0],
    "conv": lambda isa: maskpack.causal_conv1d(_gdn_inputs()[2].reshape(LAY.n_tokens, -1), torch.randn(
        64, 4, generator=torch.Generator().manual_seed(3)), LAY, isa=isa)[0],
}


def _runs(isa):
    try:
        CALLS["gdn"](isa)
        return True
    except maskpack.Error as e:
        assert e.status == "MASKPACK_ERR_UNSUPPORTED"
        return False


RUNNABLE = [i for i in ("ref", "avx2", "avx512", "avx512_bf16") if _runs(i)]


@pytest.mark.parametrize("family", sorted(CALLS))
@pytest.mark.parametrize("isa", RUNNABLE)
def test_per_call_isa_is_the_environment_choice(family, isa, monkeypatch):
    monkeypatch.delenv("MASKPACK_ISA", raising=False)
    per_call = CALLS[family](isa)
    monkeypatch.setenv("MASKPACK_ISA", isa)
    by_env = CALLS[family](None)
    assert torch.equal(per_call.view(torch.uint8), by_env.view(torch.uint8)) if per_call.dtype == torch.bfloat16 \
        else torch.equal(per_call, by_env)
    # the call's own choice wins over the variable
    monkeypatch.setenv("MASKPACK_ISA", "ref")
    again = CALLS[family](isa)
    assert torch.equal(again.float(), per_call.float())


def test_kernels_differ_where_they_should():
    """The choice is real: the reference and a vector kernel give different rounding on the GDN rule
    (if they were bitwise equal everywhere, the test above could not tell them apart)."""
    vec = [i for i in RUNNABLE if i != "ref"]
    if not vec:
        pytest.skip("this CPU runs the reference kernels only")
    a, b = CALLS["gdn"]("ref"), CALLS["gdn"](vec[-1])
    assert not torch.equal(a, b)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", RUNNABLE)
def test_autograd_backward_runs_the_forwards_kernel(isa):
    q, k, v = (x.clone().requires_grad_() for x in _attn_inputs())
    out = maskpack.attention(q, k, v, LAY, isa=isa)[0]
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    (out * do).sum().backward()
    o2, lse = maskpack.attention(q.detach(), k.detach(), v.detach(), LAY, isa=isa)
    dq, dk, dv = maskpack.attention_backward(do, q.detach(), k.detach(), v.detach(), o2, lse, LAY, isa=isa)
    assert torch.equal(q.grad, dq) and torch.equal(k.grad, dk) and torch.equal(v.grad, dv)
    xs = [x.clone().requires_grad_() for x in _gdn_inputs()]
    o, ht = maskpack.gated_delta_rule(*xs, LAY, isa=isa)
    (o.square().sum() + ht.sum()).backward()
    ys = [x.clone().requires_grad_() for x in _gdn_inputs()]
    o, ht = maskpack.gated_delta_rule(*ys, LAY, isa="ref")
    (o.square().sum() + ht.sum()).backward()
    for a, b in zip(xs, ys):  # the kernels agree to rounding; bitwise for the reference itself
        if isa == "ref":
            assert torch.equal(a.grad, b.grad)
        else:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_bad_isa_names_are_refused():
    for family, call in CALLS.items():
        with pytest.raises(maskpack.Error) as e:
            call("sse9")
        assert e.value.argument == "isa" and "expected one of auto, ref, avx512, avx2, avx512_bf16, amx" in str(e.value)
        with pytest.raises(TypeError, match="isa: expected None or one of"):
            call(2)
    # spelled as the header's names or their hyphenated form
    assert torch.equal(CALLS["gdn"]("AVX512-BF16" if "avx512_bf16" in RUNNABLE else "REF"),
                       CALLS["gdn"]("avx512_bf16" if "avx512_bf16" in RUNNABLE else "ref"))


@pytest.mark.parametrize("family", sorted(CALLS))
def test_an_isa_this_cpu_lacks_names_the_feature(family):
    missing = [i for i in ("avx2", "avx512", "amx") if not _runs(i) or (i == "amx" and not _amx())]
    if not missing:
        pytest.skip("this CPU runs every ISA")
    with pytest.raises(maskpack.Error) as e:
        CALLS[family](missing[-1])
    assert e.value.status == "MASKPACK_ERR_UNSUPPORTED"
    assert missing[-1] in str(e.value) and "lacks" in str(e.value)


def _amx():
    try:
        CALLS["attention_bf16"]("amx")
        return True
    except maskpack.Error:
        return False


def test_isa_with_group_is_refused():
    q, k, v = _attn_inputs()
    for call in (lambda: maskpack.attention(q, k, v, LAY, group=object(), isa="ref"),
                 lambda: maskpack.gated_delta_rule(*_gdn_inputs(), LAY, group=object(), isa="ref"),
                 lambda: maskpack.causal_conv1d(q.reshape(LAY.n_tokens, -1), torch.ones(256, 4), LAY, group=object(),
                                                isa="ref")):
        with pytest.raises(TypeError, match="isa= cannot be combined with group="):
            call()
