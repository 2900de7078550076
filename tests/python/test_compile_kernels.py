"""torch.compile over maskpack's kernels: attention, the gated delta rule, the causal conv1d, the GDN
gates and L2 norm run as torch custom ops with fake implementations and registered autograd
(maskpack._compile), so a compiled step traces them whole: torch._dynamo.explain reports no graph
break, and a fullgraph compile (aot_eager: the captured graph run without code generation) gives the
eager outputs and gradients bit for bit (the ops call the same C forward and backward)."""

import pytest
import torch

import maskpack
from maskpack import Layout


def _breaks(fn, *args):
    """Graph breaks of fn, which calls torch.autograd.grad: the backward is traced too (Dynamo's
    trace_autograd_ops), so a backward that cannot trace counts as well."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        e = torch._dynamo.explain(fn)(*args)
    return e.graph_break_count, [str(b.reason)[:200] for b in e.break_reasons]


def _same(fn, args, n_grad):
    """fn(*args) eager and compiled (fullgraph): outputs and gradients of the first n_grad args equal."""
    torch._dynamo.reset()
    ref = [a.detach().clone().requires_grad_() if i < n_grad else a for i, a in enumerate(args)]
    cmp = [a.detach().clone().requires_grad_() if i < n_grad else a for i, a in enumerate(args)]
    y_ref = fn(*ref)
    y = torch.compile(fn, fullgraph=True, backend="aot_eager")(*cmp)
    assert torch.equal(y, y_ref)
    g_ref = torch.autograd.grad(y_ref, ref[:n_grad])
    g = torch.autograd.grad(y, cmp[:n_grad])
    for a, b in zip(g, g_ref):
        assert torch.equal(a, b)
    return y


LAY = Layout.from_lengths([5, 3, 6], placement="packed")
PAD = Layout.from_lengths([5, 3, 6], placement="right")


def _attn(q, k, v, lay):
    out, lse = maskpack.attention(q, k, v, lay)
    return (out.square().sum() + maskpack.attention_autograd(q, k, v, lay).sum()
            + lse.masked_fill(torch.isinf(lse), 0).sum() * 0)


@pytest.mark.parametrize("lay", [LAY, PAD], ids=["packed", "padded"])
def test_attention_fwd_bwd_no_break_equals_eager(lay):
    torch.manual_seed(0)
    shape = (14, 4, 8) if lay.packed else (3, 6, 4, 8)
    kv = shape[:-2] + (2, 8)
    q, k, v = torch.randn(shape), torch.randn(kv), torch.randn(kv)
    q_, k_, v_ = (t.clone().requires_grad_() for t in (q, k, v))
    n, why = _breaks(lambda q, k, v: torch.autograd.grad(_attn(q, k, v, lay), (q, k, v)), q_, k_, v_)
    assert n == 0, why
    _same(lambda q, k, v: _attn(q, k, v, lay), (q, k, v), 3)


def _rule(q, k, v, g, beta, h0, lay):
    o, ht = maskpack.gated_delta_rule(q, k, v, g, beta, lay, initial_state=h0)
    return o.square().sum() + ht.sum() * 0.5


def _rule_inputs(lay, T=14):
    torch.manual_seed(1)
    lead = (T,) if lay.packed else (lay.n_rows, lay.q_width)
    q, k = torch.randn(*lead, 2, 8), torch.randn(*lead, 2, 8)
    v = torch.randn(*lead, 4, 8)
    g = -torch.rand(*lead, 4)
    beta = torch.rand(*lead, 4)
    h0 = torch.randn(lay.n_segments, 4, 8, 8)
    return q, k, v, g, beta, h0


@pytest.mark.parametrize("lay", [LAY, PAD], ids=["packed", "padded"])
def test_gated_delta_rule_fwd_bwd_no_break_equals_eager(lay):
    args = _rule_inputs(lay)
    grads = [a.clone().requires_grad_() for a in args]
    n, why = _breaks(lambda *a: torch.autograd.grad(_rule(*a, lay), a), *grads)
    assert n == 0, why
    _same(lambda *a: _rule(*a, lay), args, 6)
    # without an initial state (its gradient absent, not a 0-element tensor)
    _same(lambda q, k, v, g, b: _rule(q, k, v, g, b, None, lay), args[:5], 5)


def test_gated_delta_rule_compiled_keeps_the_gate_check():
    q, k, v, g, beta, h0 = _rule_inputs(LAY)
    g[3, 1] = 0.5  # a growing state: refused in the compiled graph as in eager
    torch._dynamo.reset()
    f = torch.compile(lambda *a: _rule(*a, LAY), fullgraph=True, backend="aot_eager")
    with pytest.raises(maskpack.Error) as e:
        f(q, k, v, g, beta, h0)
    assert e.value.argument == "g" and e.value.status == "MASKPACK_ERR_VALUE"


def _conv(x, w, prefix, lay):
    y, state = maskpack.causal_conv1d(x, w, lay, prefix=prefix)
    y2, _ = maskpack.causal_conv1d(x, w.unsqueeze(1), lay, activation=None)
    return y.square().sum() + state.sum() * 0.25 + y2.sum()


@pytest.mark.parametrize("lay", [LAY, PAD], ids=["packed", "padded"])
def test_causal_conv1d_fwd_bwd_no_break_equals_eager(lay):
    torch.manual_seed(2)
    lead = (14,) if lay.packed else (lay.n_rows, lay.q_width)
    x, w, p = torch.randn(*lead, 6), torch.randn(6, 4), torch.randn(lay.n_segments, 6, 3)
    grads = [a.clone().requires_grad_() for a in (x, w, p)]
    n, why = _breaks(lambda *a: torch.autograd.grad(_conv(*a, lay), a), *grads)
    assert n == 0, why
    _same(lambda *a: _conv(*a, lay), (x, w, p), 3)
    _same(lambda x, w: _conv(x, w, None, lay), (x, w), 2)


def test_gates_and_l2norm_no_break_equals_eager():
    from maskpack.gdn import gdn_gates, gdn_l2norm

    torch.manual_seed(3)
    a, b = torch.randn(14, 4), torch.randn(14, 4)
    A, dt, x = torch.randn(4), torch.randn(4), torch.randn(14, 2, 8)

    def f(a, b, A, dt, x):
        g, beta = gdn_gates(a, b, A, dt, LAY)
        return (g * beta).sum() + gdn_l2norm(x, LAY).square().mul(torch.arange(8.0)).sum()

    grads = [t.clone().requires_grad_() for t in (a, b, A, dt, x)]
    n, why = _breaks(lambda *t: torch.autograd.grad(f(*t), t), *grads)
    assert n == 0, why
    _same(f, (a, b, A, dt, x), 5)


# ---- a patched tiny Qwen3.5 (transformers) under torch.compile(fullgraph=True) ---------------------


def _qwen35(layer_types, seed=0):
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    from maskpack.gdn import patch_linear_attention

    torch.manual_seed(seed)
    cfg = Qwen3_5TextConfig(hidden_size=48, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                            linear_value_head_dim=8, linear_conv_kernel_dim=4, num_hidden_layers=len(layer_types),
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=32,
                            vocab_size=32, rms_norm_eps=1e-6, layer_types=list(layer_types))
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(cfg)
    return model


def _loss(model, ids, mask, lay, **extra):
    out = model(input_ids=ids, attention_mask=mask, maskpack_layout=lay, use_cache=False, **extra)
    return (out.logits.float().square().sum(-1) * mask).sum()


def _model_grads(model, fn, *args):
    model.zero_grad()
    loss = fn(model, *args)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_patched_qwen35_compiles_whole_and_equals_eager():
    from maskpack.gdn import patch_linear_attention

    model = _qwen35(["linear_attention", "full_attention", "linear_attention"])
    assert patch_linear_attention(model) == 2
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0, 0]])
    ids = torch.randint(0, 32, mask.shape, generator=torch.Generator().manual_seed(1))
    lay = Layout.from_mask2d(mask)
    n, why = _breaks(lambda: _loss(model, ids, mask, lay))
    assert n == 0, why
    loss_ref, g_ref = _model_grads(model, _loss, ids, mask, lay)
    torch._dynamo.reset()
    compiled = torch.compile(_loss, fullgraph=True, backend="aot_eager")
    loss, g = _model_grads(model, compiled, ids, mask, lay)
    assert g.keys() == g_ref.keys() and any("linear_attn" in k for k in g)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-6, atol=0)
    for name in g_ref:
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-5, atol=1e-7, msg=name)
    # the layout's agreement with the call's other forms is checked when the compiled graph runs
    with pytest.raises(maskpack.Error) as e:
        compiled(model, ids, mask, Layout.from_mask2d(mask.roll(1, 1)))
    assert e.value.argument == "attention_mask"


def test_patched_layer_under_compile_needs_a_layout():
    from maskpack.gdn import patch_linear_attention

    model = _qwen35(["linear_attention"])
    patch_linear_attention(model)
    ids = torch.randint(0, 32, (1, 6))
    torch._dynamo.reset()
    f = torch.compile(lambda ids, pos: model(input_ids=ids, position_ids=pos, use_cache=False).logits.sum(),
                      fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception) as e:
        f(ids, torch.tensor([[0, 1, 2, 0, 1, 2]]))
    assert "maskpack_layout" in str(e.value)


def test_inductor_with_strided_inputs():
    """inductor checks every custom op's real output strides against its fake's: the ops return
    contiguous outputs whatever the inputs' strides, and their fakes say so (a transposed q here)."""
    torch.manual_seed(4)
    q = torch.randn(4, 14, 8).transpose(0, 1)  # [14, 4, 8], not contiguous
    k, v = torch.randn(14, 2, 8), torch.randn(14, 2, 8)
    x, w = torch.randn(8, 14).t(), torch.randn(8, 4)  # [14, 8], not contiguous

    def f(q, k, v, x, w):
        out, _ = maskpack.attention(q, k, v, LAY)
        y, st = maskpack.causal_conv1d(x, w, LAY)
        o, ht = maskpack.gated_delta_rule(q[:, :2], k, v.repeat(1, 2, 1), -y[:, :4].sigmoid(), y[:, 4:].sigmoid(), LAY)
        return out.square().sum() + st.sum() + o.square().sum() + ht.sum()

    args = [t.clone().requires_grad_() for t in (q, k, v, x, w)]
    ref = [t.detach().clone().requires_grad_() for t in (q, k, v, x, w)]
    torch._dynamo.reset()
    y = torch.compile(f, fullgraph=True)(*args)
    y_ref = f(*ref)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(torch.autograd.grad(y, args), torch.autograd.grad(y_ref, ref)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_opcheck_every_kernel_op():
    """torch.library.opcheck: each op's schema, fake implementation, autograd registration and its run
    under AOT dispatch with dynamic shapes agree with the real op."""
    from maskpack import _compile as C

    torch.manual_seed(5)
    key = id(LAY)

    def r(*s):
        return torch.randn(*s, requires_grad=True)

    cases = {
        "attention": (C.attention_op, (r(14, 4, 8), r(14, 2, 8), r(14, 2, 8), key, 0.0, 0.0, 0, 0)),
        "rule": (C.gdn_rule_op, (r(14, 2, 8), r(14, 2, 8), r(14, 4, 8), (-torch.rand(14, 4)).requires_grad_(),
                                 torch.rand(14, 4, requires_grad=True), r(3, 4, 8, 8), key, 0.35, True, True, 0, 0,
                                 True)),
        "conv": (C.conv1d_op, (r(14, 6), r(6, 4), r(3, 6, 3), key, True, 0, 0)),
        "gates": (C.gates_op, (r(14, 4), r(14, 4), r(4), r(4), key)),
        "l2norm": (C.l2norm_op, (r(14, 2, 8), key, 1e-6)),
    }
    for name, (op, args) in cases.items():
        res = torch.library.opcheck(op, args)
        assert all(v == "SUCCESS" for v in res.values()), (name, res)


def test_prepared_qwen35_compiles_whole_and_equals_eager():
    """maskpack.hf.prepare_model: the full-attention layers through maskpack's registered attention and
    the linear layers patched, forward and backward under torch.compile(fullgraph=True): 0 graph breaks
    (the layer's rule resolved once per layout while tracing), loss and gradients equal to eager."""
    import maskpack.hf

    model = _qwen35(["linear_attention", "full_attention", "linear_attention"])
    maskpack.hf.prepare_model(model)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0, 0]])
    ids = torch.randint(0, 32, mask.shape, generator=torch.Generator().manual_seed(1))
    lay = Layout.from_mask2d(mask)
    n, why = _breaks(lambda: _loss(model, ids, mask, lay))
    assert n == 0, why
    loss_ref, g_ref = _model_grads(model, _loss, ids, mask, lay)
    torch._dynamo.reset()
    compiled = torch.compile(_loss, fullgraph=True, backend="aot_eager")
    loss, g = _model_grads(model, compiled, ids, mask, lay)
    assert g.keys() == g_ref.keys() and any("self_attn" in k for k in g) and any("linear_attn" in k for k in g)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-6, atol=0)
    for name in g_ref:
        torch.testing.assert_close(g[name], g_ref[name], rtol=1e-5, atol=1e-7, msg=name)
    # without the layout, a traced attention layer cannot read boundaries from tensor values: an error naming it
    torch._dynamo.reset()
    f = torch.compile(lambda ids, m: model(input_ids=ids, attention_mask=m, use_cache=False).logits.sum(),
                      fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception) as e:
        f(ids, mask)
    assert "maskpack_layout" in str(e.value)
