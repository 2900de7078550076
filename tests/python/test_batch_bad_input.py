"""No silent wrong answer from prepare_batch, Collator and Batch (issue 32): labels or any per-token key
that does not fit the token grid is refused (never moved to the pass-through keys while the loss is
derived from input_ids); errors name the argument that is wrong; the documented position-id forms and
to_padded(x, parts=...) under CP do what they say (the live x carries the gradient). Expectations are
computed here from the input batch, not from the library."""

import os
import re
import shlex
import subprocess

import numpy as np
import pytest
import torch

import maskpack

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _padded_batch():
    ids = torch.tensor([[11, 12, 13, 14], [21, 22, 23, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    labels = torch.tensor([[-100, -100, 13, 14], [-100, 22, 23, -100]])  # an SFT prompt mask
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


# ---- labels and named per-token keys must have the token grid's shape ---------------------------


@pytest.mark.parametrize("shape", [(2, 5), (2, 2), (2, 1), (1, 4), (4,), (2, 4, 3), (8,)])
@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_labels_of_the_wrong_shape_are_refused(shape, kind):
    batch = _padded_batch()
    lab = np.full(shape, 7, dtype=np.int64)
    batch["labels"] = torch.as_tensor(lab) if kind == "torch" else lab
    if kind == "numpy":
        batch = {k: np.asarray(v) if k != "labels" else v for k, v in batch.items()}
    for padding_free in (False, True):
        with pytest.raises(maskpack.Error) as e:
            maskpack.prepare_batch(batch, padding_free=padding_free)
        assert e.value.argument == "labels" and e.value.status == "MASKPACK_ERR_SHAPE"
        msg = str(e.value)
        assert "[2, 4]" in msg and str(list(shape)) in msg, msg
        assert "input_ids" in msg  # the grid it had to match


def test_labels_that_are_not_a_tensor_are_refused():
    batch = _padded_batch()
    batch["labels"] = batch["labels"].tolist()
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch(batch)
    assert e.value.argument == "labels" and "list" in str(e.value)


def test_right_labels_keep_the_prompt_mask():
    b = maskpack.prepare_batch(_padded_batch(), padding_free=True)
    assert b.passthrough_keys == []
    # shifted inside each sequence from the given labels: the prompt (-100) carries no loss
    assert np.asarray(b.shift_labels).tolist() == [-100, 13, 14, -100, 22, 23, -100]
    assert np.asarray(b.loss_weights).tolist() == [0, 0.25, 0.25, 0, 0.25, 0.25, 0]


@pytest.mark.parametrize("ids_shape,lab_shape", [((1, 7), (7,)), ((7,), (1, 7))])
def test_one_packed_row_takes_labels_as_t_or_1_t(ids_shape, lab_shape):
    ids = torch.arange(1, 8)
    labels = torch.tensor([-100, -100, 3, -100, -100, 6, 7])
    batch = {"input_ids": ids.reshape(ids_shape), "cu_seqlens": torch.tensor([0, 3, 7]),
             "labels": labels.reshape(lab_shape)}
    b = maskpack.prepare_batch(batch, padding_free=True)
    assert "labels" not in b.passthrough
    assert np.asarray(b.labels).reshape(-1).tolist() == labels.tolist()
    assert np.asarray(b.shift_labels).tolist() == [-100, 3, -100, -100, 6, 7, -100]


def test_per_token_keys_named_by_the_caller_must_fit_the_grid():
    batch = _padded_batch()
    batch["loss_mask"] = torch.ones(2, 5)
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch(batch, per_token_keys=["loss_mask"])
    assert e.value.argument == "loss_mask" and e.value.status == "MASKPACK_ERR_SHAPE"
    assert "[2, 4]" in str(e.value) and "[2, 5]" in str(e.value)
    # unnamed, it is not per-token (its dims are not the grid) and passes through, listed
    b = maskpack.prepare_batch(batch)
    assert b.passthrough_keys == ["loss_mask"]
    # the right shape moves with the tokens (trailing dims allowed), and a named key that is absent is fine
    batch["loss_mask"] = torch.tensor([[0.0, 1, 1, 1], [1, 1, 1, 0]])[..., None].expand(2, 4, 2).contiguous()
    b = maskpack.prepare_batch(batch, padding_free=True, per_token_keys=("loss_mask", "absent"))
    assert torch.equal(torch.as_tensor(b.tokens["loss_mask"])[:, 0], torch.tensor([0.0, 1, 1, 1, 1, 1, 1]))
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch(batch, per_token_keys="loss_mask")
    assert e.value.argument == "per_token_keys"


def test_given_shift_labels_are_used_not_overwritten():
    batch = _padded_batch()
    given = torch.tensor([[-100, 13, 14, -100], [22, 23, -100, -100]])
    del batch["labels"]
    batch["shift_labels"] = given
    b = maskpack.prepare_batch(batch, padding_free=True)
    assert np.asarray(b.shift_labels).tolist() == [-100, 13, 14, -100, 22, 23, -100]
    assert np.asarray(b.loss_weights).tolist() == [0, 0.25, 0.25, 0, 0.25, 0.25, 0]
    # a multi-token-prediction head: the given shifted labels rolled once more inside each sequence
    assert np.asarray(b.mtp_labels(1)).tolist() == [13, 14, -100, -100, 23, -100, -100]
    batch["shift_labels"] = torch.tensor([[-100, 13, 14, -100], [22, 23, -100, 0]])  # a pad holding 0: no weight
    b = maskpack.prepare_batch(batch, padding_free=True)
    assert np.asarray(b.loss_weights).tolist() == [0, 0.25, 0.25, 0, 0.25, 0.25, 0]
    batch["shift_labels"] = given[:, :3]
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch(batch)
    assert e.value.argument == "shift_labels"
    # beside labels: they must be the labels shifted inside each sequence
    batch = _padded_batch()
    batch["shift_labels"] = torch.tensor([[-100, 13, 14, 21], [22, 23, -100, -100]])  # rolled across rows
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch(batch)
    assert e.value.argument == "shift_labels" and e.value.index == (3,)
    batch["shift_labels"] = torch.tensor([[-100, 13, 14, -100], [22, 23, -100, -100]])
    assert np.asarray(maskpack.prepare_batch(batch).shift_labels).tolist() == batch["shift_labels"].tolist()


# ---- Collator: every example checked -------------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(), dict(padding_free=True), dict(capacity=8)])
def test_collator_refuses_labels_of_another_length(kw):
    examples = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, {"input_ids": [4, 5, 6], "labels": [-100, 5]}]
    with pytest.raises(maskpack.Error) as e:
        maskpack.Collator(**kw)(examples)
    assert e.value.argument == "labels" and e.value.index == (1,)
    assert "examples[1]" in str(e.value) and "3" in str(e.value) and "2" in str(e.value)


def test_collator_refuses_labels_missing_from_some_examples():
    for examples, bad in [([{"input_ids": [1, 2], "labels": [-100, 2]}, {"input_ids": [3, 4]}], 1),
                          ([{"input_ids": [1, 2]}, {"input_ids": [3, 4], "labels": [-100, 4]}], 0)]:
        with pytest.raises(maskpack.Error) as e:
            maskpack.Collator()(examples)
        assert e.value.argument == "labels" and e.value.index == (bad,)


def test_collator_named_per_token_keys_and_pass_through():
    ex = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3], "loss_mask": [0, 1, 1], "meta": "a"},
          {"input_ids": [4, 5], "labels": [-100, 5], "loss_mask": [1], "meta": "b"}]
    b = maskpack.Collator()(ex)  # loss_mask is not per-token in every example: it passes through, listed
    assert b.passthrough_keys == ["loss_mask", "meta"] and b.passthrough["meta"] == ["a", "b"]
    assert np.asarray(b.shift_labels).tolist() == [[2, 3, -100], [5, -100, -100]]
    with pytest.raises(maskpack.Error) as e:
        maskpack.Collator(per_token_keys=["loss_mask"])(ex)
    assert e.value.argument == "loss_mask" and e.value.index == (1,)


@pytest.mark.parametrize("ex,status", [({"input_ids": []}, "MASKPACK_ERR_SHAPE"),
                                       ({"input_ids": [1.5, 2.0]}, "MASKPACK_ERR_DTYPE"),
                                       ({"input_ids": [[1, 2], [3, 4]]}, "MASKPACK_ERR_SHAPE"),
                                       ({"input_ids": 3}, "MASKPACK_ERR_SHAPE")])
def test_collator_bad_input_ids_are_named(ex, status):
    for with_labels in (False, True):
        good = {"input_ids": [1, 2]}
        bad = dict(ex)
        if with_labels:
            good["labels"] = [1, 2]
            bad["labels"] = bad["input_ids"]
        with pytest.raises(maskpack.Error) as e:
            maskpack.Collator()([good, bad])
        assert e.value.argument == "input_ids" and e.value.index == (1,) and e.value.status == status, str(e.value)
        assert "examples[1]" in str(e.value)


# ---- prepare_batch: the right argument named ----------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, np.float64])
def test_float_input_ids_are_named(dtype):
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    x = torch.as_tensor(ids).to(dtype) if isinstance(dtype, torch.dtype) else ids.astype(dtype)
    for extra in ({}, {"labels": torch.as_tensor(ids)}):
        with pytest.raises(maskpack.Error) as e:
            maskpack.prepare_batch({"input_ids": x, **extra})
        assert e.value.argument == "input_ids" and e.value.status == "MASKPACK_ERR_DTYPE"
        assert "integer" in str(e.value)


def test_input_ids_that_are_not_a_tensor_are_named():
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch({"input_ids": [[1, 2], [3, 4]]})
    assert e.value.argument == "input_ids"


@pytest.mark.parametrize("cp,cp_rank,arg", [(0, 0, "cp"), (-1, 0, "cp"), (2, 2, "cp_rank"), (2, -1, "cp_rank")])
def test_cp_and_cp_rank_are_named(cp, cp_rank, arg):
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch(_padded_batch(), cp=cp, cp_rank=cp_rank)
    assert e.value.argument == arg


@pytest.mark.parametrize("key", ["input_ids", "attention_mask", "labels"])
def test_meta_tensors_are_a_clear_error(key):
    batch = _padded_batch()
    batch[key] = batch[key].to("meta")
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch(batch, padding_free=True)
    assert e.value.argument == key and "meta" in str(e.value)


def test_position_ids_of_the_wrong_shape_are_named():
    batch = _padded_batch()
    for shape in [(2, 5), (3, 2, 5), (8,), (2, 4, 1)]:
        batch["position_ids"] = torch.zeros(shape, dtype=torch.long)
        with pytest.raises(maskpack.Error) as e:
            maskpack.prepare_batch(batch)
        assert e.value.argument == "position_ids" and str(list(shape)) in str(e.value)


def test_masks_and_seq_idx_of_the_wrong_shape_are_named():
    ids = torch.arange(1, 9).reshape(2, 4)
    for key, value, kw in [("attention_mask", torch.ones(2, 5, dtype=torch.long), {}),
                           ("attention_mask", torch.ones(3, 4, dtype=torch.long), {}),
                           ("attention_mask", torch.ones(2, 1, 5, 5, dtype=torch.bool), {"mask_convention": "keep"})]:
        with pytest.raises(maskpack.Error) as e:
            maskpack.prepare_batch({"input_ids": ids, key: value}, **kw)
        assert e.value.argument == key and str(list(value.shape)) in str(e.value) and "[2, 4]" in str(e.value)
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch({"input_ids": torch.arange(8)[None], "seq_idx": torch.zeros(1, 6, dtype=torch.long)})
    assert e.value.argument == "seq_idx" and "[1, 6]" in str(e.value)


# ---- the documented position-id forms -----------------------------------------------------------


def _mrope_packed():
    # three sequences packed: [5, 2, 3] tokens; an image run in the first (the temporal row stands still,
    # the width row restarts at 0 inside it: only the first plane's restarts are boundaries)
    t = [0, 1, 2, 2, 4, 0, 1, 0, 1, 2]
    h = [0, 1, 2, 3, 4, 0, 1, 0, 1, 2]
    w = [0, 1, 0, 1, 4, 0, 1, 0, 1, 2]
    return torch.tensor([t, h, w])


@pytest.mark.parametrize("form", ["3,1,T", "3,T"])
@pytest.mark.parametrize("explicit", [False, True])
def test_packed_mrope_position_ids_without_cu_seq_lens(form, explicit):
    pos = _mrope_packed()
    pos = pos[:, None] if form == "3,1,T" else pos
    ids = torch.arange(1, 11)[None]
    batch = {"input_ids": ids, "position_ids": pos}
    if explicit:
        batch["cu_seq_lens_q"] = torch.tensor([0, 5, 7, 10], dtype=torch.int32)
    b = maskpack.prepare_batch(batch, padding_free=True)
    assert np.asarray(b.cu_seqlens).tolist() == [0, 5, 7, 10]  # restarts of the text (first) row
    assert torch.equal(torch.as_tensor(b.position_ids), _mrope_packed())
    assert b.hf_kwargs()["position_ids"].shape == (3, 1, 10)
    assert np.asarray(b.shift_labels).tolist() == [2, 3, 4, 5, -100, 7, -100, 9, 10, -100]
    # under CP each plane is this rank's shard of that plane
    for r in range(2):
        br = maskpack.prepare_batch(batch, padding_free=True, cp=2, cp_rank=r)
        idx = np.asarray(br.input_ids)
        planes = torch.as_tensor(br.position_ids)
        assert planes.shape == (3, idx.size)
        full = _mrope_packed()
        for j, tok in enumerate(idx.tolist()):
            want = full[:, tok - 1] if tok else torch.zeros(3, dtype=full.dtype)
            assert torch.equal(planes[:, j], want)


# ---- flash_attn_kwargs under CP ------------------------------------------------------------------


def test_flash_attn_kwargs_refuse_a_zigzag_cp_rank():
    batch = {"input_ids": torch.arange(1, 9)[None], "cu_seqlens": torch.tensor([0, 3, 8])}
    for padding_free in (True, False):
        b = maskpack.prepare_batch(batch, padding_free=padding_free, cp=2, cp_rank=1)
        with pytest.raises(maskpack.Error) as e:
            b.flash_attn_kwargs()
        assert e.value.argument == "cp" and e.value.status == "MASKPACK_ERR_UNSUPPORTED"
    # Ulysses: heads are exchanged, so every rank attends over the whole stream: its offsets
    u = maskpack.prepare_batch(batch, padding_free=True, cp=2, cp_rank=1, cp_scheme="ulysses")
    kw = u.flash_attn_kwargs()
    assert kw["cu_seqlens_q"].tolist() == [0, 3, 8] and kw["max_seqlen_q"] == 5
    assert maskpack.prepare_batch(batch, padding_free=True).flash_attn_kwargs()["cu_seqlens_k"].tolist() == [0, 3, 8]


# ---- to_padded under CP: the live x in this rank's slot -------------------------------------------


@pytest.mark.parametrize("padding_free", [True, False])
def test_to_padded_gradient_flows_through_detached_all_gather_parts(padding_free):
    """verl's post-processing: every rank gathers the others' outputs detached and computes the loss on
    the whole padded batch. Each rank's gradient wrt its own output equals the padded single-process
    run's gradient at its tokens, and the ranks' parameter gradients sum to the padded run's."""
    torch.manual_seed(0)
    batch = {"input_ids": torch.tensor([[1, 2, 3, 4, 5, 0], [6, 7, 8, 0, 0, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]])}
    emb = torch.nn.Embedding(9, 3).double()
    coef = torch.randn(2, 6, 3, dtype=torch.float64) * batch["attention_mask"][..., None]

    full = emb(batch["input_ids"]).detach().requires_grad_(True)
    (full * coef).sum().backward()
    want_grad = full.grad  # = coef at the real tokens
    ref_param = torch.autograd.grad((emb(batch["input_ids"]) * coef).sum(), emb.weight)[0]

    cp = 2
    bundles = [maskpack.prepare_batch(batch, padding_free=padding_free, cp=cp, cp_rank=r) for r in range(cp)]
    outs = [emb(torch.as_tensor(b.input_ids)) for b in bundles]
    gathered = [o.detach().clone() for o in outs]  # torch.distributed.all_gather: no autograd
    param_sum = torch.zeros_like(emb.weight)
    for r, b in enumerate(bundles):
        x = outs[r].detach().requires_grad_(True)
        y = b.to_padded(x, parts=gathered)
        assert torch.equal(y.detach(), full.detach() * batch["attention_mask"][..., None])
        (y * coef).sum().backward()
        assert x.grad is not None
        ids = torch.as_tensor(b.input_ids).reshape(-1)
        g = x.grad.reshape(ids.numel(), 3)
        pos = {int(v): divmod(i, 6) for i, v in enumerate(batch["input_ids"].reshape(-1).tolist()) if v}
        for j, tok in enumerate(ids.tolist()):
            want = want_grad[pos[tok]] if tok else torch.zeros(3, dtype=torch.float64)
            torch.testing.assert_close(g[j], want, rtol=0, atol=0)
        y2 = b.to_padded(outs[r], parts=gathered)
        param_sum += torch.autograd.grad((y2 * coef).sum(), emb.weight)[0]
    torch.testing.assert_close(param_sum, ref_param, rtol=1e-12, atol=1e-14)


def test_to_padded_refuses_parts_that_disagree_with_x_and_names_parts():
    batch = {"input_ids": torch.arange(1, 9)[None], "cu_seqlens": torch.tensor([0, 3, 8])}
    b = maskpack.prepare_batch(batch, padding_free=True, cp=2, cp_rank=1)
    x = torch.randn(b.layout.q_width, 3)
    with pytest.raises(maskpack.Error) as e:  # this rank's slot holds another shape than x
        b.to_padded(x, parts=[x, torch.randn(x.shape[0], 2)])
    assert e.value.argument == "parts" and e.value.index == (1,) and str([x.shape[0], 2]) in str(e.value)
    with pytest.raises(maskpack.Error) as e:  # another rank's part of the wrong token count
        b.to_padded(x, parts=[torch.randn(5, 3), x])
    assert e.value.argument == "parts" and e.value.index == (0,) and "[5, 3]" in str(e.value)
    with pytest.raises(maskpack.Error) as e:
        b.to_padded(x, parts=[x])
    assert e.value.argument == "parts"
    with pytest.raises(maskpack.Error) as e:  # neither parts nor group: the other ranks' tokens are missing
        b.to_padded(x)
    assert e.value.argument == "parts" and "group=" in str(e.value)
    # the other ranks' slots as pad_value, explicitly
    ids = b.to_padded(b.input_ids, parts=[None, b.input_ids], pad_value=-1)
    mine = set(torch.as_tensor(b.input_ids).tolist()) - {0}
    assert [v if v in mine else -1 for v in range(1, 9)] == ids.reshape(-1).tolist()


# ---- last_token_rank -----------------------------------------------------------------------------


def test_last_token_rank_and_index_under_cp():
    lengths = [5, 3, 8]
    ids = torch.arange(1, 17)
    batch = {"input_ids": ids[None], "cu_seqlens": torch.tensor([0, 5, 8, 16])}
    assert maskpack.prepare_batch(batch, padding_free=True).last_token_rank is None
    ends = (np.cumsum(lengths) - 1).tolist()
    found = {}
    for r in range(2):
        b = maskpack.prepare_batch(batch, padding_free=True, cp=2, cp_rank=r)
        local = torch.as_tensor(b.input_ids).tolist()
        rank = torch.as_tensor(b.last_token_rank).tolist()
        index = torch.as_tensor(b.last_token_index).tolist()
        for s, e in enumerate(ends):
            if e + 1 in local:  # this rank holds the last token of sequence s
                assert rank[s] == r and local[index[s]] == e + 1
                found[s] = r
            else:
                assert rank[s] != r and index[s] == -1
    assert sorted(found) == [0, 1, 2]


# ---- the README's command lines run as written ----------------------------------------------------


def _cli():
    env = os.environ.get("MASKPACK_CLI")
    cand = env or os.path.join(ROOT, "build", "maskpack")
    if not (os.path.isfile(cand) and os.access(cand, os.X_OK)):
        pytest.fail("the maskpack CLI was not found: build it (make build) or set MASKPACK_CLI")
    return cand


def test_readme_command_lines_run_as_written(tmp_path):
    text = open(os.path.join(ROOT, "README.md")).read()
    block = text.split("## Command line", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    lines = [ln.split("#", 1)[0].strip() for ln in block.strip().splitlines()]
    lines = [ln for ln in lines if ln.startswith("build/maskpack ")]
    assert any(" inspect batch.npz" in ln for ln in lines)
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=np.int64)
    np.savez(tmp_path / "batch.npz", attention_mask=mask, input_ids=np.arange(8).reshape(2, 4) * mask)
    from safetensors.numpy import save_file

    save_file({"attention_mask": mask}, str(tmp_path / "batch.safetensors"))
    (tmp_path / "lengths.txt").write_text("\n".join(str(n) for n in [900, 4000, 3000, 120, 7000] * 4) + "\n")
    for ln in lines:
        argv = [_cli()] + shlex.split(ln)[1:]
        r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (ln, r.stdout[-500:], r.stderr[-500:])
    assert re.search(r"inspect batch\.npz .*--mask-convention keep", block)


def test_npu_kwargs_need_head_dim_or_scale():
    batch = {"input_ids": torch.arange(1, 9)[None], "cu_seqlens": torch.tensor([0, 3, 8])}
    with pytest.raises(maskpack.Error) as e:
        maskpack.prepare_batch(batch, padding_free=True).npu_kwargs()
    assert e.value.argument == "head_dim" and "prepare_batch" in str(e.value)
    kw = maskpack.prepare_batch(batch, padding_free=True, head_dim=64).npu_kwargs()
    assert kw["scale"] == pytest.approx(1 / 8) and kw["input_layout"] == "TND"


def test_offsets_short_of_the_row_are_an_error_unless_the_tail_is_padding():
    # cu_seqlens / cu_seq_lens_q ending at token 7 of 10: the last 3 tokens belong to no sequence, which
    # used to become padding silently (a dataloader that lost a sequence's offsets trained without it)
    ids = torch.arange(10)[None]
    for key in ("cu_seqlens", "cu_seq_lens_q"):
        with pytest.raises(maskpack.Error) as e:
            maskpack.prepare_batch({"input_ids": ids, key: torch.tensor([0, 3, 7], dtype=torch.int32)},
                                   padding_free=True)
        assert e.value.argument == key and e.value.index == (7,)
        assert "[0, 7) of the row's 10" in str(e.value) and "tail_padding=True" in str(e.value)
        # said to be padding: by the caller, by a 2D mask, or by cu_seqlens_padded's slots
        b = maskpack.prepare_batch({"input_ids": ids, key: torch.tensor([0, 3, 7], dtype=torch.int32)},
                                   padding_free=True, tail_padding=True)
        assert np.asarray(b.cu_seqlens).tolist() == [0, 3, 7]
        mask = torch.tensor([[1] * 7 + [0] * 3])
        b = maskpack.prepare_batch({"input_ids": ids, key: torch.tensor([0, 3, 7], dtype=torch.int32),
                                    "attention_mask": mask}, padding_free=True)
        assert np.asarray(b.cu_seqlens).tolist() == [0, 3, 7]
    b = maskpack.prepare_batch({"input_ids": ids, "cu_seqlens": torch.tensor([0, 3, 7], dtype=torch.int32),
                                "cu_seqlens_padded": torch.tensor([0, 4, 10], dtype=torch.int32)}, padding_free=True)
    assert [int(n) for n in np.asarray(b.source_layout.seqlens)] == [3, 4]
    # offsets that cover the row are unaffected
    b = maskpack.prepare_batch({"input_ids": ids, "cu_seqlens": torch.tensor([0, 3, 10], dtype=torch.int32)},
                               padding_free=True)
    assert np.asarray(b.cu_seqlens).tolist() == [0, 3, 10]
    # the Collator's pad_to_multiple_of tail is its own padding: accepted
    b = maskpack.Collator(padding_free=True, pad_to_multiple_of=8)([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    assert np.asarray(b.cu_seqlens).tolist() == [0, 3, 5] and b.source_layout.q_width == 8
