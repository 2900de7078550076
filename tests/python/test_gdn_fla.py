"""Tensors on an accelerator: maskpack.gated_delta_rule and causal_conv1d run flash-linear-attention's
kernels (chunk_gated_delta_rule and causal_conv1d with cu_seqlens) over the boundaries the layout gives.

On the CPU the dispatch runs against fla's own torch reference code: a test hook stands in for fla's two
functions (fla's naive_recurrent_gated_delta_rule per sequence of the cu_seqlens it is handed; for the
conv, torch's conv1d per sequence under fla's state convention [N, D, W]) and routes CPU tensors through
the device path. What is checked is maskpack's side: the tokens of padded and packed layouts reach fla as
one packed row with the right cu_seqlens, initial states, scale and l2norm flag go through, outputs come
back in the caller's layout with pads 0, gradients flow, and the results equal maskpack's C kernels.
Bad input: fla missing (a maskpack.Error naming the package), tensors on mixed devices (naming the
argument), a growing gate (refused on the device path as on the CPU)."""

import sys

import pytest
import torch
import torch.nn.functional as F

import maskpack
import maskpack.gdn as gdn
from maskpack import Layout



def _fla_naive():
    """fla's reference module fla/ops/gated_delta_rule/naive.py (torch and einops only), loaded from the
    installed package's files: importing fla itself needs triton, which a CPU machine may lack."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("fla")
    # requirements-test.txt installs both: a missing one fails here, as the suite's rule is (conftest.py)
    assert spec is not None and spec.submodule_search_locations, "flash-linear-attention is not installed"
    import einops  # noqa: F401  (naive.py imports it)
    path = os.path.join(list(spec.submodule_search_locations)[0], "ops", "gated_delta_rule", "naive.py")
    mod_spec = importlib.util.spec_from_file_location("_fla_gdr_naive", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


fla_naive = _fla_naive()

CALLS = []


def _rule_ref(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kw):
    """fla's chunk_gated_delta_rule API over fla's naive recurrence, one sequence of cu_seqlens at a time."""
    assert q.shape[0] == 1 and cu_seqlens is not None and cu_seqlens.dtype == torch.int64 and not kw
    CALLS.append(("rule", cu_seqlens.tolist(), use_qk_l2norm_in_kernel))
    G = v.shape[2] // q.shape[2]
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt(q.square().sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt(k.square().sum(-1, keepdim=True) + 1e-6)
    q, k = q.repeat_interleave(G, dim=2), k.repeat_interleave(G, dim=2)
    outs, states = [], []
    cu = cu_seqlens.tolist()
    for n in range(len(cu) - 1):
        sl = slice(cu[n], cu[n + 1])
        h0 = None if initial_state is None else initial_state[n:n + 1]
        o, h = fla_naive.naive_recurrent_gated_delta_rule(q[:, sl], k[:, sl], v[:, sl], beta[:, sl], g[:, sl],
                                                          scale=scale, initial_state=h0, output_final_state=True)
        outs.append(o)
        states.append(h)
    return torch.cat(outs, dim=1).to(v.dtype), torch.cat(states, dim=0)


def _conv_ref(x, weight, initial_state=None, output_final_state=False, activation=None, cu_seqlens=None, **kw):
    """fla's causal_conv1d API (state [N, D, W]: each sequence's last W inputs, most recent last) in torch."""
    assert x.shape[0] == 1 and cu_seqlens is not None and not kw
    CALLS.append(("conv", cu_seqlens.tolist(), activation))
    D, W = weight.shape
    ys, finals = [], []
    cu = cu_seqlens.tolist()
    for n in range(len(cu) - 1):
        seq = x[0, cu[n]:cu[n + 1]].t()  # [D, L]
        before = torch.zeros(D, W, dtype=x.dtype) if initial_state is None else initial_state[n]
        full = torch.cat([before, seq], dim=1)  # [D, W + L]
        y = F.conv1d(full[None, :, 1:], weight[:, None, :], groups=D)[0]  # outputs of the L tokens
        ys.append(y.t())
        finals.append(full[:, -W:])
    y = torch.cat(ys, dim=0)[None]
    if activation in ("silu", "swish"):
        y = F.silu(y)
    return y, torch.stack(finals)


@pytest.fixture
def device_path(monkeypatch):
    monkeypatch.setattr(gdn, "_FLA_TEST_HOOK", {"rule": _rule_ref, "conv": _conv_ref})
    CALLS.clear()
    yield


LENGTHS = [5, 9, 3]
LAYOUTS = {"packed": Layout.from_lengths(LENGTHS, placement="packed"),
           "right": Layout.from_lengths(LENGTHS, placement="right"),
           "left": Layout.from_lengths(LENGTHS, placement="right").padded_of("left", width=11)}


def _rule_inputs(lay, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lead = (lay.q_width,) if lay.packed else (lay.n_rows, lay.q_width)
    r = lambda *s: torch.randn(*lead, *s, generator=gen)  # noqa: E731
    q, k, v = r(2, 8), r(2, 8), r(4, 6)
    g = -torch.rand(*lead, 4, generator=gen)
    beta = torch.rand(*lead, 4, generator=gen)
    h0 = torch.randn(lay.n_segments, 4, 8, 6, generator=gen)
    return [q, k, v, g, beta, h0]


def _run_rule(args, lay, hook, monkeypatch):
    monkeypatch.setattr(gdn, "_FLA_TEST_HOOK", {"rule": _rule_ref, "conv": _conv_ref} if hook else None)
    xs = [a.clone().requires_grad_() for a in args]
    o, ht = maskpack.gated_delta_rule(*xs[:5], lay, initial_state=xs[5], chunked=False)
    (o.square().sum() + ht.sum()).backward()
    return o.detach(), ht.detach(), [x.grad for x in xs]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_rule_device_path_equals_the_c_kernel(name, monkeypatch):
    lay = LAYOUTS[name]
    args = _rule_inputs(lay)
    CALLS.clear()
    o_d, ht_d, g_d = _run_rule(args, lay, True, monkeypatch)
    # fla got one packed row: the sequences' offsets in order, l2norm in the kernel
    assert CALLS == [("rule", [0, 5, 14, 17], True)]
    o_c, ht_c, g_c = _run_rule(args, lay, False, monkeypatch)
    keep = torch.as_tensor(lay.mask2d("bool")).reshape(*o_c.shape[:-2], 1, 1)
    assert torch.equal(o_d[~keep.expand_as(o_d)], torch.zeros_like(o_d[~keep.expand_as(o_d)]))  # pads exactly 0
    torch.testing.assert_close(o_d, o_c, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ht_d, ht_c, rtol=1e-4, atol=1e-5)
    for a, b in zip(g_d, g_c):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_conv_device_path_equals_the_c_kernel(name, monkeypatch):
    lay = LAYOUTS[name]
    gen = torch.Generator().manual_seed(3)
    lead = (lay.q_width,) if lay.packed else (lay.n_rows, lay.q_width)
    x, w, p = torch.randn(*lead, 6, generator=gen), torch.randn(6, 1, 4, generator=gen), \
        torch.randn(lay.n_segments, 6, 3, generator=gen)
    res = {}
    for hook in (True, False):
        monkeypatch.setattr(gdn, "_FLA_TEST_HOOK", {"rule": _rule_ref, "conv": _conv_ref} if hook else None)
        CALLS.clear()
        xs = [t.clone().requires_grad_() for t in (x, w, p)]
        y, st = maskpack.causal_conv1d(xs[0], xs[1], lay, prefix=xs[2])
        (y.square().sum() + st.sum()).backward()
        res[hook] = (y.detach(), st.detach(), [t.grad for t in xs])
        if hook:
            assert CALLS == [("conv", [0, 5, 14, 17], "silu")]
    (y_d, st_d, g_d), (y_c, st_c, g_c) = res[True], res[False]
    torch.testing.assert_close(y_d, y_c, rtol=1e-5, atol=1e-6)
    assert torch.equal(st_d, st_c)  # the last W-1 inputs: copies, not arithmetic
    for a, b in zip(g_d, g_c):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_device_path_refuses_a_growing_gate(device_path):
    lay = LAYOUTS["right"]
    q, k, v, g, beta, h0 = _rule_inputs(lay)
    g[1, 4, 2] = 0.25
    with pytest.raises(maskpack.Error) as e:
        maskpack.gated_delta_rule(q, k, v, g, beta, lay)
    assert e.value.argument == "g" and e.value.index == (1, 4, 2) and e.value.status == "MASKPACK_ERR_VALUE"
    g[1, 4, 2] = 0.0
    g[0, 7, 2] = float("nan")  # a pad slot of row 0 (5 tokens): never read, so no error
    maskpack.gated_delta_rule(q, k, v, g, beta, lay)


def test_patched_layer_on_the_device_path_equals_the_c_kernels(monkeypatch):
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3_5TextConfig(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                            linear_value_head_dim=8, linear_conv_kernel_dim=4, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=32,
                            vocab_size=32, rms_norm_eps=1e-6, layer_types=["linear_attention"] * 2)
    model = Qwen3_5ForCausalLM(cfg)
    gdn.patch_linear_attention(model)
    ids = torch.randint(0, 32, (1, 17), generator=torch.Generator().manual_seed(1))
    pos = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    res = {}
    for hook in (True, False):
        monkeypatch.setattr(gdn, "_FLA_TEST_HOOK", {"rule": _rule_ref, "conv": _conv_ref} if hook else None)
        model.zero_grad()
        loss = model(input_ids=ids, position_ids=pos, use_cache=False).logits.square().sum()
        loss.backward()
        res[hook] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(res[True][0], res[False][0], rtol=1e-5, atol=0)
    for n in res[False][1]:
        torch.testing.assert_close(res[True][1][n], res[False][1][n], rtol=1e-3, atol=1e-5, msg=n)


def test_fla_missing_is_an_error_naming_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)  # import fla -> ImportError
    monkeypatch.setitem(sys.modules, "fla.ops", None)
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", None)
    monkeypatch.setitem(sys.modules, "fla.modules", None)
    monkeypatch.setitem(sys.modules, "fla.modules.causal_conv1d", None)
    lay = LAYOUTS["packed"]
    q, k, v, g, beta, _ = (t.to("meta") for t in _rule_inputs(lay))  # a non-CPU device
    with pytest.raises(maskpack.Error) as e:
        maskpack.gated_delta_rule(q, k, v, g, beta, lay, check_gate=False)
    assert "flash-linear-attention" in str(e.value) and e.value.status == "MASKPACK_ERR_UNSUPPORTED"
    with pytest.raises(maskpack.Error) as e:
        maskpack.causal_conv1d(torch.empty(17, 6, device="meta"), torch.empty(6, 4, device="meta"), lay)
    assert "flash-linear-attention" in str(e.value) and e.value.argument == "x"


def test_mixed_devices_name_the_argument():
    lay = LAYOUTS["packed"]
    q, k, v, g, beta, h0 = _rule_inputs(lay)
    with pytest.raises(maskpack.Error) as e:
        maskpack.gated_delta_rule(q, k.to("meta"), v, g, beta, lay)
    assert e.value.argument == "k" and "meta" in str(e.value)
    with pytest.raises(maskpack.Error) as e:
        maskpack.gated_delta_rule(q, k, v, g, beta, lay, initial_state=h0.to("meta"))
    assert e.value.argument == "initial_state"
    with pytest.raises(maskpack.Error) as e:
        maskpack.causal_conv1d(torch.randn(17, 6), torch.randn(6, 4, device="meta"), lay)
    assert e.value.argument == "weight"


# ---- flash-linear-attention's context parallelism ---------------------------------------------------


def _fla_contiguous_split(cu, world, rank):
    """flash-linear-attention's contiguous CP split, as its documentation states it (written here, not
    copied): the stream [0, cu[-1]) in world equal parts; rank r's local offsets are the global ones
    clamped to its part, shifted to start at 0, repeats dropped."""
    total = cu[-1]
    assert total % world == 0
    part = total // world
    lo, hi = part * rank, part * (rank + 1)
    local = sorted({min(max(c, lo), hi) - lo for c in cu})
    return list(zip(local[:-1], local[1:])), lo


@pytest.mark.parametrize("world", [2, 4])
def test_fla_cp_kwargs_match_maskpacks_ulysses_shards(world, monkeypatch):
    import maskpack.distributed as mdist

    lengths = [7, 2, 12, 5, 9, 3]
    lay = Layout.from_lengths(lengths, placement="packed")
    for rank in range(world):
        monkeypatch.setattr(mdist, "_rank_size", lambda group, r=rank: (r, world))
        kw = gdn.fla_cp_kwargs(lay, "group", conv1d_kernel_size=4)
        assert kw["layout"] == "contiguous" and kw["conv1d_kernel_size"] == 4
        assert kw["cu_seqlens"].dtype == torch.int64 and torch.equal(kw["cu_seqlens"], kw["cu_seqlens_cpu"])
        cu = kw["cu_seqlens_cpu"].tolist()
        assert cu[-1] % world == 0 and cu[-1] >= sum(lengths)
        pieces, lo = _fla_contiguous_split(cu, world, rank)
        shard = lay.cp_shard(world, rank, scheme="ulysses")
        assert shard.q_width == cu[-1] // world  # the tokens fla expects on this rank
        # each real piece fla sees on this rank is one of the shard's segments (pad runs: fla's own pieces)
        real = [(a, b) for a, b in pieces if lo + a < sum(lengths)]
        mine = sorted((int(s[1]), int(s[1]) + int(s[2])) for s in shard.segments)
        assert real == mine, (rank, real, mine)
        # and the tokens are the ones maskpack's shard move gives this rank
        x = torch.arange(sum(lengths), dtype=torch.float32)[:, None]
        got = lay.shard(x, world, rank, scheme="ulysses", pad_value=-1)[:, 0]
        want = torch.full((cu[-1] // world,), -1.0)
        n_real = max(0, min(sum(lengths) - lo, cu[-1] // world))
        want[:n_real] = torch.arange(lo, lo + n_real, dtype=torch.float32)
        assert torch.equal(got, want)


def test_fla_cp_kwargs_refusals(monkeypatch):
    import maskpack.distributed as mdist

    monkeypatch.setattr(mdist, "_rank_size", lambda group: (0, 2))
    lay = Layout.from_lengths([7, 2, 12], placement="packed")
    with pytest.raises(maskpack.Error) as e:
        gdn.fla_cp_kwargs(lay, "group", scheme="zigzag")
    assert e.value.argument == "scheme"
    with pytest.raises(maskpack.Error) as e:
        gdn.fla_cp_kwargs(lay, "group", cp=4)
    assert e.value.argument == "group" and "4" in str(e.value)
    with pytest.raises(maskpack.Error) as e:
        gdn.fla_cp_kwargs(Layout.from_lengths([7, 2], placement="right"), "group")
    assert e.value.argument == "layout"


def test_bundle_fla_kwargs_under_cp(monkeypatch):
    """bundle.fla_kwargs(group=) at cp > 1: build_cp_context's arguments for the bundle's Ulysses split,
    the same as fla_cp_kwargs on its global layout; a per-sequence split, a missing group and a padded
    bundle are errors naming what to change."""
    import maskpack.distributed as mdist

    lengths = [7, 2, 12, 5]
    ids = torch.arange(sum(lengths))[None]
    cu = torch.tensor([0, 7, 9, 21, 26], dtype=torch.int32)
    for rank in range(2):
        monkeypatch.setattr(mdist, "_rank_size", lambda group, r=rank: (r, 2))
        b = maskpack.prepare_batch({"input_ids": ids, "cu_seqlens": cu}, padding_free=True, cp=2, cp_rank=rank,
                                   cp_scheme="ulysses")
        kw = b.fla_kwargs(group="group", conv1d_kernel_size=4)
        want = gdn.fla_cp_kwargs(b.global_layout, "group", align=None, conv1d_kernel_size=4, cp=2)
        assert kw.keys() == want.keys() and kw["layout"] == "contiguous"
        assert torch.equal(kw["cu_seqlens_cpu"], want["cu_seqlens_cpu"])
        assert kw["cu_seqlens_cpu"][-1] == 2 * b.layout.q_width  # this rank holds its contiguous half
        with pytest.raises(maskpack.Error) as e:
            b.fla_kwargs()
        assert e.value.argument == "group"
    z = maskpack.prepare_batch({"input_ids": ids, "cu_seqlens": cu}, padding_free=True, cp=2, cp_rank=0)
    with pytest.raises(maskpack.Error) as e:
        z.fla_kwargs(group="group")
    assert e.value.argument == "cp_scheme"
    mask = torch.ones(2, 13, dtype=torch.int64)
    p = maskpack.prepare_batch({"input_ids": torch.zeros(2, 13, dtype=torch.int64), "attention_mask": mask}, cp=2)
    with pytest.raises(maskpack.Error) as e:
        p.fla_kwargs(group="group")
    assert e.value.argument == "padding_free"
