"""maskpack against Hugging Face transformers' own mask builders and flash-attention helpers.

Every comparison calls the installed transformers functions (nothing is copied from them):

* masking_utils.create_causal_mask / create_sliding_window_causal_mask / create_bidirectional_mask
  for the sdpa (bool keep mask) and eager (additive, dtype-min fill) interfaces, with left, right and
  both-side padding, HF sliding windows (converted with window_from_hf), packed position_ids and
  blockwise (block_sequence_ids) overlays;
* modeling_attn_mask_utils._prepare_4d_causal_attention_mask, the legacy builder whose
  sliding_window counts like attention-gym (window_from_gym);
* modeling_flash_attention_utils._get_unpad_data / _unpad_input / _upad_input (valid indices,
  cu_seqlens, max_seqlen) and prepare_fa_kwargs_from_position_ids (the flash path's "reset" rule),
  against find_packed_sequence_indices (the mask builders' "step" rule).

HF builds pad query rows from the key padding only (a pad row still sees valid keys), maskpack's pad
rows see nothing (docs/conventions.md section 5), so dense masks are compared on the rows of real tokens and
maskpack's pad rows are checked to be empty. transformers is imported unconditionally: without it
this module fails instead of skipping.
"""

import re
import warnings

import numpy as np

import pytest
import torch
import transformers
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transformers import PretrainedConfig
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask, find_packed_sequence_indices

try:  # the legacy builder: transformers 5.24 removed modeling_attn_mask_utils
    from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask
except ImportError:
    _prepare_4d_causal_attention_mask = None
from transformers.modeling_flash_attention_utils import (
    _get_unpad_data,
    _unpad_input,
    _upad_input,
    prepare_fa_kwargs_from_position_ids,
)

import maskpack
from maskpack import Layout

HF_EXAMPLES = settings(max_examples=120)


def _config(impl, sliding_window=None, is_causal=True):
    cfg = PretrainedConfig()
    cfg._attn_implementation = impl
    if sliding_window is not None:
        cfg.sliding_window = sliding_window
    if not is_causal:
        cfg.is_causal = False
    return cfg


def hf_mask(impl, attention_mask, batch, seq, dtype=torch.float32, sliding_window=None, position_ids=None,
            block_sequence_ids=None, is_causal=True):
    """HF's 4D mask for a batch, always materialised ([B,1,S,S])."""
    cfg = _config(impl, sliding_window, is_causal)
    kw = dict(config=cfg, inputs_embeds=torch.zeros(batch, seq, 4, dtype=dtype),
              attention_mask=attention_mask, past_key_values=None, position_ids=position_ids,
              allow_is_causal_skip=False)
    if block_sequence_ids is not None:
        kw["block_sequence_ids"] = block_sequence_ids
    fn = create_sliding_window_causal_mask if sliding_window is not None else create_causal_mask
    m = fn(**kw)
    assert m is not None and m.shape == (batch, 1, seq, seq)
    return m


def to_torch(x):
    return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))


def assert_rows_equal(ours, theirs, rows):
    """ours / theirs [B,1,S,S]: identical on real query rows; ours' pad rows attend nothing."""
    ours, theirs = to_torch(ours), to_torch(theirs)
    rows = to_torch(rows).bool()
    assert ours.shape == theirs.shape
    assert torch.equal(ours[:, 0][rows], theirs[:, 0][rows])
    if ours.dtype == torch.bool:
        assert not ours[:, 0][~rows].any()
    else:
        assert (ours[:, 0][~rows] < 0).all()


# ---- padded batches ----------------------------------------------------------------------------


@st.composite
def padded_masks(draw, allow_empty_rows=True):
    """[B,S] keep masks with one contiguous run per row (left, right or both-side padding)."""
    b = draw(st.integers(1, 4))
    s = draw(st.integers(1, 48))
    m = np.zeros((b, s), np.int64)
    for r in range(b):
        n = draw(st.integers(0 if allow_empty_rows else 1, s))
        side = draw(st.sampled_from(["right", "left", "both"]))
        start = 0 if side == "right" else s - n if side == "left" else draw(st.integers(0, s - n))
        m[r, start:start + n] = 1
    return m


@HF_EXAMPLES
@given(padded_masks(), st.one_of(st.none(), st.integers(1, 12)))
def test_sdpa_keep_mask_matches_hf(mask, hf_window):
    b, s = mask.shape
    rule = {} if hf_window is None else {"window_hf": hf_window}
    lay = Layout.from_mask2d(mask, convention="keep", **rule)
    theirs = hf_mask("sdpa", torch.from_numpy(mask), b, s, sliding_window=hf_window)
    assert theirs.dtype == torch.bool
    assert_rows_equal(lay.mask4d("keep"), theirs, mask.astype(bool))


@HF_EXAMPLES
@given(padded_masks(), st.one_of(st.none(), st.integers(1, 12)),
       st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_eager_additive_mask_matches_hf(mask, hf_window, dtype):
    b, s = mask.shape
    rule = {} if hf_window is None else {"window_hf": hf_window}
    lay = Layout.from_mask2d(torch.from_numpy(mask), convention="keep", **rule)
    theirs = hf_mask("eager", torch.from_numpy(mask), b, s, dtype=dtype, sliding_window=hf_window)
    ours = lay.mask4d("additive", dtype=dtype, fill="min")
    assert isinstance(ours, torch.Tensor) and ours.dtype == theirs.dtype == dtype
    assert_rows_equal(ours, theirs, mask.astype(bool))


@HF_EXAMPLES
@given(padded_masks())
def test_bidirectional_mask_matches_hf(mask):
    b, s = mask.shape
    lay = Layout.from_mask2d(mask, convention="keep", causal=False)
    theirs = hf_mask("sdpa", torch.from_numpy(mask), b, s, is_causal=False)
    assert_rows_equal(lay.mask4d("keep"), theirs, mask.astype(bool))


@HF_EXAMPLES
@given(padded_masks(), st.one_of(st.none(), st.integers(1, 12)))
def test_legacy_4d_builder_counts_windows_like_attention_gym(mask, window):
    # _prepare_4d_causal_attention_mask keeps keys with i - j <= sliding_window (w + 1 keys), unlike
    # masking_utils' j > i - w (w keys): the same integer means two different windows.
    if _prepare_4d_causal_attention_mask is None:
        pytest.skip(f"transformers {transformers.__version__} has no modeling_attn_mask_utils (removed in 5.24)")
    b, s = mask.shape
    rule = {} if window is None else {"window_gym": window}
    lay = Layout.from_mask2d(mask, convention="keep", **rule)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        theirs = _prepare_4d_causal_attention_mask(torch.from_numpy(mask), (b, s), torch.zeros(b, s, 4), 0,
                                                   sliding_window=window)
    assert_rows_equal(lay.mask4d("additive", fill="min"), theirs, mask.astype(bool))
    if window is not None and mask.sum(1).max() > window + 1:
        # and it is not HF's current convention for the same integer
        hf_now = Layout.from_mask2d(mask, convention="keep", window_hf=window)
        assert not np.array_equal(hf_now.allowed(), lay.allowed())


@st.composite
def masks_with_blocks(draw):
    """A padded mask plus HF block_sequence_ids (group id per token, -1 = text / pad)."""
    mask = draw(padded_masks())
    ids = np.full(mask.shape, -1, np.int64)
    group = 0
    for r in range(mask.shape[0]):
        cols = np.flatnonzero(mask[r])
        if cols.size == 0:
            continue
        c = int(cols[0])
        end = int(cols[-1]) + 1
        while c < end:
            n = draw(st.integers(1, max(1, end - c)))
            if draw(st.booleans()):
                ids[r, c:c + n] = group
                group += 1
            c += n
    return mask, ids


@HF_EXAMPLES
@given(masks_with_blocks())
def test_blockwise_overlay_is_spans(data):
    # HF's blockwise overlay (VLM image tokens attend each other bidirectionally) is our spans rule.
    mask, ids = data
    b, s = mask.shape
    spans, seg = [], 0
    for r in range(b):
        cols = np.flatnonzero(mask[r])
        if cols.size == 0:
            continue
        first = int(cols[0])
        for g in sorted(set(ids[r][ids[r] >= 0].tolist())):
            where = np.flatnonzero(ids[r] == g)
            spans.append((seg, int(where[0]) - first, int(where[-1]) + 1 - first))
        seg += 1
    lay = Layout.from_mask2d(mask, convention="keep", spans=spans)
    theirs = hf_mask("sdpa", torch.from_numpy(mask), b, s, block_sequence_ids=torch.from_numpy(ids))
    assert_rows_equal(lay.mask4d("keep"), theirs, mask.astype(bool))


# ---- flash-attention unpadding ------------------------------------------------------------------


@st.composite
def padded_lengths(draw):
    lengths = draw(st.lists(st.integers(0, 40), min_size=1, max_size=5))
    cap = draw(st.integers(max(lengths), 48))
    return lengths, draw(st.sampled_from(["right", "left"])), cap


@HF_EXAMPLES
@given(padded_lengths())
def test_unpad_data_matches_hf(spec):
    lengths, placement, cap = spec
    lay = Layout.from_lengths(torch.tensor(lengths), placement=placement, capacity=cap)
    mask = lay.mask2d(dtype="int32")
    indices, cu, max_len = _get_unpad_data(mask)
    assert torch.equal(lay.valid_indices(), indices)
    ours_cu = lay.cu_seqlens()
    assert ours_cu.dtype == cu.dtype == torch.int32
    assert torch.equal(ours_cu, cu)  # empty rows stay as repeated entries, like HF's per-row sums
    assert lay.max_seqlen == max_len
    hidden = torch.arange(mask.numel() * 3, dtype=torch.float32).reshape(*mask.shape, 3)
    unpadded, idx2, cu2, max2, used = _unpad_input(hidden, mask)
    assert torch.equal(unpadded, hidden.reshape(-1, 3)[lay.valid_indices()])
    assert torch.equal(cu2, ours_cu) and max2 == lay.max_seqlen
    assert torch.equal(used, lay.seqlens)


@HF_EXAMPLES
@given(padded_lengths(), st.integers(1, 8))
def test_upad_input_with_shorter_queries_is_a_bottom_right_cross_layout(spec, q_len):
    # _upad_input with query_length < kv length takes the last q_len mask columns as the queries
    # (left padding / decoding with a cache); flash-attn >= 2.1 then aligns causal bottom-right.
    lengths, _placement, cap = spec
    # q_len == kv length and q_len == 1 take HF short cuts (the same indices; one query per row,
    # even for an empty row); the general branch is the interesting one
    assume(1 < q_len < cap)
    kv = Layout.from_lengths(lengths, placement="left", capacity=cap)
    b = len(lengths)
    segs = []
    for r, n in enumerate(lengths):
        nq = min(n, q_len)
        segs.append((r, q_len - nq, nq, cap - n, n))
    cross = Layout.from_segments(segs, b, q_len, cap, alignment="bottom_right")
    heads, d = 2, 4
    q = torch.randn(b, q_len, heads, d)
    k = torch.randn(b, cap, heads, d)
    _q, _k, _v, indices_q, (cu_q, cu_k), (max_q, max_k) = _upad_input(
        q, k, k.clone(), kv.with_outputs("torch").mask2d(dtype="int32"), q_len, _unpad_input)
    assert torch.equal(torch.from_numpy(cross.valid_indices()), indices_q)
    assert torch.equal(torch.from_numpy(cross.cu_seqlens()), cu_q)
    assert torch.equal(torch.from_numpy(cross.cu_seqlens(kv=True)), cu_k)
    assert torch.equal(torch.from_numpy(kv.cu_seqlens()), cu_k)
    assert (cross.max_seqlen, cross.max_seqlen_kv) == (max_q, max_k)
    # bottom-right: the last query of each row sees every key of the row
    a = cross.allowed()
    for r, n in enumerate(lengths):
        if n:
            assert a[r, q_len - 1, cap - n:].all()


# ---- packed position_ids: the two boundary rules -------------------------------------------------


@st.composite
def packed_position_ids(draw):
    """[B,T] rows of packed runs, each run starting at 0 (the row minimum) and stepping by +1 or, now
    and then, by more (a jump, as in [0, 1, 2, 5, 6]). The last run has length >= 2 so no row ends in
    a run of zeros (which maskpack reads as tail padding)."""
    b = draw(st.integers(1, 3))
    rows = []
    for _ in range(b):
        runs = draw(st.lists(st.integers(1, 12), min_size=1, max_size=5))
        runs[-1] = max(runs[-1], 2)
        row = []
        for n in runs:
            p = 0
            for k in range(n):
                row.append(p)
                p += draw(st.sampled_from([1, 1, 1, 1, 2, 3]))
        rows.append(row)
    t = max(len(r) for r in rows)
    for r in rows:  # equal widths: extend the last run
        while len(r) < t:
            r.append(r[-1] + 1)
    return np.array(rows, dtype=np.int64)


@HF_EXAMPLES
@given(packed_position_ids())
def test_reset_rule_is_hf_flash_path(pos):
    (cu_q, cu_k), (max_q, _max_k) = prepare_fa_kwargs_from_position_ids(torch.from_numpy(pos))
    lay = Layout.from_position_ids(pos, rule="reset")
    assert lay.cu_seqlens().tolist() == cu_q.tolist() == cu_k.tolist()
    assert lay.max_seqlen == int(max_q)


@HF_EXAMPLES
@given(packed_position_ids(), st.one_of(st.none(), st.integers(1, 10)))
def test_step_rule_is_hf_mask_builders(pos, hf_window):
    b, t = pos.shape
    ids = find_packed_sequence_indices(torch.from_numpy(pos))
    rule = {} if hf_window is None else {"window_hf": hf_window}
    lay = Layout.from_position_ids(torch.from_numpy(pos), rule="step", **rule)
    ours_ids = lay.segment_ids()
    # HF numbers the sequences of each row from 0 (None: one sequence per row); ours are global
    for r in range(b):
        row = ours_ids[r] - ours_ids[r].min()
        want = torch.zeros(t, dtype=torch.int64) if ids is None else ids[r]
        assert torch.equal(row, want)
    theirs = hf_mask("sdpa", None, b, t, sliding_window=hf_window, position_ids=torch.from_numpy(pos))
    assert torch.equal(lay.mask4d("keep"), theirs)
    eager = hf_mask("eager", None, b, t, sliding_window=hf_window, position_ids=torch.from_numpy(pos))
    assert torch.equal(lay.mask4d("additive", fill="min"), eager)


def test_the_two_boundary_rules_disagree_on_a_jump():
    # docs/conventions.md section 7: [0, 1, 2, 5, 6] is one sequence to HF's flash path and two to its mask
    # builders; maskpack names the rule instead of guessing.
    pos = torch.tensor([[0, 1, 2, 5, 6]])
    (cu_q, _cu_k), (max_q, _mk) = prepare_fa_kwargs_from_position_ids(pos)
    assert cu_q.tolist() == [0, 5] and int(max_q) == 5
    assert find_packed_sequence_indices(pos).tolist() == [[0, 0, 0, 1, 1]]
    reset = Layout.from_position_ids(pos, rule="reset")
    step = Layout.from_position_ids(pos, rule="step")
    assert reset.cu_seqlens().tolist() == cu_q.tolist()
    assert step.cu_seqlens().tolist() == [0, 3, 5]
    assert step.segment_ids().tolist() == [[1, 1, 1, 2, 2]]
    assert torch.equal(step.mask4d("keep"), hf_mask("sdpa", None, 1, 5, position_ids=pos))
    # the reset reading is one causal sequence of 5: query 3 sees key 0
    assert reset.allowed_at(0, 3, 0) and not step.allowed_at(0, 3, 0)


def test_tail_padding_zeros_are_padding_not_sequences():
    # HF's step rule turns every pad token written as position 0 into its own length-1 sequence
    # (VeOmni 918/746/845); maskpack declares the tail run padding (bug class 8).
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 0]])
    assert find_packed_sequence_indices(pos).tolist() == [[0, 0, 0, 1, 1, 2, 3, 4]]
    lay = Layout.from_position_ids(pos, rule="step")
    assert lay.seqlens.tolist() == [3, 2]
    assert lay.mask2d().tolist() == [[True] * 5 + [False] * 3]
    theirs = hf_mask("sdpa", None, 1, 8, position_ids=pos)
    ours = lay.mask4d("keep")
    assert torch.equal(ours[0, 0, :5], theirs[0, 0, :5])  # the real tokens agree
    assert theirs[0, 0, 5:, 5:].diagonal().all()  # HF: each pad attends itself
    assert not ours[0, 0, 5:].any()  # maskpack: pads attend nothing


def test_transformers_version_and_helper_goldens():
    # The helpers above are private HF functions: the version they ran against is a real release
    # number, and each still computes what the comparisons assume on a golden input (a renamed or
    # changed helper fails here, not silently in the comparisons).
    assert re.fullmatch(r"\d+\.\d+\.\d+([.a-z0-9+-]*)?", transformers.__version__), transformers.__version__
    indices, cu, max_len = _get_unpad_data(torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]))
    assert indices.tolist() == [0, 1, 2, 4, 5] and cu.tolist() == [0, 3, 5] and int(max_len) == 3
    (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(torch.tensor([[0, 1, 2, 0, 1, 0]]))
    assert cu_q.tolist() == cu_k.tolist() == [0, 3, 5, 6] and int(max_q) == int(max_k) == 3
    # HF sliding_window w = w keys including the query itself: flash-attn (w - 1, w - 1)
    assert maskpack.window_from_hf(4) == (3, 3)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
