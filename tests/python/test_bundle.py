"""prepare_batch reads every form a dataloader hands over and drops nothing: transformers' flattening
collator (cu_seq_lens_q/k, seq_idx, position ids), M-RoPE position ids, other per-token keys,
inputs_embeds; disagreeing descriptions are refused at the first token where they disagree; fields are
built only when read; each consumer's argument set. Expectations are computed here from the input
batch (numpy), not from the library."""

import numpy as np
import pytest
import torch
from transformers import DataCollatorWithFlattening

import maskpack


def _seqs_of(bundle):
    """The token ids of each sequence of a padding-free bundle (cp = 1), from its cu_seqlens."""
    ids = np.asarray(bundle.input_ids).reshape(-1)
    cu = np.asarray(bundle.cu_seqlens)
    return [ids[a:b].tolist() for a, b in zip(cu[:-1], cu[1:])]


@pytest.mark.parametrize("kw", [dict(return_flash_attn_kwargs=True), dict(return_flash_attn_kwargs=True,
                                return_position_ids=False), dict(return_seq_idx=True)])
def test_flattening_collator_keeps_every_sequence(kw):
    examples = [{"input_ids": [5, 6, 7]}, {"input_ids": [8]}, {"input_ids": [9]}]
    batch = DataCollatorWithFlattening(**kw)(examples)
    b = maskpack.prepare_batch(batch, padding_free=True)
    assert _seqs_of(b) == [[5, 6, 7], [8], [9]]
    # the shifted labels never cross a sequence: only 5->6 and 6->7 are predicted
    assert np.asarray(b.shift_labels).tolist() == [6, 7, -100, -100, -100]
    ones = DataCollatorWithFlattening(**kw)([{"input_ids": [1]}, {"input_ids": [2]}])
    b1 = maskpack.prepare_batch(ones, padding_free=True)
    assert _seqs_of(b1) == [[1], [2]] and b1.source_layout.n_segments == 2


def test_collator_position_ids_feed_a_transformers_loss_unchanged():
    """hf_kwargs(labels=True) of the flattened batch gives a tiny Llama the padded batch's loss."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    seqs = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13]]
    S = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (S - len(s)) for s in seqs])
    mask = (torch.arange(S)[None] < torch.tensor([len(s) for s in seqs])[:, None]).long()
    labels = torch.where(mask.bool(), ids, -100)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        flat = DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": s} for s in seqs])
        b = maskpack.prepare_batch(flat, padding_free=True)
        kw = b.hf_kwargs(labels=True)
        assert kw["input_ids"].shape == (1, 11) and torch.equal(kw["cu_seq_lens_q"], flat["cu_seq_lens_q"])
        got = model(**kw).loss
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_mrope_position_ids_are_kept_and_moved():
    # Qwen-VL style: 3 rows (temporal, height, width); an image run makes them differ from 0..n-1
    pos = torch.tensor([[[0, 1, 2, 2, 2, 5], [0, 1, 2, 3, 0, 0]],
                        [[0, 1, 2, 3, 3, 5], [0, 1, 2, 3, 0, 0]],
                        [[0, 1, 2, 4, 4, 5], [0, 1, 2, 3, 0, 0]]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    ids = torch.arange(12).reshape(2, 6)
    b = maskpack.prepare_batch({"input_ids": ids, "attention_mask": mask, "position_ids": pos})
    assert torch.equal(torch.as_tensor(b.position_ids), pos * mask)  # given ids, pads 0
    pf = maskpack.prepare_batch({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, padding_free=True)
    want = torch.cat([pos[:, 0, :6], pos[:, 1, :4]], dim=1)  # [3, T]
    assert torch.equal(torch.as_tensor(pf.position_ids), want)
    kw = pf.hf_kwargs()
    assert kw["position_ids"].shape == (3, 1, 10)
    # recompute_position_ids=True asks for derived ones
    rb = maskpack.prepare_batch({"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                                recompute_position_ids=True)
    assert np.asarray(rb.position_ids).tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 0, 0]]


def test_other_keys_move_or_pass_through():
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])
    ids = torch.tensor([[0, 1, 2, 3], [4, 5, 0, 0]])
    tt = torch.tensor([[9, 1, 1, 2], [3, 3, 9, 9]])
    emb = torch.randn(2, 4, 5)
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt, "inputs_embeds": emb,
             "pixel_values": torch.randn(3, 7), "task": "chat"}
    b = maskpack.prepare_batch(batch, padding_free=True)
    keep = mask.bool()
    assert torch.equal(torch.as_tensor(b.tokens["token_type_ids"]), tt[keep])
    assert torch.equal(b.inputs_embeds, emb[keep])
    assert b.passthrough_keys == ["pixel_values", "task"] and b.passthrough["task"] == "chat"
    kw = b.hf_kwargs()
    assert kw["token_type_ids"].shape == (1, 5) and kw["inputs_embeds"].shape == (1, 5, 5)


def test_inputs_embeds_without_input_ids():
    emb = torch.randn(2, 3, 4)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    labels = torch.tensor([[7, 8, -100], [1, 2, 3]])
    b = maskpack.prepare_batch({"inputs_embeds": emb, "attention_mask": mask, "labels": labels}, padding_free=True)
    assert b.input_ids is None and b.inputs_embeds.shape == (5, 4)
    assert np.asarray(b.shift_labels).tolist() == [8, -100, 2, 3, -100]
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch({"inputs_embeds": emb, "attention_mask": mask})
    assert e.value.argument == "labels"
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch({"attention_mask": mask})
    assert e.value.status == "MASKPACK_ERR_NOT_FOUND"


def test_disagreeing_descriptions_name_the_first_token():
    ids = torch.arange(7)[None]
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    with pytest.raises(maskpack.Error) as e:  # position ids restart one token late
        maskpack.prepare_batch({"input_ids": ids, "cu_seqlens": cu, "position_ids": torch.tensor([[0, 1, 2, 3, 0, 1, 2]])})
    assert e.value.argument == "position_ids" and e.value.index == (3,)
    with pytest.raises(maskpack.Error) as e:  # position ids run on across a boundary
        maskpack.prepare_batch({"input_ids": ids, "cu_seq_lens_q": cu, "position_ids": torch.arange(7)[None]})
    assert e.value.argument == "position_ids" and e.value.index == (3,)
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch({"input_ids": ids, "cu_seqlens": cu, "cu_seq_lens_q": torch.tensor([0, 4, 7])})
    assert e.value.argument == "cu_seq_lens_q" and e.value.index == (3,)
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch({"input_ids": ids, "cu_seq_lens_q": cu, "cu_seq_lens_k": torch.tensor([0, 3, 6])})
    assert e.value.argument == "cu_seq_lens_k"
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch({"input_ids": ids, "seq_idx": torch.tensor([[0, 0, 1, 1, 1, 2, 2]]), "cu_seqlens": cu})
    assert e.value.argument == "seq_idx" and e.value.index == (2,)
    with pytest.raises(maskpack.Error) as e:  # a mask that calls a token padding where cu_seqlens has a token
        maskpack.prepare_batch({"input_ids": ids, "cu_seqlens": cu, "attention_mask": torch.tensor([[1] * 6 + [0]])})
    assert e.value.argument == "attention_mask" and e.value.index == (6,)
    # agreeing descriptions are fine
    ok = maskpack.prepare_batch({"input_ids": ids, "cu_seqlens": cu, "seq_idx": torch.tensor([[0, 0, 0, 1, 1, 1, 1]]),
                                 "position_ids": torch.tensor([[0, 1, 2, 0, 1, 2, 3]])}, padding_free=True)
    assert _seqs_of(ok) == [[0, 1, 2], [3, 4, 5, 6]]


@pytest.mark.parametrize("cp", [2, 4])
def test_max_seqlen_is_the_padded_slot_under_cp(cp):
    lengths = [5, 11, 2]
    batch = {"input_ids": torch.arange(18)[None],
             "cu_seqlens": torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)}
    m = 2 * cp  # verl's alignment at tp = 1
    slots = [-(-n // m) * m for n in lengths]
    for r in range(cp):
        b = maskpack.prepare_batch(batch, padding_free=True, cp=cp, cp_rank=r)
        assert b.max_seqlen == max(slots)  # >= what any rank holds of a sequence, times cp
        p = b.megatron_packed_seq_params()
        assert p["qkv_format"] == "thd" and p["max_seqlen_q"] == p["max_seqlen_kv"] == max(slots)
        assert p["cu_seqlens_q"].tolist() == [0, 5, 16, 18] and p["cu_seqlens_q"].dtype == torch.int32
        assert p["cu_seqlens_q_padded"].tolist() == list(np.concatenate([[0], np.cumsum(slots)]))
    one = maskpack.prepare_batch(batch, padding_free=True)
    assert one.max_seqlen == 11 and one.megatron_packed_seq_params()["max_seqlen_q"] == 11
    assert maskpack.prepare_batch(batch, padding_free=True, max_seqlen=64).max_seqlen == 64


def test_fields_are_built_on_first_access_only():
    batch = {"input_ids": torch.ones(1, 4096, dtype=torch.long),
             "cu_seqlens": torch.tensor([0, 1000, 4096], dtype=torch.int32)}
    b = maskpack.prepare_batch(batch, backend="sdpa", padding_free=True)
    kw = b.hf_kwargs()
    assert "attention_mask" not in kw and "attention_mask" not in b.__dict__  # no [1,1,T,T] mask built
    m = b.attention_mask  # built when read
    assert m.shape == (1, 1, 4096, 4096) and "attention_mask" in b.__dict__
    assert b.attention_mask is m  # and kept


def test_consumer_argument_sets():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    batch = {"input_ids": torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]]), "attention_mask": mask}
    pf = maskpack.prepare_batch(batch, padding_free=True, backend="npu", head_dim=64)
    fa = pf.flash_attn_kwargs()
    assert fa["cu_seqlens_q"].tolist() == [0, 3, 5] and fa["max_seqlen_q"] == 3 and fa["cu_seqlens_q"].dtype == torch.int32
    fla = pf.fla_kwargs()
    assert fla["cu_seqlens"].tolist() == [0, 3, 5] and fla["cu_seqlens"].dtype == torch.int64
    npu = pf.npu_kwargs()
    assert not any(k.startswith("maskpack_") for k in npu) and "pre_tockens" in npu
    assert npu["actual_seq_qlen"] == [3, 5] and npu["input_layout"] == "TND"
    padded = maskpack.prepare_batch(batch, backend="eager")
    keep = torch.as_tensor(padded.sdpa_mask())
    assert keep.shape == (2, 1, 4, 4) and keep.dtype == torch.bool
    # the keep mask from the definition: causal within the real tokens
    want = torch.zeros(2, 1, 4, 4, dtype=torch.bool)
    for b, n in enumerate([3, 2]):
        want[b, 0, :n, :n] = torch.tril(torch.ones(n, n, dtype=torch.bool))
    assert torch.equal(keep, want)
    add = torch.as_tensor(padded.eager_mask("bfloat16"))
    assert add.dtype == torch.bfloat16 and torch.equal(add == 0, want)
    assert torch.equal(torch.as_tensor(padded.attention_mask).to(torch.float32),
                       torch.as_tensor(padded.eager_mask("float32")))
    assert padded.fla_kwargs()["attention_mask"].tolist() == mask.tolist()
    with pytest.raises(maskpack.Error):
        padded.megatron_packed_seq_params()
    empty = maskpack.prepare_batch({"input_ids": torch.zeros(2, 3, dtype=torch.long),
                                    "attention_mask": torch.tensor([[1, 1, 0], [0, 0, 0]])})
    # an all-zero row holds no sequence: one last token (row 0's), and the empty row is named
    assert empty.empty_rows == [1] and np.asarray(empty.last_token_index).tolist() == [1]


def test_compressed_npu_mask_is_built_once_per_process():
    a = maskpack.Layout.from_lengths([3, 5], placement="packed").npu_args("TND", head_dim=64)
    b = maskpack.Layout.from_lengths([7, 1, 2], placement="packed").npu_args("TND", head_dim=64)
    assert a["maskpack_mask_kind"] == b["maskpack_mask_kind"] == "compressed"
    assert a["atten_mask"] is b["atten_mask"]
    # the operator's documented compressed mask: the strict upper triangle of 2048 x 2048 is masked
    want = np.triu(np.ones((2048, 2048), dtype=bool), k=1)
    assert np.array_equal(np.asarray(a["atten_mask"]), want)


def _examples():
    return [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "token_type_ids": [1, 1, 2], "source": "a"},
            {"input_ids": [8], "labels": [-100], "token_type_ids": [3], "source": "b"},
            {"input_ids": [9, 10, 11, 12, 13], "labels": [-100, 10, 11, 12, 13], "token_type_ids": [4] * 5,
             "source": "c"}]


def test_collator_padded_packed_and_rows():
    ex = _examples()
    padded = maskpack.Collator(pad_to_multiple_of=4)(ex)
    assert padded.input_ids.shape == (3, 8)  # longest 5, rounded to 8
    # the padded mask covers each example's tokens exactly: one more would make a pad token real
    assert np.asarray(padded.attention_mask_2d).tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0],
                                                             [1, 1, 1, 1, 1, 0, 0, 0]]
    assert [int(n) for n in np.asarray(padded.source_layout.seqlens)] == [3, 1, 5]
    assert padded.input_ids[2].tolist() == [9, 10, 11, 12, 13, 0, 0, 0]
    assert padded.tokens["token_type_ids"][0].tolist() == [1, 1, 2, 0, 0, 0, 0, 0]
    assert padded.passthrough["source"] == ["a", "b", "c"]
    packed = maskpack.Collator(padding_free=True)(ex)
    assert _seqs_of(packed) == [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    assert np.asarray(packed.shift_labels).tolist() == [6, 7, -100, -100, 10, 11, 12, 13, -100]
    assert packed.tokens["token_type_ids"].tolist() == [1, 1, 2, 3, 4, 4, 4, 4, 4]
    rows = maskpack.Collator(capacity=6)(ex)  # whole examples into rows of 6 tokens
    lay = rows.source_layout
    assert lay.q_width == 6 and sorted(int(n) for n in np.asarray(lay.seqlens)) == [1, 3, 5]
    ids = np.asarray(rows.input_ids)
    got = sorted(ids[r, qs:qs + ql].tolist() for r, qs, ql, _, _ in lay.segments)
    assert got == [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    # attention never crosses two examples of one row
    allowed = np.asarray(lay.allowed())
    seg = np.asarray(lay.with_outputs("numpy").segment_ids())
    for r in range(lay.n_rows):
        for i in range(6):
            for j in range(6):
                if allowed[r, i, j]:
                    assert seg[r, i] == seg[r, j] != 0 and j <= i
    with pytest.raises(maskpack.Error) as e:
        maskpack.Collator(capacity=4)(ex)
    assert e.value.argument == "capacity" and e.value.index == (2,)


def test_collator_pickles_into_dataloader_workers():
    import pickle

    col = maskpack.Collator(padding_free=True, backend="sdpa")
    assert repr(pickle.loads(pickle.dumps(col))) == repr(col)
    data = _examples() * 4
    loader = torch.utils.data.DataLoader(data, batch_size=3, collate_fn=col, num_workers=2)
    seen = []
    for bundle in loader:
        assert isinstance(bundle, maskpack.Batch)
        seen.extend(_seqs_of(bundle))
    assert seen == [[5, 6, 7], [8], [9, 10, 11, 12, 13]] * 4


def test_rough_edges():
    # one padding rule: cp = 1 pads to tp alone, as cp_multiple says
    assert maskpack.cp_multiple(1, 2, "verl") == 2 and maskpack.cp_multiple(2, 2, "verl") == 8
    b = maskpack.prepare_batch({"input_ids": torch.arange(7)[None], "cu_seqlens": torch.tensor([0, 3, 7])},
                               padding_free=True, tp=2)
    assert b.cu_seqlens_padded.tolist() == [0, 4, 8]
    # align=None: accepted where every slot already divides, refused (naming the problem) where not
    ok = maskpack.prepare_batch({"input_ids": torch.arange(8)[None], "cu_seqlens": torch.tensor([0, 4, 8])},
                                padding_free=True, cp=2, cp_rank=1, align=None)
    assert ok.input_ids.shape == (4,)
    with pytest.raises(maskpack.Error):
        maskpack.prepare_batch({"input_ids": torch.arange(7)[None], "cu_seqlens": torch.tensor([0, 3, 7])},
                               padding_free=True, cp=2, cp_rank=0, align=None)
    # bfloat16 loss weights: the float32 weights rounded once
    lay = maskpack.Layout.from_lengths([3, 4], placement="packed").with_outputs("torch")
    w16 = lay.loss_weights(dtype=torch.bfloat16)
    assert w16.dtype == torch.bfloat16 and torch.equal(w16, lay.loss_weights().to(torch.bfloat16))
    assert torch.equal(lay.loss_weights(dtype="bfloat16", engine="torch"), w16)
    with pytest.raises(maskpack.Error):
        lay.loss_weights(dtype="int32")
    # attention takes threads= like every other call (n_threads= stays an alias)
    q = torch.randn(7, 2, 8)
    o1, _ = maskpack.attention(q, q, q, lay, threads=1)
    o2, _ = maskpack.attention(q, q, q, lay, n_threads=1)
    assert torch.equal(o1, o2)
    with pytest.raises(maskpack.Error):
        maskpack.attention(q, q, q, lay, threads=1, n_threads=2)


@pytest.mark.parametrize("cp", [2, 4])
def test_ulysses_split_pads_only_the_total(cp):
    """Ulysses (verl's ulysses_pad_and_slice_inputs): the packed stream is padded only at its end to a
    multiple of cp and cut into cp contiguous pieces; expectations from that definition."""
    lengths = [5, 3, 6]
    T = sum(lengths)
    Tp = -(-T // cp) * cp
    ids = torch.arange(1, T + 1)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    batch = {"input_ids": ids[None], "cu_seqlens": cu}
    stream = torch.cat([ids, torch.zeros(Tp - T, dtype=ids.dtype)])
    per = Tp // cp
    parts = []
    for r in range(cp):
        b = maskpack.prepare_batch(batch, padding_free=True, cp=cp, cp_rank=r, cp_scheme="ulysses")
        assert torch.equal(torch.as_tensor(b.input_ids), stream[r * per:(r + 1) * per])
        assert b.max_seqlen == max(lengths)
        idx = np.asarray(b.source_layout.cp_shard_indices(cp, r, scheme="ulysses"))
        assert idx.tolist() == list(range(r * per, (r + 1) * per))
        parts.append(b.input_ids)
    whole = b.to_padded(parts[-1], parts=parts)
    assert torch.equal(torch.as_tensor(whole), ids)
    # the last token of each sequence: on the rank whose piece holds its end
    rank, local = b.source_layout.cp_last_token(cp, scheme="ulysses")
    ends = np.cumsum(lengths) - 1
    assert np.asarray(rank).tolist() == (ends // per).tolist()
    assert np.asarray(local).tolist() == (ends % per).tolist()


def test_mtp_labels_roll_inside_sequences():
    labels = torch.tensor([10, 11, 12, 13, 20, 21, 22])
    batch = {"input_ids": labels[None], "cu_seqlens": torch.tensor([0, 4, 7]), "labels": labels[None]}
    b = maskpack.prepare_batch(batch, padding_free=True)
    assert np.asarray(b.shift_labels).tolist() == [11, 12, 13, -100, 21, 22, -100]
    assert np.asarray(b.mtp_labels(1)).tolist() == [12, 13, -100, -100, 22, -100, -100]
    assert np.asarray(b.mtp_labels(2)).tolist() == [13, -100, -100, -100, -100, -100, -100]
    lay = b.source_layout
    assert torch.equal(lay.shift_labels(labels, shift=2, engine="torch"), lay.shift_labels(labels, shift=2))
    with pytest.raises(maskpack.Error):
        lay.shift_labels(labels, shift=0)
    # on a CP rank: the rolled labels are that rank's shard of the whole's
    parts = [maskpack.prepare_batch(batch, padding_free=True, cp=2, cp_rank=r).mtp_labels(1) for r in range(2)]
    whole = maskpack.prepare_batch(batch, padding_free=True, cp=2, cp_rank=0).to_padded(parts[0], parts=parts,
                                                                                          pad_value=-100)
    assert np.asarray(whole).tolist() == [12, 13, -100, -100, 22, -100, -100]


@pytest.mark.parametrize("cp,scheme", [(1, "zigzag"), (2, "zigzag"), (2, "ulysses"), (4, "contiguous")])
def test_pad_to_multiple_of_for_fp8(cp, scheme):
    lengths = [5, 3, 6]
    ids = torch.arange(1, 15)
    batch = {"input_ids": ids[None], "cu_seqlens": torch.tensor(np.concatenate([[0], np.cumsum(lengths)])),
             "labels": ids[None]}
    parts = []
    for r in range(cp):
        b = maskpack.prepare_batch(batch, padding_free=True, cp=cp, cp_rank=r, cp_scheme=scheme, pad_to_multiple_of=16)
        n = b.input_ids.shape[0]
        assert n % 16 == 0, n  # every rank's token count
        parts.append(b.input_ids)
        assert float(torch.as_tensor(b.loss_weights).sum()) <= 1.0 + 1e-6
    back = b.to_padded(parts[-1], parts=parts if cp > 1 else None)
    assert torch.equal(torch.as_tensor(back), ids)  # nothing lost, nothing added


def test_block_mask_matches_torch_create_block_mask_at_the_grid_end():
    """A block cut short by the end of the grid is partial, as torch's create_block_mask classifies it
    (it pads the predicate to whole blocks with False)."""
    from torch.nn.attention.flex_attention import create_block_mask

    for lengths, S, blk in (([5, 3], 5, 2), ([7, 2, 6], 7, 4), ([3], 3, 2)):
        lay = maskpack.Layout.from_lengths(lengths, placement="right", capacity=S).with_outputs("torch")
        allowed = lay.allowed()

        def mask_mod(b, h, q, kv):
            return allowed[b, q, kv]

        ref = create_block_mask(mask_mod, len(lengths), 1, S, S, device="cpu", BLOCK_SIZE=blk)
        ours = lay.block_mask(blk, blk)
        for name in ("kv_num_blocks", "full_kv_num_blocks"):
            assert torch.equal(ours[name].to(torch.int32), getattr(ref, name).to(torch.int32)), (lengths, name)
        for name, count in (("kv_indices", "kv_num_blocks"), ("full_kv_indices", "full_kv_num_blocks")):
            a, r, n = ours[name], getattr(ref, name), ours[count]
            for b in range(n.shape[0]):
                for q in range(n.shape[2]):
                    k = int(n[b, 0, q])
                    assert sorted(a[b, 0, q, :k].tolist()) == sorted(r[b, 0, q, :k].tolist()), (lengths, name, b, q)


# ---- length buckets ---------------------------------------------------------------------------------


def test_length_buckets_every_example_once_and_similar_lengths():
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 2000, size=500)
    edges = [64, 256, 1024]
    s = maskpack.LengthBucketSampler(lengths, batch_size=16, boundaries=edges, seed=1)
    batches = list(s)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(500)) and len(s) == len(batches)
    bucket = np.searchsorted(edges, lengths, side="left")
    for b in batches:
        assert 1 <= len(b) <= 16 and len({int(bucket[i]) for i in b}) == 1  # one bucket per batch
    # the padding a padded batch carries is far below that of random batches
    def waste(bs):
        return sum(len(b) * int(lengths[b].max()) - int(lengths[b].sum()) for b in bs)
    random_batches = [list(range(i, min(i + 16, 500))) for i in range(0, 500, 16)]
    assert waste(batches) < 0.5 * waste(random_batches)
    # the same seed and epoch: the same batches; another epoch: another order
    assert list(maskpack.LengthBucketSampler(lengths, batch_size=16, boundaries=edges, seed=1)) == batches
    s.set_epoch(1)
    assert list(s) != batches and sorted(i for b in s for i in b) == list(range(500))
    # drop_last: each bucket's short last batch goes
    full = list(maskpack.LengthBucketSampler(lengths, batch_size=16, boundaries=edges, drop_last=True))
    assert all(len(b) == 16 for b in full)
    assert len(full) == sum(int((bucket == k).sum()) // 16 for k in range(4))


def test_length_buckets_by_token_budget_and_equal_count_buckets():
    lengths = [5, 900, 30, 31, 870, 6, 7, 500, 33, 880] * 10
    s = maskpack.LengthBucketSampler(lengths, max_tokens=1800, n_buckets=3, shuffle=False)
    batches = list(s)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:  # examples x longest within the budget (one example alone may exceed it)
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 1800
    # equal-count buckets: the 100 examples split by sorted length, so short ones batch together
    short = [b for b in batches if max(lengths[i] for i in b) <= 33]
    assert short and sum(len(b) for b in short) >= 30


def test_length_buckets_bad_arguments_and_dataloader():
    with pytest.raises(maskpack.Error, match="batch_size, max_tokens: pass exactly one"):
        maskpack.LengthBucketSampler([3, 4])
    with pytest.raises(maskpack.Error, match=r"lengths\[1\]: expected >= 1, found 0"):
        maskpack.LengthBucketSampler([3, 0], batch_size=2)
    with pytest.raises(maskpack.Error, match="boundaries: expected increasing edges"):
        maskpack.LengthBucketSampler([3, 4], batch_size=2, boundaries=[8, 8])
    with pytest.raises(maskpack.Error, match="batch_size: expected an integer >= 1"):
        maskpack.LengthBucketSampler([3, 4], batch_size=0)
    # with a DataLoader and the collator: every batch padded to its own longest example
    data = [{"input_ids": list(range(1, n + 1))} for n in (3, 40, 4, 41, 5, 42)]
    sampler = maskpack.LengthBucketSampler([len(d["input_ids"]) for d in data], batch_size=3, boundaries=[10])
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, collate_fn=maskpack.Collator())
    widths = sorted(int(b.tokens["input_ids"].shape[1]) for b in loader)
    assert widths == [5, 42]
