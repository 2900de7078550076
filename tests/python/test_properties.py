"""Property tests: random layouts, every derived output checked against an independent reference.

Layouts are drawn in every shape the library supports (batch <= 4, lengths <= 96, empty and
length-1 segments, right/left padding, packed streams, packed rows, explicit segments with gaps,
cross attention with q_len != kv_len under both alignments) with random rules (causal or not,
windows, bidirectional spans, prefix-LM prefixes). The reference predicate in _reference.py is the
header's rule formula re-implemented in numpy from the segment list; the expected segment lists of
the constructors are computed here from their documented placement rules.

Context-parallel shards are a separate feature with their own tests; they are not drawn here.
"""

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import maskpack
from maskpack import Layout

import _reference as ref

MAX_LEN = 96


# ---- strategies ------------------------------------------------------------------------------


@st.composite
def rules(draw, segments):
    """A random rule valid for these segments."""
    causal = draw(st.booleans())
    window = draw(st.one_of(st.just((-1, -1)), st.tuples(st.integers(-1, 12), st.integers(-1, 12))))
    alignment = draw(st.sampled_from(["bottom_right", "top_left"]))
    spans = []
    if draw(st.integers(0, 2)) == 0:
        for k, seg in enumerate(segments):
            n = seg[2]
            if seg[2] == seg[4] and n >= 1 and draw(st.integers(0, 2)) == 0:
                cuts = sorted(set(draw(st.lists(st.integers(0, n), min_size=2, max_size=4))))
                for a, b in zip(cuts[0::2], cuts[1::2]):
                    spans.append((k, a, b))
    prefix = None
    if draw(st.integers(0, 3)) == 0:
        prefix = [draw(st.integers(0, seg[4])) for seg in segments]
    return {"causal": causal, "alignment": alignment, "window": window, "spans": spans, "prefix": prefix}


def _next_fit(lengths, capacity):
    """Header: packed rows of `capacity` columns filled in order; a new row when the next one does not fit."""
    segs, row, off = [], 0, 0
    for n in lengths:
        if off + n > capacity:
            row, off = row + 1, 0
        segs.append((row, off, n, off, n))
        off += n
    return segs, (row + 1 if lengths else 0)


@st.composite
def layout_specs(draw, kinds=("right", "left", "packed", "packed_rows", "segments", "cross"), min_len=0,
                 no_leading_gap=False):
    """-> dict(kind, build(rule) -> Layout, segments, n_rows, q_width, kv_width, packed, rule)."""
    kind = draw(st.sampled_from(kinds))
    if kind in ("right", "left"):
        lengths = draw(st.lists(st.integers(min_len, MAX_LEN), min_size=1, max_size=4))
        cap = draw(st.one_of(st.none(), st.integers(0, MAX_LEN)))
        s = max(max(lengths), cap or 0)
        segs = [(b, 0 if kind == "right" else s - n, n, 0 if kind == "right" else s - n, n)
                for b, n in enumerate(lengths)]
        spec = dict(segments=segs, n_rows=len(lengths), q_width=s, kv_width=s, packed=False,
                    build=lambda r: Layout.from_lengths(lengths, placement=kind, capacity=cap, **r))
    elif kind == "packed":
        lengths = draw(st.lists(st.integers(min_len, 32), min_size=1, max_size=6))
        segs, off = [], 0
        for n in lengths:
            segs.append((0, off, n, off, n))
            off += n
        spec = dict(segments=segs, n_rows=1, q_width=off, kv_width=off, packed=True,
                    build=lambda r: Layout.from_lengths(lengths, placement="packed", **r))
    elif kind == "packed_rows":
        lengths = draw(st.lists(st.integers(min_len, 32), min_size=1, max_size=8))
        cap = draw(st.integers(max(1, max(lengths)), MAX_LEN))
        segs, n_rows = _next_fit(lengths, cap)
        spec = dict(segments=segs, n_rows=n_rows, q_width=cap, kv_width=cap, packed=False,
                    build=lambda r: Layout.from_lengths(lengths, placement="packed", capacity=cap, **r))
    elif kind == "segments":
        n_rows = draw(st.integers(1, 4))
        packed = n_rows == 1 and draw(st.booleans())
        segs, width = [], 0
        for b in range(n_rows):
            off = 0
            for _ in range(draw(st.integers(0, 4))):
                gap = 0 if (no_leading_gap and off == 0) else draw(st.integers(0, 4))
                n = draw(st.integers(min_len, 24))
                segs.append((b, off + gap, n, off + gap, n))
                off += gap + n
            width = max(width, off)
        width = min(width + draw(st.integers(0, 4)), 10_000)
        spec = dict(segments=segs, n_rows=n_rows, q_width=width, kv_width=width, packed=packed,
                    build=lambda r: Layout.from_segments(segs, n_rows, width, packed=packed, **r))
    else:  # cross attention: q_len != kv_len, separate q and kv grids
        n_rows = draw(st.integers(1, 3))
        segs, qw, kw = [], 0, 0
        for b in range(n_rows):
            qo = ko = 0
            for _ in range(draw(st.integers(0, 3))):
                qg, kg = draw(st.integers(0, 3)), draw(st.integers(0, 3))
                ql, kl = draw(st.integers(min_len, 16)), draw(st.integers(min_len, 16))
                segs.append((b, qo + qg, ql, ko + kg, kl))
                qo += qg + ql
                ko += kg + kl
            qw, kw = max(qw, qo), max(kw, ko)
        qw += draw(st.integers(0, 3))
        kw += draw(st.integers(0, 3))
        spec = dict(segments=segs, n_rows=n_rows, q_width=qw, kv_width=kw, packed=False,
                    build=lambda r: Layout.from_segments(segs, n_rows, qw, kw, **r))
    spec["kind"] = kind
    spec["rule"] = draw(rules(spec["segments"]))
    return spec


def build(spec):
    lay = spec["build"](spec["rule"])
    return lay


def reference_allowed(spec):
    return ref.allowed(spec["segments"], spec["rule"], spec["n_rows"], spec["q_width"], spec["kv_width"])


def np_of(x):
    return x.float().numpy() if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 else np.asarray(x)


# ---- constructors and every derived output ---------------------------------------------------


@given(layout_specs())
def test_constructor_segments_and_rule(spec):
    lay = build(spec)
    assert lay.segments == [tuple(s) for s in spec["segments"]]
    assert (lay.n_rows, lay.q_width, lay.kv_width, lay.packed) == (
        spec["n_rows"], spec["q_width"], spec["kv_width"], spec["packed"])
    r = spec["rule"]
    want_prefix = None if r["prefix"] is None or not any(r["prefix"]) else r["prefix"]  # all-zero = none
    assert lay.rule == {"causal": r["causal"], "alignment": r["alignment"], "window": tuple(r["window"]),
                        "spans": [tuple(s) for s in r["spans"]], "prefix": want_prefix}
    assert lay.n_segments == len(spec["segments"])
    assert lay.n_tokens == sum(s[2] for s in spec["segments"])
    assert lay.max_seqlen == max([s[2] for s in spec["segments"]], default=0)
    assert lay.max_seqlen_kv == max([s[4] for s in spec["segments"]], default=0)
    assert list(lay.seqlens) == [s[2] for s in spec["segments"]]
    assert list(lay.seqlens_kv) == [s[4] for s in spec["segments"]]
    assert lay.seqlens.dtype == np.int32


@given(layout_specs())
def test_dense_masks_match_reference_predicate(spec):
    lay = build(spec)
    a = reference_allowed(spec)
    got = lay.allowed()
    assert got.dtype == np.bool_ and got.shape == a.shape
    np.testing.assert_array_equal(got, a)
    b, s, skv = a.shape
    a4 = a[:, None]
    for dtype in ("bool", "uint8", "int32", "float32"):
        keep = lay.mask4d("keep", dtype=dtype)
        assert keep.shape == (b, 1, s, skv) and keep.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(keep, a4.astype(dtype))
        masked = lay.mask4d("masked", dtype=dtype)
        np.testing.assert_array_equal(masked, (~a4).astype(dtype))
    for dtype in ("float16", "float32", "float64", "bfloat16"):
        for fill in ("-inf", "min"):
            add = lay.mask4d("additive", dtype=dtype, fill=fill)
            if dtype == "bfloat16":
                assert isinstance(add, torch.Tensor) and add.dtype == torch.bfloat16
                neg = torch.finfo(torch.bfloat16).min if fill == "min" else -np.inf
            else:
                assert add.dtype == np.dtype(dtype)
                neg = np.finfo(dtype).min if fill == "min" else -np.inf
            want = np.where(a4, 0.0, neg)
            np.testing.assert_array_equal(np_of(add).astype(np.float64), want)
    two = lay.mask4d("keep", heads=2)
    assert two.shape == (b, 2, s, skv)
    np.testing.assert_array_equal(two[:, 0], a)
    np.testing.assert_array_equal(two[:, 1], a)
    # the C library's reference predicate (maskpack_allowed, its own code path: allowed() above is
    # mask4d) agrees with the independent one at every point of grids up to 4096 cells, and on
    # larger ones at every key of every 7th query row; outside the grid it is False
    rows = range(s) if b * s * skv <= 4096 else range(0, s, 7)
    got_at = np.array([[[lay.allowed_at(bi, i, j) for j in range(skv)] for i in rows] for bi in range(b)], bool)
    np.testing.assert_array_equal(got_at.reshape(b, len(rows), skv), a[:, list(rows)])
    for bi, i, j in [(-1, 0, 0), (b, 0, 0), (0, -1, 0), (0, s, 0), (0, 0, -1), (0, 0, skv)]:
        assert lay.allowed_at(bi, i, j) is False


@given(layout_specs())
def test_per_token_and_offset_outputs(spec):
    lay = build(spec)
    segs, n_rows, s, packed = spec["segments"], spec["n_rows"], spec["q_width"], spec["packed"]
    np.testing.assert_array_equal(lay.mask2d(), ref.mask2d(segs, n_rows, s, packed))
    np.testing.assert_array_equal(lay.mask2d(dtype="int64"), ref.mask2d(segs, n_rows, s, packed).astype(np.int64))
    for dtype in ("int32", "int64"):
        pos = lay.position_ids(dtype=dtype)
        assert pos.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(pos, ref.position_ids(segs, n_rows, s, packed))
        np.testing.assert_array_equal(lay.segment_ids(dtype=dtype), ref.segment_ids(segs, n_rows, s, packed))
        for kv in (False, True):
            te = lay.cu_seqlens(kv=kv, dtype=dtype)
            assert te.dtype == np.dtype(dtype)
            assert list(te) == ref.cu_seqlens(segs, "te", kv)
            assert list(lay.cu_seqlens(form="npu", kv=kv, dtype=dtype)) == ref.cu_seqlens(segs, "npu", kv)
        assert list(lay.valid_indices(dtype=dtype)) == ref.valid_indices(segs, s)
        assert list(lay.last_token_index(dtype=dtype)) == ref.last_token_index(segs, s)
    assert list(lay.cu_seqlens_padded()) == ref.cu_seqlens_padded(segs, n_rows, s)
    # consistency between outputs: valid_indices are exactly the True entries of mask2d
    assert list(np.flatnonzero(lay.mask2d().reshape(-1))) == list(lay.valid_indices())


@given(layout_specs(), st.sampled_from([1, 2, 3, 5, 8, 16, 33, 128]), st.sampled_from([1, 2, 4, 7, 16, 32, 128]))
def test_block_mask_reexpands_to_predicate(spec, bq, bk):
    lay = build(spec)
    a = reference_allowed(spec)
    bm = lay.block_mask(bq, bk)
    b, s, skv = a.shape
    qb, kb = -(-s // bq), -(-skv // bk)
    assert bm["kv_num_blocks"].shape == (b, 1, qb) and bm["kv_indices"].shape == (b, 1, qb, kb)
    assert bm["q_num_blocks"].shape == (b, 1, kb) and bm["q_indices"].shape == (b, 1, kb, qb)
    assert bm["kv_indices"].dtype == np.int32
    assert bm["block_size"] == (bq, bk) and bm["seq_lengths"] == (s, skv)
    status = ref.block_status(a, bq, bk)
    partial = ref.expand_block_lists(bm["kv_num_blocks"], bm["kv_indices"], kb)
    full = ref.expand_block_lists(bm["full_kv_num_blocks"], bm["full_kv_indices"], kb)
    np.testing.assert_array_equal(partial, status == 1)
    np.testing.assert_array_equal(full, status == 2)
    q_partial = ref.expand_block_lists(bm["q_num_blocks"], bm["q_indices"], qb)
    q_full = ref.expand_block_lists(bm["full_q_num_blocks"], bm["full_q_indices"], qb)
    np.testing.assert_array_equal(q_partial, (status == 1).transpose(0, 2, 1))
    np.testing.assert_array_equal(q_full, (status == 2).transpose(0, 2, 1))
    # re-expansion: full blocks plus the predicate inside partial blocks is the predicate
    dense = np.zeros_like(a)
    for x in range(qb):
        for y in range(kb):
            sl = (slice(None), slice(x * bq, (x + 1) * bq), slice(y * bk, (y + 1) * bk))
            dense[sl] |= full[:, x, y][:, None, None]
            dense[sl] |= partial[:, x, y][:, None, None] & a[sl]
    np.testing.assert_array_equal(dense, a)


@given(layout_specs())
def test_magi_slices_reexpand_to_predicate(spec):
    lay = build(spec)
    a = reference_allowed(spec)
    try:
        q, k, t = lay.magi_slices()
    except maskpack.Error as e:
        # MagiAttention's slice types cannot express a sliding window
        assert e.status == "MASKPACK_ERR_NOT_REPRESENTABLE"
        assert tuple(spec["rule"]["window"]) != (-1, -1)
        assert "window" in e.message
        return
    assert q.dtype == np.int32 and q.shape == (len(t), 2) and k.shape == (len(t), 2)
    assert set(np.asarray(t).tolist()) <= {0, 1, 2, 3}
    b, s, skv = a.shape
    np.testing.assert_array_equal(ref.magi_expand(q, k, t, b * s, b * skv), ref.flatten_allowed(a))


# ---- round trips ------------------------------------------------------------------------------


@given(layout_specs(kinds=("right", "left"), min_len=1))
def test_roundtrip_mask2d_keep(spec):
    # Defined for padded layouts whose sequences are non-empty: an empty row has no tokens, so
    # from_mask2d cannot know that a zero-length segment sat there.
    lay = build(spec)
    for m in (lay.mask2d(), lay.mask2d(dtype="int32"), torch.from_numpy(lay.mask2d(dtype="uint8"))):
        back = Layout.from_mask2d(m, convention="keep", **spec["rule"])
        assert back == lay


@given(layout_specs(kinds=("right", "left", "packed_rows", "segments"), min_len=1))
def test_roundtrip_mask2d_doc_id(spec):
    # segment_ids() is a doc-id mask; adjacent documents keep distinct ids, so every non-empty
    # segment comes back. Packed streams come back as one padded row, so they are left out.
    assume(not spec["packed"])
    lay = build(spec)
    back = Layout.from_mask2d(lay.segment_ids(), convention="doc_id", **spec["rule"])
    assert back == lay


@given(layout_specs(kinds=("packed", "segments"), no_leading_gap=True))
def test_roundtrip_cu_seqlens(spec):
    # TE reads each sequence at the start of its slot, so packed streams round-trip through
    # (cu_seqlens, cu_seqlens_padded) as long as no slot starts with filler (no_leading_gap);
    # empty sequences survive as equal consecutive entries.
    assume(spec["packed"])
    lay = build(spec)
    total = lay.q_width
    for form in ("te", "npu"):
        back = Layout.from_cu_seqlens(lay.cu_seqlens(form=form), form=form, total=total,
                                      cu_padded=lay.cu_seqlens_padded(), **spec["rule"])
        assert back == lay
        back64 = Layout.from_cu_seqlens(torch.from_numpy(lay.cu_seqlens(form=form, dtype="int64")), form=form,
                                        total=total, cu_padded=lay.cu_seqlens_padded(dtype="int64"),
                                        **spec["rule"])
        assert back64 == lay
    if spec["kind"] == "packed":  # no filler at all: cu_seqlens alone is enough
        assert Layout.from_cu_seqlens(lay.cu_seqlens(), **spec["rule"]) == lay


@st.composite
def position_id_specs(draw):
    """Layouts whose position_ids() determine them uniquely: every sequence non-empty (an empty one
    has no positions), a packed stream's last sequence of length >= 2 and padded rows with no pad or
    at least two pads (a trailing run of two or more zeros is tail padding by definition, while a
    single 0 at the end is a length-1 sequence), and every padded sequence of length >= 2 (a length-1
    sequence followed by pads would be one run of zeros). Left padding is drawn too, with sequences
    of length >= 2: its pads, written as position 0 before the sequence, read as length-1 sequences
    (see the test)."""
    spec = draw(layout_specs(kinds=("packed", "right", "left"), min_len=1))
    segs = spec["segments"]
    if spec["kind"] == "packed":
        assume(segs[-1][2] >= 2)
    elif spec["kind"] == "left":
        assume(all(n >= 2 for (_b, _qs, n, _ks, _kn) in segs))
    else:
        for (_b, _qs, n, _ks, _kn) in segs:
            assume(n >= 2 and spec["q_width"] - n != 1)
    return spec


@given(position_id_specs(), st.sampled_from(["reset", "step"]))
def test_roundtrip_position_ids(spec, boundary):
    lay = build(spec)
    pos = lay.position_ids()
    if spec["kind"] == "left":
        # Left padding: every pad is a 0 followed by another 0, so under both rules each reads as a
        # length-1 sequence; the real sequences come back exactly, with the same positions. (Spans
        # and prefixes are per segment index, which the extra segments shift: rule without them.)
        r = {key: spec["rule"][key] for key in ("causal", "alignment", "window")}
        back = Layout.from_position_ids(pos, rule=boundary, **r)
        np.testing.assert_array_equal(back.position_ids(), pos)
        real, got = set(lay.segments), set(back.segments)
        assert real <= got
        pads = ~np.asarray(lay.mask2d())
        extra = got - real
        assert len(extra) == int(pads.sum())
        assert all(seg[2] == 1 and seg[4] == 1 and pads[seg[0], seg[1]] for seg in extra)
        return
    back = Layout.from_position_ids(pos, rule=boundary, **spec["rule"])
    assert back == lay
    np.testing.assert_array_equal(back.allowed(), reference_allowed(spec))
    # M-RoPE [3, B, S]: the text row decides, the other rows are ignored. A packed stream is passed
    # as [3, 1, T] (a [3, T] array would be three rows) and comes back as one padded row.
    rows = pos if pos.ndim == 2 else pos[None]
    garbage = np.arange(rows.size, dtype=np.int64).reshape(rows.shape) % 7
    mrope = np.stack([rows, garbage, garbage[::-1].copy()])
    m = Layout.from_position_ids(mrope, rule=boundary, **spec["rule"])
    assert m.segments == lay.segments and m.n_rows == rows.shape[0] and not m.packed
    np.testing.assert_array_equal(m.allowed(), reference_allowed(spec))


@given(layout_specs(kinds=("right", "left", "packed", "packed_rows", "segments")),
       st.sampled_from(["keep", "masked", "additive"]))
def test_roundtrip_mask4d_reproduces_predicate(spec, convention):
    lay = build(spec)
    a = reference_allowed(spec)
    dense = lay.mask4d(convention, fill="min") if convention == "additive" else lay.mask4d(convention)
    back = Layout.from_mask4d(dense, convention=convention)
    np.testing.assert_array_equal(back.allowed(), a)
    np.testing.assert_array_equal(back.mask4d(convention, fill="min") if convention == "additive"
                                  else back.mask4d(convention), dense)
    # every real token comes back as a token (tokens see at least themselves under every rule drawn)
    np.testing.assert_array_equal(back.mask2d().reshape(-1), lay.mask2d().reshape(-1))


@pytest.mark.parametrize("length,window,span", [
    (3, (0, 1), (0, 2)), (3, (0, -1), (1, 3)), (4, (1, 1), (0, 3)), (5, (-1, 1), (1, 4)),
    (3, (1, 0), (1, 3)), (3, (0, 0), (1, 3)),
])
def test_roundtrip_mask4d_bidirectional_window_with_spans(length, window, span):
    # A bidirectional windowed rule with a span is a layout (it is built right here), so
    # from_mask4d must recover one that reproduces its mask (cases the property above once found).
    lay = Layout.from_lengths([length], placement="packed", causal=False, window=window, spans=[(0, *span)])
    dense = lay.mask4d("masked")
    back = Layout.from_mask4d(dense, convention="masked")
    np.testing.assert_array_equal(back.allowed(), lay.allowed())
    np.testing.assert_array_equal(back.mask4d("masked"), dense)


def test_roundtrip_mask4d_every_small_packed_window_span():
    # The engineer's sweep that first showed the gap: every packed length 2-5, every bidirectional
    # window -1..2 on each side, every single span. All must come back with the same predicate.
    n = 0
    for length in range(2, 6):
        for wl in range(-1, 3):
            for wr in range(-1, 3):
                for a in range(length):
                    for b in range(a + 1, length + 1):
                        lay = Layout.from_lengths([length], placement="packed", causal=False, window=(wl, wr),
                                                  spans=[(0, a, b)])
                        back = Layout.from_mask4d(lay.mask4d("keep"), convention="keep")
                        np.testing.assert_array_equal(back.allowed(), lay.allowed())
                        n += 1
    assert n == 16 * (3 + 6 + 10 + 15)


@given(layout_specs(kinds=("right", "left", "packed_rows", "segments")))
def test_mask2d_from_mask4d_finds_the_tokens(spec):
    lay = build(spec)
    want = lay.mask2d().reshape(spec["n_rows"], spec["q_width"])
    for conv in ("keep", "masked"):
        np.testing.assert_array_equal(maskpack.mask2d_from_mask4d(lay.mask4d(conv), conv), want)
    np.testing.assert_array_equal(maskpack.mask2d_from_mask4d(lay.mask4d("additive", fill="min"), "additive"), want)
    np.testing.assert_array_equal(maskpack.mask2d_from_mask4d(want, "keep"), want)


@given(layout_specs())
def test_with_rule_keeps_segments(spec):
    lay = Layout.from_segments(spec["segments"], spec["n_rows"], spec["q_width"], spec["kv_width"],
                               packed=spec["packed"], alignment=spec["rule"]["alignment"])
    other = lay.with_rule(**spec["rule"])
    assert other.segments == lay.segments
    np.testing.assert_array_equal(other.allowed(), reference_allowed(spec))
    assert other == build(spec)


def drawn_features(spec, cp=1):
    """The features of interest one drawn example has (names as in FEATURE_FLOORS)."""
    segs, rule, f = spec["segments"], spec["rule"], set()
    f.add("kind " + spec["kind"])
    if spec["kind"] == "left" and any(qs > 0 for (_b, qs, _n, _ks, _kn) in segs):
        f.add("left padding")
    if any(n == 0 for (_b, _qs, n, _ks, _kn) in segs):
        f.add("empty segment")
    if any(n == 1 for (_b, _qs, n, _ks, _kn) in segs):
        f.add("length-1 sequence")
    for (_b, _qs, ql, _ks, kl) in segs:
        if ql and kl and ql != kl:
            f.add("q_len != kv_len, " + rule["alignment"])
            if ql > kl and rule["alignment"] == "bottom_right":
                f.add("q_len > kv_len, bottom_right (rows that see nothing)")
    f.add("causal" if rule["causal"] else "bidirectional")
    if tuple(rule["window"]) != (-1, -1):
        f.add("window")
    if rule["spans"]:
        f.add("spans")
    if rule["prefix"] is not None and any(rule["prefix"]):
        f.add("prefix")
    lens = [n for (_b, _qs, n, _ks, _kn) in segs]
    if cp > 1 and spec["packed"] and len(set(lens)) > 1:
        f.add("cp > 1, packed slots of unequal lengths")
    if cp > 1 and not spec["packed"] and len(set(lens)) > 1:
        f.add("cp > 1, padded rows of unequal lengths")
    return f


# Floors: the share of drawn examples (per run of the profile) that must have each feature; the
# properties above only check what the strategies draw. Measured with the "ci" profile (200).
FEATURE_FLOORS = {
    "kind right": 0.05, "kind left": 0.05, "kind packed": 0.05, "kind packed_rows": 0.05, "kind segments": 0.05,
    "kind cross": 0.05,
    "left padding": 0.04,
    "empty segment": 0.10,
    "length-1 sequence": 0.05,
    "q_len != kv_len, top_left": 0.04,
    "q_len != kv_len, bottom_right": 0.04,
    "q_len > kv_len, bottom_right (rows that see nothing)": 0.02,
    "causal": 0.2, "bidirectional": 0.2, "window": 0.2, "spans": 0.05, "prefix": 0.05,
    "cp > 1, packed slots of unequal lengths": 0.04,
    "cp > 1, padded rows of unequal lengths": 0.04,
}
FEATURE_REPORT = []  # lines for the run's terminal summary (conftest.py prints them)


def test_strategies_cover_every_feature():
    # The properties above are only as good as the layouts drawn: every kind and every feature of
    # interest shows up in at least its floor's share of the examples (the draws of test_moves'
    # shard property, with cp, included), and the frequencies are reported with the run.
    counts, n = {}, [0]

    @given(layout_specs(), st.sampled_from([1, 2, 4]))
    def collect(spec, cp):
        n[0] += 1
        for name in drawn_features(spec, cp):
            counts[name] = counts.get(name, 0) + 1

    collect()
    FEATURE_REPORT[:] = ["%-55s %5.1f%%  (floor %4.1f%%)" % (name, 100 * counts.get(name, 0) / n[0], 100 * floor)
                         for name, floor in FEATURE_FLOORS.items()]
    FEATURE_REPORT.append("(%d examples of layout_specs)" % n[0])
    if n[0] < 100:  # the "quick" profile: its first examples are the simplest ones, shares mean little
        pytest.skip("feature floors need a run of >= 100 examples; this profile drew %d (see the summary)" % n[0])
    low = {name: counts.get(name, 0) / n[0] for name, floor in FEATURE_FLOORS.items()
           if counts.get(name, 0) / n[0] < floor}
    assert not low, "features under their floor: %r" % low


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])


def _keep_reference(row):
    """The KEEP contract for one row, read left to right: (start, len) of its single run of ones, or
    the first violation met: ("value", column) for a value other than 0/1, ("hole", first pad
    column after the tokens began) when a token follows it."""
    first = gap = None
    for s, v in enumerate(row):
        if v not in (0, 1):
            return ("value", s)
        if v == 1:
            if gap is not None:
                return ("hole", gap)
            first = s if first is None else first
        elif first is not None and gap is None:
            gap = s
    if first is None:
        return (0, 0)
    return (first, (gap if gap is not None else len(row)) - first)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0, 0, 1, 1, 1, 2, -1]), min_size=1, max_size=70), min_size=1, max_size=4),
       st.sampled_from(["bool", "int8", "uint8", "int32", "int64", "int16"]), st.booleans())
def test_mask2d_keep_scan_any_dtype_and_stride(rows, dtype, strided):
    # the vectorized scan of contiguous rows and the general one agree with the contract, malformed
    # rows included (the error names the same row and column)
    S = max(map(len, rows))
    grid = np.zeros((len(rows), S), dtype=np.int64)
    for b, r in enumerate(rows):
        grid[b, :len(r)] = r
    if dtype == "bool":
        grid = np.clip(grid, 0, 1)
    if dtype == "uint8":
        grid = np.abs(grid)
    arr = grid.astype(dtype)
    if strided:  # every other column of a twice-as-wide array: the same values, a column stride of 2
        wide = np.zeros((arr.shape[0], 2 * S), dtype=arr.dtype)
        wide[:, ::2] = arr
        arr = wide[:, ::2]
    want = [_keep_reference(list(map(int, r))) for r in grid]
    bad = [(b, w) for b, w in enumerate(want) if isinstance(w[0], str)]
    if bad:
        b, (kind, col) = bad[0]
        with pytest.raises(maskpack.Error) as e:
            Layout.from_mask2d(arr, convention="keep")
        assert e.value.index == (b, col) or e.value.index == [b, col]
        assert ("expected 0 or 1" in str(e.value)) == (kind == "value")
        return
    lay = Layout.from_mask2d(arr, convention="keep")
    got = [(g[0], g[1], g[2]) for g in lay.segments]  # (row, q_start, q_len, kv_start, kv_len)
    assert got == [(b, s, n) for b, (s, n) in enumerate(want) if n > 0]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=40), st.sampled_from(["reset", "step"]),
       st.sampled_from(["int64", "int32", "int16"]), st.integers(0, 3), st.integers(0, 2))
def test_position_ids_scan_matches_the_rule(lengths, rule, dtype, tail, base):
    # runs counting from `base` (RoBERTa-like rows start above 0), then a tail of zeros (padding once
    # two or more), against the boundary rule written out
    ids = [base + i for n in lengths for i in range(n)] + [0] * tail
    arr = np.array(ids, dtype=dtype)
    zeros = len(ids) - len("".join("x" if v else "0" for v in ids).rstrip("0"))  # the trailing run of zeros
    E = len(ids) - zeros if zeros >= 2 else len(ids)
    real = ids[:E]
    if not real:
        assert Layout.from_position_ids(arr, rule=rule).n_segments == 0
        return
    mn = min(real)
    starts = [0] + [c for c in range(1, E) if (real[c] == mn if rule == "reset" else real[c] - 1 != real[c - 1])]
    want = [(s, e - s) for s, e in zip(starts, starts[1:] + [E])]
    lay = Layout.from_position_ids(arr, rule=rule)
    assert [(g[1], g[2]) for g in lay.segments] == want
