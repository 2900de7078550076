"""maskpack.hf (issue 34, part A): one call makes a transformers Qwen3.5 / Qwen3-Next model run on
maskpack (attention through the "maskpack" attention implementation, Gated DeltaNet through
patch_linear_attention), padding-free at cp = 1 and under context parallelism over 2 and 4 gloo
processes (ring, all-gather and Ulysses attention). The loss (bundle.shift_labels and loss_weights,
summed over the ranks) and every parameter gradient (all-reduced) equal transformers' own padded run of
the unprepared model with its attention_mask, same weights.

Tolerance: relative to the largest magnitude of the reference tensor, ``max|a - b| / max|b|``: 1e-5 for
the loss and every gradient. Why not bitwise: maskpack's attention and Gated DeltaNet kernels accumulate
in another order than transformers' SDPA and its chunked torch rule (measured at cp = 1: 2e-7 for the loss,
up to 3e-6 on gradients, fp32 throughout).
"""

import copy
import functools
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import maskpack
import maskpack.hf as mhf

TOL = 1e-5
LENGTHS = [37, 5, 1, 29, 16]  # every sequence cut across ranks at cp = 2 and 4 (zigzag), one of length 1
VOCAB = 100


def relerr(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def tiny_model(kind):
    """A tiny causal LM of the family, seeded: one Gated DeltaNet layer then one attention layer (GQA:
    4 query heads, 2 key/value heads); GDN heads divide by 4 (head-parallel at cp = 2 and 4). Weights
    redrawn large enough that every path matters."""
    torch.manual_seed(3)
    common = dict(hidden_size=32, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=8,
                  linear_value_head_dim=8, linear_conv_kernel_dim=4, num_hidden_layers=2,
                  layer_types=["linear_attention", "full_attention"], num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, intermediate_size=32, vocab_size=VOCAB, rms_norm_eps=1e-6)
    if kind == "qwen3_5":
        from transformers import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM as LM
        cfg = Qwen3_5TextConfig(**common)
    else:
        from transformers import Qwen3NextConfig
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextForCausalLM as LM
        cfg = Qwen3NextConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                              shared_expert_intermediate_size=16)
    cfg._attn_implementation = "sdpa"
    model = LM(cfg).train()
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() > 1 else 0.1))
    return model


def padded_batch():
    gen = torch.Generator().manual_seed(7)
    S = max(LENGTHS)
    mask = torch.zeros(len(LENGTHS), S, dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        mask[b, :n] = 1
    ids = torch.randint(1, VOCAB, mask.shape, generator=gen) * mask
    labels = torch.where(mask == 1, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@functools.lru_cache(maxsize=None)
def reference(kind):
    """transformers' own padded run of the unprepared model: (loss, {name: grad})."""
    model = tiny_model(kind)
    out = model(**padded_batch(), use_cache=False)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def maskpack_loss(model, bundle, **kw):
    """This rank's share of the mean loss: sum(per-token loss * the bundle's weights)."""
    logits = model(**bundle.hf_kwargs(**kw)).logits
    flat = logits.reshape(-1, logits.shape[-1])
    per_token = F.cross_entropy(flat, bundle.shift_labels.reshape(-1), ignore_index=-100, reduction="none")
    return (per_token * bundle.loss_weights.reshape(-1)).sum()


def check_against_reference(kind, loss, grads, what):
    ref_loss, ref_grads = reference(kind)
    assert relerr(loss, ref_loss) < TOL, (what, loss, ref_loss)
    assert set(grads) == set(ref_grads)
    for name, g in grads.items():
        assert g is not None, (what, name)
        assert relerr(g, ref_grads[name]) < TOL, (what, name, relerr(g, ref_grads[name]))


# ---- cp = 1 --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_next"])
def test_prepared_model_trains_padding_free_and_padded_like_transformers_padded_run(kind):
    """cp = 1: prepare_model routes the attention layer through "maskpack" and the GDN layer through
    maskpack's kernels; padding-free (one packed row, cu_seq_lens) and padded (2D mask) runs give
    transformers' padded loss and every parameter gradient; unprepare gives transformers' own
    implementation back (its padded run again, bit for bit)."""
    model = tiny_model(kind)
    assert mhf.prepare_model(model) is model
    assert model.config._attn_implementation == "maskpack"
    assert mhf.prepare_model(model) is model  # idempotent
    n_patched = sum("forward" in m.__dict__ for m in model.modules())
    assert n_patched == 1  # the one GDN layer, patched once
    for padding_free in (True, False):
        model.zero_grad()
        bundle = maskpack.prepare_batch(padded_batch(), backend="sdpa", padding_free=padding_free)
        loss = maskpack_loss(model, bundle)
        loss.backward()
        check_against_reference(kind, loss.detach(), {n: p.grad for n, p in model.named_parameters()},
                                f"cp=1 padding_free={padding_free}")
    mhf.prepare_model(model, enabled=False)
    assert model.config._attn_implementation == "sdpa"
    assert not any("forward" in m.__dict__ for m in model.modules())
    model.zero_grad()
    ref_loss, _ = reference(kind)
    assert torch.equal(model(**padded_batch(), use_cache=False).loss.detach(), ref_loss)


def test_any_attention_interface_model_with_a_sliding_window_and_generation_unchanged():
    """A model of no family maskpack names (Mistral: attention only, through AttentionInterface, with
    transformers' sliding window of 5 keys): prepared, its padding-free and padded logits are
    transformers' own padded logits (the window converted, never crossing a sequence). A prepared
    Qwen3.5 generates greedily as transformers does from a left-padded prompt (the prefill through
    maskpack, decode steps through transformers' SDPA with its cache)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(8)
    cfg = MistralConfig(hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, vocab_size=VOCAB, sliding_window=5)
    cfg._attn_implementation = "sdpa"
    model = MistralForCausalLM(cfg).eval()
    batch = padded_batch()
    keep = batch["attention_mask"].bool()
    with torch.no_grad():
        ref = model(batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        full = copy.deepcopy(model)
        full.config.sliding_window = None  # the same model without its window: other logits
        assert relerr(full(batch["input_ids"], attention_mask=batch["attention_mask"],
                           use_cache=False).logits[keep], ref[keep]) > 1e-3
        mhf.prepare_model(model)
        for padding_free in (True, False):
            bundle = maskpack.prepare_batch(batch, padding_free=padding_free)
            logits = model(**bundle.hf_kwargs()).logits
            back = bundle.to_padded(logits[0] if padding_free else logits)
            assert relerr(back[keep], ref[keep]) < TOL, padding_free
    qwen = tiny_model("qwen3_5").eval()
    prompt = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(9))
    pmask = torch.ones_like(prompt)
    pmask[1, :3] = 0  # left padding
    kw = dict(attention_mask=pmask, max_new_tokens=4, do_sample=False, output_scores=True,
              return_dict_in_generate=True)
    with torch.no_grad():
        want = qwen.generate(prompt, **kw)
        mhf.prepare_model(qwen)
        got = qwen.generate(prompt, **kw)
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.scores, want.scores):
        assert relerr(a, b) < TOL


# ---- context parallelism across processes -------------------------------------------------------------

# (model kind, cp_scheme of the batch, cp_algorithm of the attention)
CP_CASES = [("qwen3_5", "zigzag", "ring"), ("qwen3_5", "zigzag", "all_gather"), ("qwen3_5", "ulysses", "auto"),
            ("qwen3_next", "zigzag", "auto"), ("qwen3_next", "zigzag", "ulysses")]


def _cp_worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        group = dist.group.WORLD
        results = {}
        for kind, scheme, algo in CP_CASES:
            model = mhf.prepare_model(tiny_model(kind), group=group, cp_scheme=scheme, cp_algorithm=algo)
            bundle = maskpack.prepare_batch(padded_batch(), backend="sdpa", padding_free=True, cp=world, cp_rank=rank,
                                            cp_scheme=scheme)
            logits = model(**bundle.hf_kwargs()).logits[0]  # this rank's shard [T_local, vocab]
            per_token = F.cross_entropy(logits, bundle.shift_labels, reduction="none")
            loss = maskpack.cp_loss(per_token, bundle.loss_weights, group)  # the README's step
            loss.backward()
            total = loss.detach()  # the mean over the whole batch, on every rank
            grads = {}
            for n, p in model.named_parameters():
                g = p.grad.clone()
                dist.all_reduce(g)  # each rank's share of the gradient, summed as data parallelism would
                grads[n] = g
            results[(kind, scheme, algo)] = (total, grads)
        errs = {}
        # the group does not match the batch: a bundle cut for another rank, or with another scheme
        model = mhf.prepare_model(tiny_model("qwen3_5"), group=group)
        mine = maskpack.prepare_batch(padded_batch(), padding_free=True, cp=world, cp_rank=rank)
        other = maskpack.prepare_batch(padded_batch(), padding_free=True, cp=world, cp_rank=(rank + 1) % world)
        kw = mine.hf_kwargs()
        with_labels = mine.hf_kwargs(labels=True)  # the shard's labels and shifted labels, one packed row
        assert with_labels["shift_labels"].shape == kw["input_ids"].shape == (1, mine.input_ids.shape[0])
        assert torch.equal(with_labels["shift_labels"][0], mine.shift_labels)
        assert kw["maskpack_layout"] is mine.global_layout and kw["maskpack_cp"]["cp_rank"] == rank
        kw_scheme = {**kw, "maskpack_cp": {**kw["maskpack_cp"], "cp_scheme": "contiguous"}}
        # rank 0 alone holds a wrong batch: it raises its own error, every other rank one naming rank 0
        # (nobody waits in the ring)
        kw_one = kw_scheme if rank == 0 else kw
        for name, kwargs in (("rank", other.hf_kwargs()), ("scheme", kw_scheme), ("one", kw_one)):
            try:
                with torch.no_grad():
                    model(**kwargs)
            except maskpack.Error as e:
                errs[name] = (e.argument, str(e))
        # an attention layer under CP without the whole batch's layout: refused, never attention inside
        # the shard alone (called as the model would, after its GDN layer)
        attn = model.model.layers[1].self_attn
        T = mine.input_ids.shape[0]
        q, kv = torch.randn(1, 4, T, 8), torch.randn(1, 2, T, 8)
        try:
            mhf.attention_forward(attn, q, kv, kv, None, position_ids=mine.position_ids[None])
        except maskpack.Error as e:
            errs["nolayout"] = (e.argument, str(e))
        # a batch cut for another number of ranks than the model's group: hf_kwargs refuses it (no model of
        # the process was prepared for that many), and so does the attention layer, given its kwargs
        size = 6 - world  # 4 at world 2, 2 at world 4
        sized = maskpack.prepare_batch(padded_batch(), padding_free=True, cp=size, cp_rank=0)
        try:
            sized.hf_kwargs()
        except maskpack.Error as e:
            errs["size"] = (e.argument, str(e))
        try:
            mhf.attention_forward(attn, q, kv, kv, None, maskpack_layout=mine.global_layout,
                                  maskpack_cp={"cp": size, "cp_rank": 0, "cp_scheme": "zigzag"})
        except maskpack.Error as e:
            errs["size_attn"] = (e.argument, str(e))
        # an unprepared model is refused the shard's kwargs
        try:
            mine.hf_kwargs(model=tiny_model("qwen3_5"))
        except maskpack.Error as e:
            errs["unprepared"] = (e.argument, str(e))
        if rank == 0:
            torch.save({"results": results, "errs": errs}, os.path.join(out_dir, "cp.pt"))
        else:
            torch.save({"errs": errs}, os.path.join(out_dir, f"err{rank}.pt"))
        dist.barrier()  # nobody tears the group down while a peer still talks to it
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_prepared_model_under_cp_equals_transformers_padded_run(world):
    """cp = 2 and 4 gloo processes: prepare_model(model, group=...) and prepare_batch(cp=, cp_rank=,
    cp_scheme=); each rank runs model(**bundle.hf_kwargs()) on its shard; the losses summed over the ranks
    and the all-reduced gradients equal transformers' padded run, for Qwen3.5 and Qwen3-Next, with ring,
    all-gather and Ulysses attention (zigzag and Ulysses batch splits). A batch cut for another rank, or
    with another scheme, or without the whole batch's layout, is refused naming the argument; so is
    hf_kwargs for a model not prepared for CP; a wrong batch on one rank only stops every rank (no hang)."""
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        mp.start_processes(_cp_worker, args=(world, init, d), nprocs=world, join=True, start_method="spawn")
        got = torch.load(os.path.join(d, "cp.pt"))
        errs = [got["errs"]] + [torch.load(os.path.join(d, f"err{r}.pt"))["errs"] for r in range(1, world)]
    refs = {kind: reference(kind) for kind in ("qwen3_5", "qwen3_next")}
    for case, (loss, grads) in got["results"].items():
        ref_loss, ref_grads = refs[case[0]]
        assert relerr(loss, ref_loss) < TOL, (world, case, loss, ref_loss)
        for name, g in grads.items():
            assert relerr(g, ref_grads[name]) < TOL, (world, case, name, relerr(g, ref_grads[name]))
    for r, e in enumerate(errs):
        assert e["rank"][0] == "group" and f"cp_rank = {(r + 1) % world}" in e["rank"][1], (r, e)
        assert e["scheme"][0] == "cp_scheme" and "'contiguous'" in e["scheme"][1], (r, e)
        if r == 0:
            assert e["one"] == e["scheme"], e
        else:
            assert e["one"][0] == "group" and "rank 0 refused" in e["one"][1], (r, e)
        assert e["nolayout"][0] == "maskpack_layout", (r, e)
        assert e["size"][0] == "cp" and f"prepared for {6 - world} " in e["size"][1], (r, e)
        assert e["size_attn"][0] == "group" and f"cp = {6 - world}," in e["size_attn"][1], (r, e)
        assert e["unprepared"][0] == "cp" and "prepare_model" in e["unprepared"][1], (r, e)


# ---- bad input ----------------------------------------------------------------------------------------


def test_prepare_model_refuses_a_family_it_does_not_know():
    """A recurrent model (Mamba) and a plain torch module: maskpack.Error naming ``model`` and listing
    what prepare_model supports; nothing of the model is changed."""
    from transformers import MambaConfig, MambaForCausalLM

    mamba = MambaForCausalLM(MambaConfig(hidden_size=16, num_hidden_layers=1, vocab_size=32, state_size=4))
    for model in (mamba, torch.nn.Linear(2, 2)):
        with pytest.raises(maskpack.Error) as e:
            mhf.prepare_model(model)
        assert e.value.argument == "model" and e.value.status == "MASKPACK_ERR_UNSUPPORTED"
        assert "Qwen3.5" in str(e.value) and "Qwen3-Next" in str(e.value) and "AttentionInterface" in str(e.value)
    assert mamba.config._attn_implementation != "maskpack" and not hasattr(mamba, "_maskpack_hf")


def test_attention_layer_without_boundaries_is_refused():
    """The registered attention function called with neither a layout, nor cu_seqlens, nor position ids,
    nor a 2D mask: maskpack.Error naming position_ids (never one sequence across the batch); the same from
    a model call whose position ids are withheld is impossible (transformers makes them), so the
    function is called directly, as a layer would."""
    model = mhf.prepare_model(tiny_model("qwen3_5"))
    attn = model.model.layers[1].self_attn
    q = torch.randn(1, 4, 6, 8)
    kv = torch.randn(1, 2, 6, 8)
    with pytest.raises(maskpack.Error) as e:
        mhf.attention_forward(attn, q, kv, kv, None, scaling=0.3)
    assert e.value.argument == "position_ids" and e.value.status == "MASKPACK_ERR_NOT_FOUND"
    # with positions that restart: two sequences, each attending only to itself
    pos = torch.tensor([[0, 1, 2, 0, 1, 2]])
    out, _ = mhf.attention_forward(attn, q, kv, kv, None, scaling=0.3, position_ids=pos)
    first, _ = mhf.attention_forward(attn, q[:, :, 3:], kv[:, :, 3:], kv[:, :, 3:], None, scaling=0.3,
                                     position_ids=pos[:, 3:])
    assert relerr(out[:, 3:], first) < 1e-6
    # forms that disagree: cu_seq_lens_q says [0, 2, 6], the positions restart at 3
    with pytest.raises(maskpack.Error) as e:
        mhf.attention_forward(attn, q, kv, kv, None, position_ids=pos,
                              cu_seq_lens_q=torch.tensor([0, 2, 6], dtype=torch.int32))
    assert e.value.argument == "position_ids"


def test_attention_layer_refuses_mixed_devices_and_an_unprepared_cp_call():
    """Mixed devices (key on meta beside a CPU query; a model half on meta), a shard's kwargs in a model
    prepared without a group, unknown cp_algorithm / cp_scheme, a group without torch.distributed: each a
    maskpack.Error naming the argument."""
    model = mhf.prepare_model(tiny_model("qwen3_5"))
    attn = model.model.layers[1].self_attn
    q = torch.randn(1, 4, 6, 8)
    kv = torch.randn(1, 2, 6, 8)
    pos = torch.arange(6)[None]
    with pytest.raises(maskpack.Error) as e:
        mhf.attention_forward(attn, q, kv.to("meta"), kv, None, position_ids=pos)
    assert e.value.argument == "key" and "meta" in str(e.value)
    with pytest.raises(maskpack.Error) as e:  # a shard's kwargs in a model prepared without a group
        mhf.attention_forward(attn, q, kv, kv, None, position_ids=pos, maskpack_cp={"cp": 2, "cp_rank": 0})
    assert e.value.argument == "group"
    meta = tiny_model("qwen3_5")
    meta.lm_head.to("meta")
    with pytest.raises(maskpack.Error) as e:
        mhf.prepare_model(meta)
    assert e.value.argument == "model" and "meta" in str(e.value) and "cpu" in str(e.value)
    with pytest.raises(maskpack.Error) as e:
        mhf.prepare_model(tiny_model("qwen3_5"), cp_algorithm="tree")
    assert e.value.argument == "cp_algorithm"
    with pytest.raises(maskpack.Error) as e:
        mhf.prepare_model(tiny_model("qwen3_5"), cp_scheme="spiral")
    assert e.value.argument == "cp_scheme"
    assert not dist.is_initialized()
    with pytest.raises(maskpack.Error) as e:  # a group in a process whose torch.distributed is not initialised
        mhf.prepare_model(tiny_model("qwen3_5"), group=object())
    assert e.value.argument == "group" and "init_process_group" in str(e.value)
