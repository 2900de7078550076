"""Relayout (pack, unpack, CP shard and gather), label shifting, loss weights and last tokens, and the
property that a CP rank's shard layout derives the original predicate restricted to its queries."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import maskpack
from maskpack import Layout

from test_properties import build, layout_specs


def _padded(lengths, left=False, width=None):
    return Layout.from_lengths(lengths, placement="left" if left else "right", capacity=width)


def test_pack_unpack_numpy_and_strided():
    lay = _padded([3, 5, 0, 2], left=True)
    x = np.arange(4 * 5 * 3, dtype=np.float32).reshape(4, 5, 3)
    idx = np.asarray(lay.valid_indices())
    packed = lay.pack(x)
    np.testing.assert_array_equal(packed, x.reshape(20, 3)[idx])  # flash-attn's unpad_input
    back = lay.unpack(packed, pad_value=-2.5)
    m = np.asarray(lay.mask2d())
    np.testing.assert_array_equal(back[m], x[m])
    assert (back[~m] == -2.5).all()
    # a strided view of rows (every other row of a bigger array) is read in place
    big = np.zeros((8, 5, 3), dtype=np.float32)
    big[::2] = x
    np.testing.assert_array_equal(lay.pack(big[::2]), packed)
    # out= is written in place
    out = np.full((10, 3), 7.0, dtype=np.float32)
    assert lay.pack(x, out=out) is out
    np.testing.assert_array_equal(out, packed)


def test_pack_unpack_torch_bf16_and_ints():
    lay = Layout.from_mask2d(torch.tensor([[1, 1, 0], [0, 1, 1]]), convention="keep")
    x = torch.randn(2, 3, 4, 8, dtype=torch.bfloat16)
    p = lay.pack(x)
    assert isinstance(p, torch.Tensor) and p.dtype == torch.bfloat16 and p.shape == (4, 4, 8)
    assert torch.equal(p, x.reshape(6, 4, 8)[torch.tensor([0, 1, 4, 5])])
    u = lay.unpack(p, pad_value=1.5)
    assert torch.equal(u[0, 2], torch.full((4, 8), 1.5, dtype=torch.bfloat16))
    ids = torch.tensor([[5, 6, 0], [0, 7, 8]])
    assert lay.pack(ids).tolist() == [5, 6, 7, 8]


def test_relayout_errors_leave_out_untouched():
    lay = _padded([3, 2])
    x = np.zeros((2, 3, 4), dtype=np.float32)
    out = np.full((5, 3), 9.0, dtype=np.float32)  # wrong trailing size
    with pytest.raises(maskpack.Error) as e:
        lay.pack(x, out=out)
    assert e.value.status == "MASKPACK_ERR_SHAPE"
    assert (out == 9.0).all()
    out_dt = np.zeros((5, 4), dtype=np.float64)
    with pytest.raises(maskpack.Error) as e:
        lay.pack(x, out=out_dt)
    assert e.value.status == "MASKPACK_ERR_DTYPE"
    with pytest.raises(maskpack.Error) as e:  # in-place pack of a buffer onto itself
        lay.pack(x, out=x.reshape(-1, 4)[:5])
    assert e.value.status == "MASKPACK_ERR_OVERLAP"
    with pytest.raises(maskpack.Error) as e:  # two batches of different sequences
        maskpack.relayout(x, lay, _padded([3, 1]))
    assert e.value.status == "MASKPACK_ERR_SHAPE" and "sequence 1" in e.value.message


def test_te_and_megatron_cp_golden_vectors():
    lay = Layout.from_cu_seqlens(np.array([0, 8, 16], dtype=np.int32), form="te")
    assert list(lay.cp_shard_indices(2, 0, align=None)) == [0, 1, 6, 7, 8, 9, 14, 15]
    assert list(lay.cp_shard_indices(2, 1, align=None)) == [2, 3, 4, 5, 10, 11, 12, 13]
    row = Layout.from_lengths([8])
    assert list(row.cp_shard_indices(2, 0, align=None)) == [0, 1, 6, 7]
    assert list(row.cp_shard_indices(2, 1, align=None)) == [2, 3, 4, 5]
    # verl's tp*cp*2 and the minimal cp*lcm(2, tp); never lcm(tp, 2cp) (= 4 for tp 4, cp 2)
    assert maskpack.cp_multiple(2, 4, "verl") == 16
    assert maskpack.cp_multiple(2, 4, "minimal") == 8


def test_cp_never_truncates():
    lay = Layout.from_lengths([5, 3], placement="packed")
    with pytest.raises(maskpack.Error) as e:
        lay.cp_shard(2, 0, align=None)
    assert "not divisible" in e.value.message and "nothing is truncated" in e.value.message
    shards = [lay.cp_shard(2, r, align="minimal") for r in range(2)]
    assert sum(s.n_tokens for s in shards) == 8
    with pytest.raises(maskpack.Error) as e:
        lay.cp_shard(2, 2)
    assert e.value.status == "MASKPACK_ERR_INVALID_ARGUMENT"


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("scheme", ["zigzag", "contiguous"])
def test_shard_then_gather_roundtrip(cp, scheme):
    rng = np.random.default_rng(cp * 10 + len(scheme))
    for _ in range(20):
        lengths = rng.integers(0, 30, size=rng.integers(1, 6)).tolist()
        pad = _padded(lengths, left=bool(rng.integers(0, 2)))
        packed = pad.packed_of()
        x = rng.standard_normal((pad.n_rows, pad.q_width, 3)).astype(np.float32)
        # padded -> rank shard of the packed layout in one call, equal to pack then shard
        parts = [maskpack.relayout(x, pad, packed.cp_shard(cp, r, scheme=scheme)) for r in range(cp)]
        for r in range(cp):
            np.testing.assert_array_equal(parts[r], packed.shard(pad.pack(x), cp, r, scheme=scheme))
        back = maskpack.cp_gather(parts, packed, scheme=scheme)
        np.testing.assert_array_equal(back, pad.pack(x))
        # and straight back into the padded layout
        shards = [packed.cp_shard(cp, r, scheme=scheme) for r in range(cp)]
        np.testing.assert_array_equal(maskpack.relayout(parts, shards, pad), pad.unpack(pad.pack(x)))
        if cp > 1 and shards[-1].n_tokens > 0:  # a missing rank's part is an error, never zeros
            with pytest.raises(maskpack.Error) as e:
                maskpack.relayout(parts[:-1], shards[:-1], packed)
            assert "has no source" in e.value.message


def expected_shard_indices(lay, cp, r, scheme):
    """A rank's token indices from the scheme's definition (not the library's): contiguous cuts each
    row, or the packed stream, into cp chunks and rank r takes chunk r; zigzag cuts each row, or each
    slot of a packed stream (a sequence and the padding up to the next one; the first from 0), into
    2 cp chunks and rank r takes chunks r and 2 cp - 1 - r, in that order, slot after slot. At cp = 1
    both schemes are the identity (nothing must divide)."""
    B, S = lay.n_rows, lay.q_width
    if cp == 1:
        return np.arange(B * S, dtype=np.int64)
    out = []
    if lay.packed and scheme == "zigzag":
        starts = [0] + [seg[1] for seg in lay.segments[1:]]
        for a, z in zip(starts, starts[1:] + [S]):
            c = (z - a) // (2 * cp)
            out += list(range(a + r * c, a + (r + 1) * c)) + list(range(a + (2 * cp - 1 - r) * c, a + (2 * cp - r) * c))
        return np.array(out, dtype=np.int64)
    c = S // (2 * cp if scheme == "zigzag" else cp)
    for b in range(B):
        out += range(b * S + r * c, b * S + (r + 1) * c)
        if scheme == "zigzag":
            out += range(b * S + (2 * cp - 1 - r) * c, b * S + (2 * cp - r) * c)
    return np.array(out, dtype=np.int64)


def test_zigzag_goldens_cp4_unequal_slots():
    """By hand: packed slots of 8 and 16 tokens, cp = 4 (chunks of 1 and 2), and padded rows of 16."""
    lay = maskpack.Layout.from_cu_seqlens([0, 8, 24])
    want = [[0, 7, 8, 9, 22, 23], [1, 6, 10, 11, 20, 21], [2, 5, 12, 13, 18, 19], [3, 4, 14, 15, 16, 17]]
    for r in range(4):
        assert np.asarray(lay.cp_shard_indices(4, r, align=None)).tolist() == want[r]
    x = np.arange(24)
    assert np.asarray(lay.shard(x, 4, 1, align=None)).tolist() == want[1]
    pad = maskpack.Layout.from_lengths([16, 9], placement="right")
    assert np.asarray(pad.cp_shard_indices(4, 2, align=None)).tolist() == [4, 5, 10, 11, 20, 21, 26, 27]


@given(layout_specs(kinds=("right", "left", "packed", "packed_rows", "segments")), st.sampled_from([1, 2, 4]),
       st.sampled_from(["zigzag", "contiguous"]))
def test_shard_layout_derives_the_restricted_predicate(spec, cp, scheme):
    """Issue 2's property with cp in {1, 2, 4}: every derived output of a rank's shard equals the
    original predicate on that rank's queries."""
    lay = build(spec)
    glob = lay.pad_to_multiple(maskpack.cp_multiple(cp, 1, "minimal"))
    if glob.packed and scheme == "contiguous" and glob.q_width % cp:
        return
    dense = np.asarray(glob.allowed())  # [B, S, Skv]
    B, S, K = dense.shape
    flat = dense.reshape(B * S, K)
    pos = np.asarray(glob.position_ids()).reshape(-1)
    segid = np.asarray(glob.segment_ids()).reshape(-1)
    for r in range(cp):
        shard = glob.cp_shard(cp, r, scheme=scheme, align=None)
        idx = np.asarray(glob.cp_shard_indices(cp, r, scheme=scheme, align=None))
        np.testing.assert_array_equal(idx, expected_shard_indices(glob, cp, r, scheme))
        m4 = np.asarray(shard.mask4d("masked"))[:, 0].reshape(shard.n_rows * shard.q_width, K)
        np.testing.assert_array_equal(~m4, flat[idx])
        np.testing.assert_array_equal(np.asarray(shard.mask2d()).reshape(-1), segid[idx] > 0)
        np.testing.assert_array_equal(np.asarray(shard.position_ids()).reshape(-1), pos[idx])
        np.testing.assert_array_equal(np.asarray(shard.segment_ids()).reshape(-1), segid[idx])
        bm = shard.block_mask(4, 8)
        kvn = np.asarray(bm["kv_num_blocks"])[:, 0]
        full = np.asarray(bm["full_kv_num_blocks"])[:, 0]
        kvi = np.asarray(bm["kv_indices"])[:, 0]
        fki = np.asarray(bm["full_kv_indices"])[:, 0]
        sd = (~m4).reshape(shard.n_rows, shard.q_width, K)
        for b in range(shard.n_rows):
            for qb in range(kvn.shape[1]):
                listed = set(kvi[b, qb, : kvn[b, qb]].tolist()) | set(fki[b, qb, : full[b, qb]].tolist())
                for kb in range(-(-K // 8)):
                    blk = sd[b, qb * 4:(qb + 1) * 4, kb * 8:(kb + 1) * 8]
                    assert (kb in listed) == bool(blk.any())


def test_shift_labels_and_loss_weights_agree_across_layouts():
    rng = np.random.default_rng(7)
    for _ in range(30):
        lengths = rng.integers(0, 20, size=rng.integers(1, 5)).tolist()
        pad = _padded(lengths, left=bool(rng.integers(0, 2)))
        labels = rng.integers(0, 1000, size=(pad.n_rows, pad.q_width))
        labels[rng.random(labels.shape) < 0.2] = -100
        shifted = pad.shift_labels(labels)
        m = np.asarray(pad.mask2d())
        for b in range(pad.n_rows):  # naive reference
            cols = np.nonzero(m[b])[0]
            for t, c in enumerate(cols):
                want = labels[b, cols[t + 1]] if t + 1 < len(cols) else -100
                assert shifted[b, c] == want
            assert (shifted[b, ~m[b]] == -100).all()
        loss = rng.random((pad.n_rows, pad.q_width))
        for mode in ("token", "sequence"):
            w, denom = pad.loss_weights(mode, labels=shifted, dtype="float64", return_denominator=True)
            lab = (shifted != -100) & m
            if mode == "token":
                ref = loss[lab].mean() if lab.any() else 0.0
            else:
                per = [loss[b][lab[b]].mean() for b in range(pad.n_rows) if lab[b].any()]
                ref = float(np.mean(per)) if per else 0.0
            assert abs((loss * w).sum() - ref) < 1e-12
            packed = pad.packed_of()
            for cp in (1, 2, 4):
                total = sum((pad.shard(loss, cp, r) * pad.shard(w, cp, r)).sum() for r in range(cp))
                assert abs(total - ref) < 1e-12
                total_packed = sum(
                    (maskpack.relayout(loss, pad, packed.cp_shard(cp, r)) *
                     maskpack.relayout(w, pad, packed.cp_shard(cp, r))).sum() for r in range(cp))
                assert abs(total_packed - ref) < 1e-12


def test_last_tokens_and_their_cp_rank():
    lay = _padded([4, 0, 7, 1])
    x = np.arange(4 * 7 * 2).reshape(4, 7, 2)
    rows = lay.gather_last_tokens(x)
    np.testing.assert_array_equal(rows[0], x[0, 3])
    np.testing.assert_array_equal(rows[1], [0, 0])
    np.testing.assert_array_equal(rows[2], x[2, 6])
    packed = lay.packed_of()
    for cp in (2, 4):
        rank, local = packed.cp_last_token(cp)
        last = np.asarray(packed.pad_to_multiple(maskpack.cp_multiple(cp)).last_token_index())
        for k in range(4):
            if local[k] < 0:
                assert last[k] < 0
                continue
            idx = np.asarray(packed.cp_shard_indices(cp, int(rank[k])))
            assert idx[local[k]] == last[k]
    t = lay.gather_last_tokens(torch.as_tensor(x))
    assert isinstance(t, torch.Tensor) and t[2].tolist() == x[2, 6].tolist()


# ---- the fast path (tensors read by the extension), cached plans and the worker team -------------


def _big_padded(seed=0, rows=8, width=512):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(width // 2, width + 1, size=rows)
    return Layout.from_lengths(lengths.tolist(), capacity=width), lengths


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_out_moves_on_the_team_match_indexing(threads, kind):
    # 8 x 512 x 64 float32: 1 MB, split in 64 KiB chunks between the caller and the team
    lay, lengths = _big_padded()
    x = torch.randn(8, 512, 64)
    idx = torch.as_tensor(np.asarray(lay.valid_indices()))
    want = x.reshape(-1, 64).index_select(0, idx)
    xs = x if kind == "torch" else x.numpy()
    out = torch.full((int(lengths.sum()), 64), 5.0)
    outs = out if kind == "torch" else out.numpy()
    for _ in range(20):  # repeated calls reuse the plan and the running team
        assert lay.pack(xs, out=outs, threads=threads) is outs
        assert torch.equal(out, want)
    back = torch.full((8, 512, 64), 9.0)
    backs = back if kind == "torch" else back.numpy()
    lay.unpack(outs, pad_value=-1.5, out=backs, threads=threads)
    m = torch.as_tensor(np.asarray(lay.mask2d()))
    assert torch.equal(back[m], x[m])
    assert bool((back[~m] == -1.5).all())
    # the shard move through maskpack.relayout (plan cached on the source) against its own indices
    sl = lay.packed_of().cp_shard(2, 1)
    part = torch.empty(sl.q_width, 64)
    parts = part if kind == "torch" else part.numpy()
    maskpack.relayout(xs, lay, sl, out=parts, threads=threads)
    maskpack.relayout(xs, lay, sl, out=parts, threads=threads)
    g = torch.as_tensor(np.asarray(lay.packed_of().cp_shard_indices(2, 1)))
    aligned = lay.packed_of().pad_to_multiple(maskpack.cp_multiple(2))
    stream = maskpack.relayout(want, lay.packed_of(), aligned)  # packed -> aligned stream (zero pads)
    assert torch.equal(part, torch.as_tensor(np.asarray(stream))[g])


def test_fast_path_errors_leave_out_untouched_and_fallbacks_work():
    lay, lengths = _big_padded(1)
    T = int(lengths.sum())
    x = torch.randn(8, 512, 16)
    out = torch.full((T + 1, 16), 3.0)  # one token too many
    with pytest.raises(maskpack.Error) as e:
        lay.pack(x, out=out)
    assert e.value.status == "MASKPACK_ERR_SHAPE"
    assert bool((out == 3.0).all())
    wrong = torch.full((T, 16), 3.0, dtype=torch.float64)
    with pytest.raises(maskpack.Error) as e:
        lay.pack(x, out=wrong)
    assert e.value.status == "MASKPACK_ERR_DTYPE"
    assert bool((wrong == 3.0).all())
    with pytest.raises(maskpack.Error) as e:  # overlapping input and output, through the fast path
        lay.pack(x, out=x.view(-1, 16)[:T])
    assert e.value.status == "MASKPACK_ERR_OVERLAP"
    # objects the extension does not read itself take the package's checked path: nested lists, read-only arrays
    ro = np.zeros((T, 16), dtype=np.float32)
    ro.setflags(write=False)
    with pytest.raises((maskpack.Error, ValueError, TypeError)):
        lay.pack(x.numpy(), out=ro)
    small = Layout.from_lengths([2, 1])
    got = small.pack([[[1.0], [2.0]], [[3.0], [0.0]]])
    np.testing.assert_array_equal(np.asarray(got).ravel(), [1.0, 2.0, 3.0])
    # a sparse tensor is refused with the checked path's message
    with pytest.raises(TypeError, match="strided"):
        small.pack(torch.zeros(2, 2, 1).to_sparse(), out=torch.zeros(3, 1))
    with pytest.raises(maskpack.Error):
        lay.pack(x, out=torch.zeros(T, 16), threads=0)


def test_plans_are_cached_per_layout_pair_and_survive_id_reuse():
    lay, lengths = _big_padded(2, rows=4, width=64)
    x = torch.randn(4, 64, 3)
    for seed in range(30):  # new destination layouts, some reusing a freed one's id
        other = Layout.from_lengths(lengths.tolist(), capacity=64 + seed % 3)
        got = maskpack.relayout(x, lay, other)
        assert got.shape == (4, 64 + seed % 3, 3)
        m = torch.as_tensor(np.asarray(lay.mask2d()))
        m2 = torch.as_tensor(np.asarray(other.mask2d()))
        assert torch.equal(got[m2], x[m])
        # again into a given out: the fast path finds the cached plan only for this very layout
        into = torch.full((4, 64 + seed % 3, 3), 8.0)
        assert maskpack.relayout(x, lay, other, out=into) is into
        assert torch.equal(into, got)
        del other


def _pack_in_child(q):
    # numpy only: torch's OpenMP pool hangs in a forked child once the parent has used it
    lay, lengths = _big_padded(3)
    x = np.random.default_rng(0).standard_normal((8, 512, 32)).astype(np.float32)
    out = np.empty((int(lengths.sum()), 32), dtype=np.float32)
    lay.pack(x, out=out, threads=2)
    q.put(bool(np.array_equal(out, x.reshape(-1, 32)[np.asarray(lay.valid_indices())])))


def test_team_in_a_forked_child():
    import multiprocessing as mp

    lay, lengths = _big_padded(3)
    x = np.zeros((8, 512, 32), dtype=np.float32)
    lay.pack(x, out=np.empty((int(lengths.sum()), 32), dtype=np.float32), threads=2)  # the parent's team runs
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_pack_in_child, args=(q,))
    p.start()
    try:
        ok = q.get(timeout=60)
        p.join(60)
    finally:
        if p.is_alive():
            p.kill()
    assert ok and p.exitcode == 0


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                   torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_torch_fast_path_reads_dtypes_offsets_and_strides(dtype):
    # the extension reads torch tensors through DLPack: every dtype, a storage offset, strided token
    # dims, a tensor that requires grad, and a destination view inside a larger buffer
    lay = Layout.from_lengths([5, 0, 3, 7], capacity=9)
    big = (torch.arange(4 * 12 * 6) % 7).reshape(4, 12, 6).to(dtype)
    x = big[:, 2:11, 1:4]  # [4, 9, 3]: offset into the storage, token dims strided, a token contiguous
    assert x.storage_offset() > 0 and not x.is_contiguous()
    m = torch.as_tensor(np.asarray(lay.mask2d()))
    want = x[m]
    canvas = torch.zeros(2, 15, 3, dtype=dtype)
    out = canvas[1]  # storage offset of one buffer row
    assert lay.pack(x, out=out) is out
    assert torch.equal(out, want)
    assert torch.equal(canvas[0], torch.zeros(15, 3, dtype=dtype))  # nothing outside out was written
    back = torch.ones(9, 4, 3, dtype=dtype).transpose(0, 1)  # [4, 9, 3] with swapped token strides
    lay.unpack(out, out=back)
    assert torch.equal(back[m], want)
    assert not bool(back[~m].any())
    if dtype.is_floating_point:
        g = x.clone().requires_grad_(True)
        with torch.no_grad():  # out= is for moves autograd does not record
            assert torch.equal(lay.pack(g, out=torch.empty_like(want)), want)
        with pytest.raises(maskpack.Error, match="autograd"):
            lay.pack(g, out=torch.empty_like(want))


def test_torch_fast_path_refuses_tensors_it_cannot_read():
    lay = Layout.from_lengths([2, 1])
    with pytest.raises((maskpack.Error, TypeError, ValueError)):  # no storage: refused, nothing read
        lay.pack(torch.empty(2, 2, 4, device="meta"), out=torch.zeros(3, 4))
    out = torch.full((3, 4), 7.0)
    with pytest.raises((maskpack.Error, TypeError, ValueError)):
        lay.pack(torch.zeros(2, 2, 4, dtype=torch.complex64), out=out)
    assert bool((out == 7.0).all())


def test_lazily_negated_views_are_read_resolved_and_refused_as_out():
    # conj().imag is a float view with torch's negative bit: its memory holds -x
    lay = Layout.from_lengths([3, 2])
    m = torch.as_tensor(np.asarray(lay.mask2d()))
    x = torch.randn(2, 3, 4, dtype=torch.complex64).conj().imag
    assert x.is_neg()
    assert torch.equal(lay.pack(x, out=torch.empty(5, 4)), x[m])  # fast path declines, the checked path resolves
    assert torch.equal(lay.pack(x), x[m])
    out = torch.zeros(5, 4, dtype=torch.complex64).conj().imag
    before = out.clone()
    with pytest.raises(TypeError, match="negative bit"):
        lay.pack(torch.randn(2, 3, 4), out=out)
    assert torch.equal(out, before)


# ---- Layout.padded_of ----------------------------------------------------------------------------------

def test_padded_of_right_left_and_width():
    packed = maskpack.Layout.from_lengths([4, 2, 3], placement="packed")
    right = packed.padded_of()
    assert (right.n_rows, right.q_width, right.packed) == (3, 4, False)
    np.testing.assert_array_equal(right.mask2d(), [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    left = packed.padded_of("left", width=6)
    assert (left.n_rows, left.q_width) == (3, 6)
    np.testing.assert_array_equal(left.mask2d(), [[0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(left.position_ids()[1], [0, 0, 0, 0, 0, 1])
    # the same sequences, in order
    np.testing.assert_array_equal(left.seqlens, [4, 2, 3])
    with pytest.raises(maskpack.Error) as e:
        packed.padded_of("right", width=3)  # the longest sequence has 4 tokens
    assert e.value.status.startswith("MASKPACK_ERR")
    with pytest.raises(ValueError):
        packed.padded_of("middle")


# ---- relayout of strided tokens of 256 bytes or more, large enough to stream -----------------------

def test_pack_unpack_strided_wide_tokens():
    # 35000 tokens of 128 float32 (512 bytes) read from a [.., 256] buffer (token stride 1024 bytes):
    # 17.9 MB moved, past the relayout's non-temporal-store threshold, token by token
    lay = maskpack.Layout.from_lengths([20000, 15000], placement="right")
    base = torch.arange(2 * 20000 * 256, dtype=torch.float32).reshape(2, 20000, 256)
    x = base[..., :128]
    assert not x.is_contiguous()
    packed = lay.pack(x)
    want = torch.cat([x[0, :20000], x[1, :15000]])
    assert torch.equal(packed, want)
    # back into a strided destination: copies token by token, padding zeroed token by token
    dst = torch.full((2, 20000, 256), -1.0)
    out = dst[..., :128]
    lay.unpack(packed, out=out)
    assert torch.equal(out[0], x[0]) and torch.equal(out[1, :15000], x[1, :15000])
    assert torch.all(out[1, 15000:] == 0), "padding tokens zeroed"
    assert torch.all(dst[..., 128:] == -1.0), "bytes between the strided tokens untouched"
