"""maskpack.prepare_batch: the bundle for a padded and a padding-free configuration of one batch
describes the same tokens for every backend; CP ranks reassemble to the unsharded answer; the loss is
the same number in every configuration."""

import numpy as np
import pytest
import torch

import maskpack
from maskpack import Layout


def _batch(rng, left=False, torch_in=True):
    lengths = rng.integers(1, 24, size=rng.integers(1, 5))
    S = int(lengths.max()) + int(rng.integers(0, 4))
    mask = np.zeros((len(lengths), S), dtype=np.int64)
    for b, n in enumerate(lengths):
        if left:
            mask[b, S - n:] = 1
        else:
            mask[b, :n] = 1
    ids = rng.integers(1, 30000, size=mask.shape) * mask
    labels = np.where(mask == 1, ids, -100)
    labels[:, :2] = -100  # a prompt that carries no loss
    if torch_in:
        return {"input_ids": torch.as_tensor(ids), "attention_mask": torch.as_tensor(mask),
                "labels": torch.as_tensor(labels)}
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _tokens(bundle, x):
    """Real tokens of a per-token tensor of the bundle, in row-major order."""
    m = np.asarray(bundle.attention_mask_2d).astype(bool)
    return np.asarray(x)[m]


def _dense_keep(bundle):
    """The attention predicate the bundle hands its kernel, as a dense keep matrix over real tokens."""
    b = bundle
    lay = b.layout
    if b.backend == "sdpa":
        dense = np.asarray(b.attention_mask)[:, 0]
    elif b.backend == "eager":
        dense = np.asarray(b.attention_mask.float() if isinstance(b.attention_mask, torch.Tensor)
                           else b.attention_mask)[:, 0] == 0
    elif b.backend == "megatron" and not b.padding_free:
        dense = ~np.asarray(b.attention_mask)[:, 0]
    elif b.backend == "npu":
        findings = maskpack.validate_npu_args(**{k: v for k, v in b.npu.items() if not k.startswith("maskpack_")},
                                              query_shape=_qshape(b), head_num=4, intended=lay)
        assert findings == [], findings
        dense = np.asarray(lay.allowed())
    else:  # flash_attn / megatron padding-free: cu_seqlens describe document-causal attention
        dense = np.asarray(Layout.from_cu_seqlens(b.cu_seqlens, form="te", total=lay.q_width,
                                                  cu_padded=b.cu_seqlens_padded).allowed()) \
            if b.padding_free else np.asarray(lay.allowed())
    B, S, K = dense.shape
    whole = np.zeros((B * S, B * K), dtype=bool)  # rows never see other rows: block-diagonal over rows
    for r in range(B):
        whole[r * S:(r + 1) * S, r * K:(r + 1) * K] = dense[r]
    m = np.asarray(b.attention_mask_2d).astype(bool).reshape(-1)
    return whole[m][:, m]


def _qshape(b):
    lay = b.layout
    if b.npu["input_layout"] == "TND":
        return (lay.q_width, 4, 8)
    return (lay.n_rows, lay.q_width, 4, 8)


@pytest.mark.parametrize("backend", maskpack.batch.BACKENDS)
@pytest.mark.parametrize("left", [False, True])
def test_padded_and_padding_free_describe_the_same_tokens(backend, left):
    rng = np.random.default_rng(len(backend) * 2 + left)
    for _ in range(6):
        batch = _batch(rng, left=left)
        pad = maskpack.prepare_batch(batch, backend=backend, padding_free=False, head_dim=8)
        pf = maskpack.prepare_batch(batch, backend=backend, padding_free=True, head_dim=8)
        for name in ("input_ids", "position_ids", "labels", "shift_labels", "loss_weights"):
            np.testing.assert_array_equal(_tokens(pad, getattr(pad, name)), _tokens(pf, getattr(pf, name)), err_msg=name)
        assert isinstance(pf.input_ids, torch.Tensor)  # torch in, torch out
        np.testing.assert_array_equal(_dense_keep(pad), _dense_keep(pf))
        # the 2D mask for GDN/RoPE consumers is always present, whatever the attention backend wants
        assert pad.attention_mask_2d is not None and pf.attention_mask_2d is not None
        # last tokens point at the same token ids
        ids_pad = np.asarray(pad.input_ids).reshape(-1)[np.asarray(pad.last_token_index)]
        ids_pf = np.asarray(pf.input_ids).reshape(-1)[np.asarray(pf.last_token_index)]
        np.testing.assert_array_equal(ids_pad, ids_pf)


@pytest.mark.parametrize("padding_free", [False, True])
@pytest.mark.parametrize("cp,tp", [(2, 1), (4, 1), (2, 4)])
def test_cp_ranks_reassemble_and_losses_agree(padding_free, cp, tp):
    rng = np.random.default_rng(cp * 7 + tp + padding_free)
    for _ in range(5):
        batch = _batch(rng, left=bool(rng.integers(0, 2)), torch_in=False)
        whole = maskpack.prepare_batch(batch, backend="sdpa", padding_free=padding_free)
        ranks = [maskpack.prepare_batch(batch, backend="sdpa", padding_free=padding_free, cp=cp, tp=tp, cp_rank=r)
                 for r in range(cp)]
        # every rank's local length divides by tp (sequence parallel) and all ranks hold the same count
        sizes = {np.asarray(r.input_ids).size for r in ranks}
        assert len(sizes) == 1 and (sizes.pop() // (1 if padding_free else ranks[0].layout.n_rows)) % tp == 0
        # a per-token "model output" computed on each rank goes back to the dataloader's layout
        parts = [np.asarray(r.input_ids, dtype=np.float64) * 2 + np.asarray(r.position_ids) for r in ranks]
        back = ranks[0].to_padded(parts[0], parts=parts, pad_value=-1)
        ref = whole.to_padded(np.asarray(whole.input_ids, dtype=np.float64) * 2 + np.asarray(whole.position_ids),
                              pad_value=-1)
        np.testing.assert_array_equal(back, ref)
        # sum of per-rank weighted losses == the unsharded mean, exactly (up to float32 weights)
        loss = rng.random(np.asarray(batch["input_ids"]).shape)
        lw = whole.source_layout
        loss_parts = [maskpack.relayout(loss, lw, r.layout) for r in ranks]
        total = sum((lp * np.asarray(r.loss_weights, dtype=np.float64)).sum() for lp, r in zip(loss_parts, ranks))
        ref_loss = (maskpack.relayout(loss, lw, whole.layout) * np.asarray(whole.loss_weights, np.float64)).sum()
        assert abs(total - ref_loss) < 1e-6
        # each sequence's last token sits on exactly one rank
        owners = np.stack([np.asarray(r.last_token_index) >= 0 for r in ranks])
        assert (owners.sum(axis=0) == 1).all()
        # the 2D mask is split along the sequence like every other per-token tensor (docs/conventions.md section 7)
        assert sum(int(np.asarray(r.attention_mask_2d).sum()) for r in ranks) == int(np.asarray(batch["attention_mask"]).sum())


def test_inputs_other_than_a_2d_mask():
    pos = torch.tensor([0, 1, 2, 0, 1, 0, 0, 0])  # two sequences, then a tail pad written as zeros
    b = maskpack.prepare_batch({"input_ids": torch.arange(8)[None], "position_ids": pos[None]}, backend="flash_attn",
                               padding_free=True)
    assert b.cu_seqlens.tolist() == [0, 3, 5]  # the tail pad is not a run of length-1 sequences
    cu = maskpack.prepare_batch({"input_ids": torch.arange(6)[None], "cu_seqlens": torch.tensor([0, 4, 6],
                                dtype=torch.int32)}, backend="npu", padding_free=True, head_dim=64)
    assert cu.npu["actual_seq_qlen"] == [4, 6] and cu.npu["sparse_mode"] in (2, 3)
    m4 = ~torch.tril(torch.ones(5, 5, dtype=torch.bool))[None, None]
    with pytest.raises(maskpack.Error) as e:  # a 4D mask without its convention is never guessed
        maskpack.prepare_batch({"input_ids": torch.arange(5)[None], "attention_mask": m4})
    assert e.value.status == "MASKPACK_ERR_CONVENTION"
    ok = maskpack.prepare_batch({"input_ids": torch.arange(5)[None], "attention_mask": m4}, mask_convention="masked",
                                backend="eager")
    assert ok.attention_mask.shape == (1, 1, 5, 5)
    with pytest.raises(maskpack.Error):
        maskpack.prepare_batch({"input_ids": torch.arange(5)[None]}, backend="npu")  # no head_dim: scale 1.0 trap
    with pytest.raises(maskpack.Error):
        maskpack.prepare_batch({"input_ids": torch.arange(5)[None]}, cp=2, cp_rank=2)


def test_hf_kwargs_train_a_transformers_model_padded_and_padding_free_alike():
    """The bundle's hf_kwargs() run a (tiny, maskpack-patched) transformers Qwen3.5 causal LM:
    padded and padding-free give the logits of transformers' own padded run, and the loss from
    shift_labels and loss_weights is transformers' own loss from the labels."""
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    torch.manual_seed(11)
    cfg = Qwen3_5TextConfig(hidden_size=48, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                            linear_value_head_dim=8, linear_conv_kernel_dim=4, num_hidden_layers=4,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=32,
                            vocab_size=64, rms_norm_eps=1e-6)
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(cfg).eval()
    lengths, S = [9, 4, 13], 15
    mask = torch.zeros(len(lengths), S, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    ids = torch.randint(1, cfg.vocab_size, mask.shape) * mask
    labels = torch.where(mask == 1, ids, torch.full_like(ids, -100))
    labels[:, :2] = -100
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    keep = mask.bool()
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, labels=labels, use_cache=False)
        assert maskpack.patch_linear_attention(model) == 3
        for padding_free in (False, True):
            bundle = maskpack.prepare_batch(batch, backend="sdpa", padding_free=padding_free)
            kw = bundle.hf_kwargs()
            assert ("cu_seq_lens_q" in kw) == padding_free and kw["input_ids"].dim() == 2
            logits = model(**kw).logits
            flat = logits[0] if padding_free else logits
            back = bundle.to_padded(flat)
            assert back.shape == ref.logits.shape
            err = (back[keep] - ref.logits[keep]).abs().max() / ref.logits[keep].abs().max()
            assert err < 1e-5, (padding_free, err)
            per_token = torch.nn.functional.cross_entropy(flat.reshape(-1, flat.shape[-1]),
                                                          bundle.shift_labels.reshape(-1), ignore_index=-100,
                                                          reduction="none")
            loss = (per_token * bundle.loss_weights.reshape(-1)).sum()
            assert abs(loss.item() - ref.loss.item()) < 1e-5 * abs(ref.loss.item()), (padding_free, loss, ref.loss)
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch(batch, backend="sdpa", padding_free=True, cp=2, cp_rank=0).hf_kwargs()
    assert e.value.status == "MASKPACK_ERR_UNSUPPORTED" and e.value.argument == "cp"


# ---- the bundle against expectations computed with numpy from the input batch alone ------------


def _batch_with_empty_rows(rng, left):
    """A right- or left-padded batch whose rows include empty ones (all padding)."""
    lengths = rng.integers(0, 16, size=rng.integers(2, 6))
    lengths[rng.integers(0, len(lengths))] = 0  # at least one empty row
    lengths[rng.integers(0, len(lengths))] = max(1, int(lengths.max()))  # and a real one
    S = int(lengths.max()) + int(rng.integers(0, 3))
    mask = np.zeros((len(lengths), S), dtype=np.int64)
    for b, n in enumerate(lengths):
        mask[b, S - n:S] = 1 if left else 0
        if not left:
            mask[b, :n] = 1
    ids = rng.integers(1, 30000, size=mask.shape) * mask
    labels = np.where(mask == 1, ids, -100)
    labels[rng.random(labels.shape) < 0.2] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _numpy_expectations(batch):
    """What every bundle must hold, from the batch alone: the real tokens in row-major order, their
    positions, next-token labels inside each row's sequence, token-mode loss weights, the
    document-causal keep matrix over real tokens, cu_seqlens of the non-empty rows, last tokens."""
    ids, mask, labels = (np.asarray(batch[k]) for k in ("input_ids", "attention_mask", "labels"))
    m = mask.astype(bool)
    lengths = m.sum(1)
    seq_of = np.concatenate([np.full(n, b) for b, n in enumerate(lengths)]).astype(np.int64)
    pos = np.concatenate([np.arange(n) for n in lengths]).astype(np.int64)
    shift = np.concatenate([np.append(labels[b][m[b]][1:], -100) if n else np.zeros(0, np.int64)
                            for b, n in enumerate(lengths)])
    n_lab = int((shift != -100).sum())
    keep = (seq_of[:, None] == seq_of[None, :]) & (pos[None, :] <= pos[:, None])
    keep4d = np.zeros((m.shape[0], 1, m.shape[1], m.shape[1]), bool)  # padded: pads see and are seen by nothing
    for b in range(m.shape[0]):
        cols = np.flatnonzero(m[b])
        keep4d[b, 0][np.ix_(cols, cols)] = np.tril(np.ones((len(cols), len(cols)), bool))
    nz = lengths[lengths > 0]
    return dict(ids=ids[m], pos=pos, labels=labels[m], shift=shift, n_lab=n_lab,
                weights=np.where(shift != -100, 1.0 / max(n_lab, 1), 0.0), keep=keep, keep4d=keep4d, mask=mask,
                cu=np.concatenate([[0], np.cumsum(nz)]), max_len=int(nz.max()),
                last_padded=np.array([b * m.shape[1] + np.flatnonzero(m[b])[-1] for b in range(m.shape[0]) if lengths[b]]),
                last_packed=np.cumsum(nz) - 1)


@pytest.mark.parametrize("backend", maskpack.batch.BACKENDS)
@pytest.mark.parametrize("padding_free", [False, True])
def test_bundle_matches_numpy_expectations(backend, padding_free):
    rng = np.random.default_rng(3 + len(backend) + 10 * padding_free)
    for trial in range(6):
        batch = _batch_with_empty_rows(rng, left=bool(trial % 2))
        want = _numpy_expectations(batch)
        b = maskpack.prepare_batch(batch, backend=backend, padding_free=padding_free, head_dim=8)
        np.testing.assert_array_equal(_tokens(b, b.input_ids), want["ids"])
        np.testing.assert_array_equal(_tokens(b, b.position_ids), want["pos"])
        np.testing.assert_array_equal(_tokens(b, b.labels), want["labels"])
        np.testing.assert_array_equal(_tokens(b, b.shift_labels), want["shift"])
        np.testing.assert_allclose(_tokens(b, b.loss_weights), want["weights"], rtol=1e-6)
        assert b.loss_denominator == want["n_lab"]
        # every pad slot carries no loss and is ignored
        pads = ~np.asarray(b.attention_mask_2d).astype(bool)
        assert (np.asarray(b.shift_labels)[pads] == -100).all() and (np.asarray(b.loss_weights)[pads] == 0).all()
        np.testing.assert_array_equal(np.asarray(b.last_token_index),
                                      want["last_packed"] if padding_free else want["last_padded"])
        if padding_free:
            np.testing.assert_array_equal(np.asarray(b.cu_seqlens), want["cu"])
            assert b.max_seqlen == want["max_len"]
        # the mask each backend hands its kernel, against the numpy one
        am = b.attention_mask
        if backend == "sdpa":
            got = np.asarray(am)
            np.testing.assert_array_equal(got[0, 0] if padding_free else got,
                                          want["keep"] if padding_free else want["keep4d"])
        elif backend == "eager":
            got = np.asarray(am.float() if isinstance(am, torch.Tensor) else am)
            neg = np.finfo(np.float32).min
            np.testing.assert_array_equal(got[0, 0] if padding_free else got,
                                          np.where(want["keep"] if padding_free else want["keep4d"], 0.0, neg))
        elif backend == "megatron":
            assert am is None if padding_free else np.array_equal(np.asarray(am), ~want["keep4d"])
        elif backend == "flash_attn":
            assert am is None if padding_free else np.array_equal(np.asarray(am), want["mask"])
        elif backend == "mindspeed":  # causal: no dense mask (MindSpeed builds its own); NPU-form slot ends
            kw = b.mindspeed_kwargs()
            assert am is None and kw["attention_mask"] is None
            np.testing.assert_array_equal(np.asarray(kw["attention_mask_2d"]), np.asarray(b.attention_mask_2d))
            if padding_free:
                assert list(kw["actual_seq_len"]) == list(kw["actual_seq_len_local"]) == want["cu"][1:].tolist()
            else:
                assert kw["actual_seq_len"] is None
        else:  # npu: TND cumulative ends of the non-empty sequences, causal bottom-right (mode 3)
            if padding_free:
                assert b.npu["input_layout"] == "TND" and b.npu["sparse_mode"] == 3
                assert list(b.npu["actual_seq_qlen"]) == want["cu"][1:].tolist()
                assert list(b.npu["actual_seq_kvlen"]) == want["cu"][1:].tolist()
            else:
                assert b.npu["input_layout"] == "BSND"
                np.testing.assert_array_equal(np.asarray(b.npu["atten_mask"]), ~want["keep4d"])
