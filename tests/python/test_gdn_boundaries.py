"""No silent wrong answer in the Gated DeltaNet paths (issue 32):

* patched transformers linear-attention layers take their sequence boundaries from whatever the
  model call carries (cu_seq_lens_q, seq_idx, position_ids, cu_seqlens, a 2D mask, a maskpack
  layout) by prepare_batch's rules, refuse forms that disagree, and never run across a boundary;
* offsets that cover fewer tokens than the row holds are an error unless the padding is stated;
* gated_delta_rule refuses a gate g > 0, NaN or -inf on a real token (not on padding) unless
  check_gate=False.
"""

import pytest
import torch

import maskpack

_TINY = dict(hidden_size=48, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
             linear_value_head_dim=8, linear_conv_kernel_dim=4, num_hidden_layers=4, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16, intermediate_size=32, vocab_size=32, rms_norm_eps=1e-6)
LENGTHS = [7, 3, 12]


def relerr(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _model(kind, linear_only):
    """A tiny causal LM; ``linear_only``: every layer a Gated DeltaNet layer, so that the logits see
    the sequences through those layers alone (transformers' attention layers separate packed
    sequences by position ids only)."""
    torch.manual_seed(5)
    extra = dict(layer_types=["linear_attention"] * 4) if linear_only else {}
    if kind == "qwen3_5":
        from transformers import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM as LM
        cfg = Qwen3_5TextConfig(**_TINY, **extra)
    else:
        from transformers import Qwen3NextConfig
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextForCausalLM as LM
        cfg = Qwen3NextConfig(**_TINY, **extra, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                              shared_expert_intermediate_size=16)
    cfg._attn_implementation = "sdpa"
    model = LM(cfg).eval()
    with torch.no_grad():  # decays far from 1, so that a sequence that leaks into the next one shows
        for mod in model.modules():
            if hasattr(mod, "A_log"):
                mod.A_log.fill_(-1.0)
    return model


def _batch(vocab):
    gen = torch.Generator().manual_seed(7)
    ids = [torch.randint(0, vocab, (n,), generator=gen) for n in LENGTHS]
    width = max(LENGTHS)
    pad = torch.zeros(len(LENGTHS), width, dtype=torch.long)
    mask = torch.zeros_like(pad)
    for i, x in enumerate(ids):
        pad[i, :len(x)], mask[i, :len(x)] = x, 1
    flat = torch.cat(ids)[None]
    pos = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    seq_idx = torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(LENGTHS)])[None]
    cu = torch.tensor([0, 7, 10, 22], dtype=torch.int32)
    return pad, mask, flat, pos, seq_idx, cu


def _padded_ref(model, pad, mask):
    with torch.no_grad():
        out = model(pad, attention_mask=mask, use_cache=False).logits
    return torch.cat([out[i, :n] for i, n in enumerate(LENGTHS)])


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_next"])
def test_patched_model_takes_boundaries_from_position_ids_alone(kind):
    """DataCollatorWithFlattening's default batch: one packed row with position ids and nothing
    else. transformers hands the position ids to its attention layers only; the patched linear
    layers must still see the boundaries (the full model, attention layers included)."""
    model = _model(kind, linear_only=False)
    pad, mask, flat, pos, _, _ = _batch(model.config.vocab_size)
    ref = _padded_ref(model, pad, mask)
    assert maskpack.patch_linear_attention(model) == 3
    with torch.no_grad():
        out = model(flat, position_ids=pos, use_cache=False).logits[0]
        mixed = model(flat, position_ids=torch.arange(22)[None], use_cache=False).logits[0]  # one sequence
    assert relerr(out, ref) < 1e-5
    assert relerr(mixed, ref) > 1e-3  # the model does see the difference
    # positional position_ids reach the layers too (ForCausalLM.forward(input_ids, attention_mask, position_ids))
    with torch.no_grad():
        assert relerr(model(flat, None, pos, use_cache=False).logits[0], ref) < 1e-5


@pytest.mark.parametrize("key", ["position_ids", "seq_idx", "cu_seq_lens_q", "cu_seqlens", "maskpack_layout"])
def test_patched_linear_layers_take_boundaries_from_any_one_form(key):
    """Each form alone marks the boundaries: the packed run of a model made of Gated DeltaNet
    layers gives the logits of the padded run."""
    model = _model("qwen3_5", linear_only=True)
    pad, mask, flat, pos, seq_idx, cu = _batch(model.config.vocab_size)
    ref = _padded_ref(model, pad, mask)
    assert maskpack.patch_linear_attention(model) == 4
    kw = {"position_ids": dict(position_ids=pos), "seq_idx": dict(seq_idx=seq_idx),
          "cu_seq_lens_q": dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu), "cu_seqlens": dict(cu_seqlens=cu),
          "maskpack_layout": dict(maskpack_layout=maskpack.Layout.from_cu_seqlens(cu))}[key]
    with torch.no_grad():
        out = model(flat, use_cache=False, **kw).logits[0]
        mixed = model(flat, position_ids=torch.arange(22)[None], use_cache=False).logits[0]
    assert relerr(out, ref) < 1e-5
    assert relerr(mixed, ref) > 1e-3


def test_patched_layers_agree_under_gradient_checkpointing():
    """The boundaries from position ids reach the recomputation of a checkpointed layer too: the
    gradients of the packed step equal those of the padded step."""
    model = _model("qwen3_5", linear_only=True)
    pad, mask, flat, pos, _, _ = _batch(model.config.vocab_size)
    maskpack.patch_linear_attention(model)
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    R = torch.randn(sum(LENGTHS), model.config.vocab_size, generator=torch.Generator().manual_seed(1))

    def grads(**kw):
        model.zero_grad(set_to_none=True)
        if "attention_mask" in kw:
            out = model(pad, use_cache=False, **kw).logits
            out = torch.cat([out[i, :n] for i, n in enumerate(LENGTHS)])
        else:
            out = model(flat, use_cache=False, **kw).logits[0]
        (out * R).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref, got = grads(attention_mask=mask), grads(position_ids=pos)
    assert ref.keys() == got.keys() and ref
    for n in ref:
        assert relerr(got[n], ref[n]) < 1e-4, n


def test_patched_layers_refuse_disagreeing_or_absent_boundaries():
    model = _model("qwen3_5", linear_only=True)
    _, _, flat, pos, seq_idx, cu = _batch(model.config.vocab_size)
    maskpack.patch_linear_attention(model)
    other = torch.tensor([0, 7, 11, 22], dtype=torch.int32)

    def refused(argument, index=None, **kw):
        with torch.no_grad(), pytest.raises(maskpack.Error) as e:
            model(flat, use_cache=False, **kw)
        assert e.value.argument == argument, e.value
        if index is not None:
            assert e.value.index == index, e.value
        return e.value

    # two explicit forms that disagree: the first token where they do
    refused("seq_idx", (10,), cu_seq_lens_q=other, seq_idx=seq_idx)
    refused("cu_seq_lens_k", cu_seq_lens_q=cu, cu_seq_lens_k=other)
    # position ids against offsets: a sequence start where the positions run on
    refused("position_ids", (10,), cu_seq_lens_q=other, position_ids=pos)
    # a layout against the other forms
    refused("cu_seq_lens_q", (10,), cu_seq_lens_q=other, maskpack_layout=maskpack.Layout.from_cu_seqlens(cu))
    # a 2D mask that marks a token the offsets make a sequence's as padding
    m = torch.ones_like(flat)
    m[0, 3] = 0
    refused("attention_mask", (3,), cu_seq_lens_q=cu, attention_mask=m)
    # a 2D mask of every token (transformers then hands the layers none) with position ids that
    # restart: one packed row, as prepare_batch reads it; with offsets that disagree: refused
    with torch.no_grad():
        full = model(flat, attention_mask=torch.ones_like(flat), position_ids=pos, use_cache=False).logits
        assert torch.equal(full, model(flat, position_ids=pos, use_cache=False).logits)
    refused("attention_mask", (19,), attention_mask=torch.ones_like(flat),
            cu_seq_lens_q=torch.tensor([0, 7, 10, 19], dtype=torch.int32))
    # one row and nothing that marks its sequences: never run as one sequence by default
    e = refused("position_ids")
    assert e.status == "MASKPACK_ERR_NOT_FOUND"
    with torch.no_grad():  # several rows without anything: each row one sequence, as transformers runs them
        model(flat.expand(2, -1), use_cache=False)
    # one packed row's description given for several rows
    with torch.no_grad(), pytest.raises(maskpack.Error) as e:
        model(flat.expand(2, -1), seq_idx=seq_idx, use_cache=False)
    assert e.value.argument == "seq_idx" and e.value.status == "MASKPACK_ERR_SHAPE"


def test_patched_layer_refuses_offsets_that_leave_tokens_out_unless_told():
    """cu_seq_lens_q that sum to fewer than the row's tokens: the rest would silently run as
    padding. An error (argument, first token left out), unless the 2D mask or tail_padding=True
    says that tail is padding; then the tail's outputs are exactly 0 and the rest is unchanged."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
    from transformers import Qwen3_5TextConfig

    layer = Qwen3_5GatedDeltaNet(Qwen3_5TextConfig(**_TINY), layer_idx=0)
    hidden = torch.randn(1, 22, 48)
    short = torch.tensor([0, 7, 10, 19], dtype=torch.int32)
    maskpack.patch_linear_attention(layer)
    with torch.no_grad():
        whole = layer(hidden[:, :19], cu_seq_lens_q=short)
        for kw in (dict(cu_seq_lens_q=short), dict(cu_seqlens=short)):
            with pytest.raises(maskpack.Error) as e:
                layer(hidden, **kw)
            assert e.value.argument == list(kw)[0] and e.value.index == (19,) and e.value.status == "MASKPACK_ERR_VALUE"
            assert "tail_padding" in str(e.value)
        # position ids whose last tokens are a run of zeros: read as padding, so refused alike
        pos = torch.cat([torch.arange(7), torch.arange(3), torch.arange(10), torch.zeros(2, dtype=torch.long)])[None]
        with pytest.raises(maskpack.Error) as e:
            layer(hidden, position_ids=pos)
        assert e.value.argument == "position_ids" and e.value.index == (20,)
        # the caller says so: a 2D mask marking the tail, a layout, or the patch's tail_padding=True
        m = torch.ones(1, 22, dtype=torch.long)
        m[0, 19:] = 0
        by_mask = layer(hidden, cu_seq_lens_q=short, attention_mask=m)
        by_layout = layer(hidden, maskpack_layout=maskpack.Layout.from_cu_seqlens(short, total=22))
        maskpack.patch_linear_attention(layer, tail_padding=True)
        told = layer(hidden, cu_seq_lens_q=short)
    for out in (by_mask, by_layout, told):
        assert torch.equal(out[0, 19:], torch.zeros_like(out[0, 19:]))
        assert relerr(out[:, :19], whole) < 1e-6


def test_patched_model_generation_with_position_ids_is_unchanged():
    """generate() passes position ids: the prefill through the patched layers (one sequence per
    row, left padding) still fills transformers' cache as its own prefill does."""
    model = _model("qwen3_5", linear_only=False)
    left = torch.zeros(2, 7, dtype=torch.long)
    lmask = torch.zeros_like(left)
    gen = torch.Generator().manual_seed(3)
    left[0], lmask[0] = torch.randint(0, 32, (7,), generator=gen), 1
    left[1, 4:], lmask[1, 4:] = torch.randint(0, 32, (3,), generator=gen), 1
    kw = dict(attention_mask=lmask, max_new_tokens=4, do_sample=False, output_scores=True,
              return_dict_in_generate=True)
    with torch.no_grad():
        ref = model.generate(left, **kw)
        maskpack.patch_linear_attention(model)
        got = model.generate(left, **kw)
        one = model.generate(left[:1], max_new_tokens=4, do_sample=False)  # batch 1, no mask
        maskpack.patch_linear_attention(model, enabled=False)
        assert not model._forward_pre_hooks  # the call tap goes with the patch
        one_ref = model.generate(left[:1], max_new_tokens=4, do_sample=False)
    assert torch.equal(got.sequences, ref.sequences)
    for a, b in zip(got.scores, ref.scores):
        assert relerr(a, b) < 1e-5
    assert torch.equal(one, one_ref)


# ---- the gate --------------------------------------------------------------------------------


def _rule_inputs(lead, H=2, HV=4, K=16, V=8):
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(*lead, H, K, generator=gen)
    k = torch.randn(*lead, H, K, generator=gen)
    v = torch.randn(*lead, HV, V, generator=gen)
    g = -torch.rand(*lead, HV, generator=gen) * 0.5
    beta = torch.rand(*lead, HV, generator=gen)
    return q, k, v, g, beta


@pytest.mark.parametrize("bad", [0.5, float("nan"), float("-inf"), float("inf")])
@pytest.mark.parametrize("chunked", [True, False])
def test_gated_delta_rule_refuses_a_gate_that_is_not_a_finite_decay(bad, chunked):
    lay = maskpack.Layout.from_lengths([5, 9], placement="packed")
    q, k, v, g, beta = _rule_inputs((14,))
    g[11, 2] = bad
    g[12, 0] = bad  # later: the first one is named
    o = torch.full((14, 4, 8), 7.0)
    ht = torch.full((2, 4, 16, 8), 7.0)
    with pytest.raises(maskpack.Error) as e:
        maskpack.gated_delta_rule(q, k, v, g, beta, lay, chunked=chunked, out=(o, ht))
    err = e.value
    assert err.argument == "g" and err.status == "MASKPACK_ERR_VALUE" and err.index == (11, 2), err
    assert "token 11" in str(err) and "head 2" in str(err)
    assert (o == 7.0).all() and (ht == 7.0).all()  # nothing written
    with pytest.raises(maskpack.Error):
        maskpack.gated_delta_rule(q, k, v, g, beta, lay, chunked=chunked)  # the autograd path, too
    # asked not to check: it runs
    maskpack.gated_delta_rule(q, k, v, g, beta, lay, chunked=chunked, check_gate=False)


def test_gate_check_reads_real_tokens_only_and_names_row_token_head():
    """Padding is never read (NaN, +inf there change nothing); a padded layout names (row, token,
    head); bfloat16 is checked too; g = 0 (no decay) is allowed."""
    lay = maskpack.Layout.from_lengths([5, 9], placement="right", capacity=10)
    q, k, v, g, beta = _rule_inputs((2, 10))
    g[0, 5:] = float("nan")
    g[1, 9] = float("inf")
    g[1, 3, 1] = 0.0
    g[1, 3, 2] = -0.0
    o, _ = maskpack.gated_delta_rule(q, k, v, g, beta, lay)
    assert not o.isnan().any()
    maskpack.gated_delta_rule(q, k, v, g.bfloat16(), beta, lay)  # bfloat16: -0, 0 and NaN/Inf pads alike
    for bad in (1e-3, float("nan"), float("-inf"), float("inf")):
        g[1, 4, 3] = bad
        for gg in (g, g.bfloat16()):
            with pytest.raises(maskpack.Error) as e:
                maskpack.gated_delta_rule(q, k, v, gg, beta, lay)
            assert e.value.index == (1, 4, 3) and e.value.argument == "g", (bad, gg.dtype)


def test_gate_check_guards_the_backward_and_the_layer():
    lay = maskpack.Layout.from_lengths([6, 4], placement="packed")
    q, k, v, g, beta = (x.requires_grad_(True) for x in _rule_inputs((10,)))
    o, _ = maskpack.gated_delta_rule(q, k, v, g, beta, lay)
    g.data[2, 1] = 0.25  # changed behind autograd's back after the forward: the backward checks the saved g
    with pytest.raises(maskpack.Error) as e:
        o.sum().backward()
    assert e.value.argument == "g" and e.value.index == (2, 1)
    # the layer: a NaN in a real token's hidden state reaches g and is refused by name
    layer = maskpack.GatedDeltaNet(48, 2, 4, 16, 8)
    h = torch.randn(10, 48)
    h[7, 3] = float("nan")
    with torch.no_grad(), pytest.raises(maskpack.Error) as e:
        layer(h, lay)
    assert e.value.argument == "g" and e.value.index[0] == 7


def test_check_gate_is_a_bool_and_not_silently_dropped():
    lay = maskpack.Layout.from_lengths([4], placement="packed")
    with pytest.raises(TypeError):
        maskpack.gated_delta_rule(*_rule_inputs((4,)), lay, check_gate=0)


# ---- context parallelism: the whole batch's offsets must cover the ranks' tokens -----------------


def _cp_worker(rank, world, init_file, out_dir):
    import os

    import torch.distributed as dist
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        torch.manual_seed(3)
        layer = Qwen3_5GatedDeltaNet(Qwen3_5TextConfig(**_TINY), layer_idx=0)
        maskpack.patch_linear_attention(layer, group=dist.group.WORLD)
        lay = maskpack.Layout.from_lengths([12, 20], placement="packed")
        hid = lay.shard(torch.randn(32, 48, generator=torch.Generator().manual_seed(4)), world, rank)[None]
        got = {}
        with torch.no_grad():
            got["ok"] = layer(hid, maskpack_layout=lay)
            cu = torch.tensor([0, 12, 32], dtype=torch.int32)
            got["cu"] = layer(hid, cu_seq_lens_q=cu)
            for name, kw in (("short", dict(cu_seq_lens_q=torch.tensor([0, 12, 28], dtype=torch.int32))),
                             ("disagree", dict(maskpack_layout=lay,
                                               cu_seq_lens_q=torch.tensor([0, 14, 32], dtype=torch.int32)))):
                try:
                    layer(hid, **kw)
                    got[name] = None
                except maskpack.Error as e:
                    got[name] = (e.argument, e.status, e.index, str(e))
        torch.save(got, os.path.join(out_dir, f"cp{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_patched_layer_under_cp_refuses_offsets_that_do_not_cover_the_batch():
    """Under context parallelism the whole batch's cu_seq_lens_q must cover the tokens the ranks
    hold (no silent tail of padding) and agree with a maskpack_layout given beside it; every rank
    raises alike (before any collective, so none waits)."""
    import os
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_cp_worker, args=(2, os.path.join(d, "init"), d), nprocs=2, join=True, start_method="spawn")
        for r in range(2):
            got = torch.load(os.path.join(d, f"cp{r}.pt"))
            assert torch.equal(got["ok"], got["cu"])
            arg, status, _, msg = got["short"]
            assert arg == "cu_seq_lens_q" and status == "MASKPACK_ERR_SHAPE" and "28 tokens" in msg, got["short"]
            arg, status, index, _ = got["disagree"]
            assert arg == "cu_seq_lens_q" and status == "MASKPACK_ERR_VALUE" and index == (12,), got["disagree"]
