"""The Python API: every constructor and method, error mapping, input kinds and output types."""

import array
import pickle
import sys
import threading
import time

import numpy as np
import pytest
import torch

import maskpack
from maskpack import Error, Layout


# ---- package --------------------------------------------------------------------------------


def test_version_comes_from_the_c_library():
    assert maskpack.__version__ == "0.1.0"
    assert maskpack.version_number == 100
    from maskpack import _maskpack

    assert _maskpack.version() == maskpack.__version__


def test_window_converters():
    assert maskpack.window_from_hf(4) == (3, 3)
    assert maskpack.window_from_hf(1) == (0, 0)
    assert maskpack.window_from_gym(4) == (4, 4)
    assert maskpack.window_from_gym(0) == (0, 0)
    with pytest.raises(Error) as e:
        maskpack.window_from_hf(0)
    assert e.value.status == "MASKPACK_ERR_INVALID_ARGUMENT"
    assert e.value.argument == "sliding_window"
    assert "found 0" in e.value.message
    with pytest.raises(Error):
        maskpack.window_from_gym(-1)
    with pytest.raises(TypeError):
        maskpack.window_from_hf(2.5)
    with pytest.raises(TypeError):
        maskpack.window_from_hf(True)


# ---- errors ---------------------------------------------------------------------------------


def test_error_carries_status_argument_index_and_message():
    mask = np.array([[1, 1, 1, 0], [1, 0, 1, 0]], dtype=np.int8)
    with pytest.raises(Error) as info:
        Layout.from_mask2d(mask, convention="keep")
    e = info.value
    assert isinstance(e, ValueError)
    assert e.status == "MASKPACK_ERR_HOLE"
    assert e.code == 7
    assert e.argument == "mask"
    assert e.index == (1, 1)  # row 1, column 1 is the hole
    assert "row 1" in e.message and "column 1" in e.message
    assert "MASKPACK_ERR_HOLE" in str(e)
    again = pickle.loads(pickle.dumps(e))
    assert (again.status, again.code, again.argument, again.index, again.message) == (
        e.status, e.code, e.argument, e.index, e.message)


def test_error_for_non_binary_keep_mask_and_float_mask():
    with pytest.raises(Error) as e:
        Layout.from_mask2d(np.array([[1, 2, 0]]), convention="keep")
    assert e.value.status == "MASKPACK_ERR_VALUE"
    assert e.value.index[:2] == (0, 1)
    with pytest.raises(Error) as e:
        Layout.from_mask2d(np.array([[1.0, 1.0, 0.0]]), convention="keep")
    assert e.value.status == "MASKPACK_ERR_DTYPE"
    assert e.value.argument == "mask"
    with pytest.raises(Error) as e:
        Layout.from_mask2d(torch.ones(2, 3, dtype=torch.bfloat16))
    assert e.value.status == "MASKPACK_ERR_DTYPE"


def test_error_index_for_cu_seqlens():
    with pytest.raises(Error) as e:
        Layout.from_cu_seqlens([0, 4, 9, 7])
    assert e.value.status == "MASKPACK_ERR_UNSORTED"
    assert e.value.argument == "cu_seqlens"
    assert e.value.index == (3,)
    assert "7" in e.value.message and "9" in e.value.message


def test_unknown_convention_strings_are_convention_errors():
    lay = Layout.from_lengths([2, 1])
    for call in (lambda: lay.mask4d("keeps"),
                 lambda: Layout.from_mask2d(np.ones((1, 2), bool), convention="k"),
                 lambda: Layout.from_mask4d(np.ones((1, 1, 2, 2), bool), convention="mask"),
                 lambda: lay.cu_seqlens(form="flash"),
                 lambda: Layout.from_position_ids([0, 1], rule="min"),
                 lambda: Layout.from_lengths([1], alignment="bottom-right")):
        with pytest.raises(Error) as e:
            call()
        assert e.value.status == "MASKPACK_ERR_CONVENTION"
    with pytest.raises(Error) as e:
        Layout.from_lengths([1], placement="middle")
    assert e.value.status == "MASKPACK_ERR_INVALID_ARGUMENT" and e.value.argument == "placement"


def test_wrong_python_types_raise_type_error_not_crash():
    lay = Layout.from_lengths([2, 1])
    bad_calls = [
        lambda: Layout(),
        lambda: Layout.from_lengths("abc"),
        lambda: Layout.from_lengths([1.5, 2]),
        lambda: Layout.from_lengths(None),
        lambda: Layout.from_lengths([1, 2], capacity="4"),
        lambda: Layout.from_mask2d(object()),
        lambda: Layout.from_mask2d("1101"),
        lambda: Layout.from_mask2d(None),
        lambda: Layout.from_mask2d(np.ones((2, 2), dtype=np.complex64)),
        lambda: Layout.from_mask2d(np.array([[1, 0]], dtype=">i4")),
        lambda: Layout.from_mask2d(np.array([["a", "b"]])),
        lambda: Layout.from_mask2d([[1, 0], [1]]),
        lambda: Layout.from_mask4d(np.ones((1, 1, 2, 2), bool)),  # convention is required
        lambda: Layout.from_segments(5, 1, 4),
        lambda: Layout.from_segments([(0, 0)], 1, 4),
        lambda: Layout.from_segments([(0, 0, "2")], 1, 4),
        lambda: Layout.from_lengths([2], window=3),
        lambda: Layout.from_lengths([2], window=(1, 1), window_hf=2),
        lambda: Layout.from_lengths([2], window_hf=2, window_gym=2),
        lambda: Layout.from_lengths([2], causal="yes"),
        lambda: Layout.from_lengths([2], spans=[(0, 1)]),
        lambda: Layout.from_lengths([2], bogus=1),
        lambda: Layout.from_cu_seqlens([0, 2], cu_kv=[0, 3], total=3),
        lambda: lay.mask4d(),  # convention is required
        lambda: lay.mask4d(1),
        lambda: lay.mask4d("keep", heads=1.0),
        lambda: lay.position_ids(dtype=3.5),
        lambda: lay.block_mask("8"),
        lambda: lay.allowed_at(0, 0, 0.5),
        lambda: lay.npu_args(3),
        lambda: lay.npu_args("BSND", scale="1"),
        lambda: lay.with_rule(causal=None),
        lambda: lay.with_outputs("jax"),
        lambda: maskpack.validate_npu_args(input_layout=4),
        lambda: maskpack.validate_npu_args(input_layout="TND", pre_tockens=1, pre_tokens=1),
        lambda: maskpack.validate_npu_args(input_layout="TND", intended="layout"),
        lambda: maskpack.mask2d_from_mask4d(object(), "keep"),
    ]
    for k, call in enumerate(bad_calls):
        with pytest.raises(TypeError):
            call()
            pytest.fail(f"call {k} did not raise")


def test_low_level_tensor_arguments_are_checked():
    """The extension reads torch tensors and numpy arrays themselves (one reader); anything else, and
    what it cannot read, is refused naming the argument."""
    from maskpack import _maskpack

    with pytest.raises(TypeError, match="mask: expected a torch tensor or a numpy array, found str"):
        _maskpack.from_mask2d("not a tensor", 0, None)
    with pytest.raises(TypeError, match="mask: element format 'Zf' is not supported"):
        _maskpack.from_mask2d(np.zeros((2, 2), np.complex64), 0, None)
    with pytest.raises(TypeError, match="mask: a tensor with the negative bit set"):
        _maskpack.from_mask2d(torch.ones(2, 2, dtype=torch.complex64).conj().imag, 0, None)
    with pytest.raises(TypeError, match="mask: .*cannot be read as a strided host tensor"):
        _maskpack.from_mask2d(torch.ones(2, 2).to_sparse(), 0, None)
    with pytest.raises(TypeError, match="mask: dtype .* is not supported"):
        _maskpack.from_mask2d(torch.ones(2, 2, dtype=torch.complex64), 0, None)
    with pytest.raises(Error) as e:
        _maskpack.from_mask2d(np.ones((1,) * 9, bool), 0, None)
    assert e.value.status == "MASKPACK_ERR_SHAPE" and e.value.argument == "mask"
    with pytest.raises(TypeError):
        _maskpack.info("handle")
    with pytest.raises(TypeError):
        _maskpack.Layout()
    # what the reader makes of a strided torch view and of a numpy array: the same tensor
    base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    view = base.transpose(0, 2)[1:]
    assert _maskpack.tensor_info(view) == (8, (3, 3, 2), (1, 4, 12), view.data_ptr())
    a = base.numpy()[:, ::2]
    assert _maskpack.tensor_info(a) == (8, (2, 2, 4), (12, 8, 1), a.__array_interface__["data"][0])
    # a tensor that requires grad is read as it is (the autograd functions hand such tensors over)
    g = torch.ones(3, requires_grad=True)
    assert _maskpack.tensor_info(g)[3] == g.data_ptr()
    # an output the library would write: a read-only array is refused by the move's reader (it falls
    # back to the package's path, which names it)
    lay = maskpack.Layout.from_lengths([2, 1], placement="right")
    ro = np.zeros((3, 4), np.float32)
    ro.setflags(write=False)
    with pytest.raises(TypeError, match="writable"):
        lay.pack(np.ones((2, 2, 4), np.float32), out=ro)


def test_more_than_eight_dimensions_is_a_shape_error():
    for x in (np.ones((1,) * 9, bool), torch.ones((1,) * 9, dtype=torch.bool)):
        with pytest.raises(Error) as e:
            Layout.from_mask2d(x)
        assert e.value.status == "MASKPACK_ERR_SHAPE" and e.value.argument == "mask"
        assert "at most 8 dimensions" in e.value.message


def test_nothing_is_written_on_failure():
    lay = Layout.from_lengths([3, 2])
    with pytest.raises(Error) as e:
        lay.cu_seqlens(dtype="float32")
    assert e.value.status == "MASKPACK_ERR_DTYPE"
    with pytest.raises(Error) as e:
        lay.mask4d("additive", dtype="int32")
    assert e.value.status == "MASKPACK_ERR_DTYPE"
    with pytest.raises(Error) as e:
        lay.mask4d("keep", heads=0)
    assert e.value.argument == "heads"
    # calls that write into the caller's buffer leave it as it was when they fail, bit for bit
    labels = np.arange(6, dtype=np.int32).reshape(2, 3)
    out = np.full((2, 3), 77, np.int32)
    with pytest.raises(Error) as e:
        lay.shift_labels(labels, ignore_index=2 ** 40, out=out)  # does not fit int32 labels
    assert e.value.status == "MASKPACK_ERR_OVERFLOW" and e.value.argument == "ignore_index"
    assert (out == 77).all()
    padded = np.full((2, 3, 4), 5.0, np.float32)
    with pytest.raises(Error) as e:
        lay.unpack(np.ones((4, 4), np.float32), out=padded)  # 4 tokens where the layout has 5
    assert e.value.status == "MASKPACK_ERR_SHAPE"
    assert (padded == 5.0).all()
    # the extension's own entry points with a tensor of a wrong dtype
    from maskpack import _maskpack
    from maskpack._tensors import describe_out

    buf = np.full(3, 9.0, np.float32)
    with pytest.raises(Error) as e:
        _maskpack.cu_seqlens(lay._h, 0, False, describe_out(buf, "out")[0])
    assert e.value.status == "MASKPACK_ERR_DTYPE"
    assert (buf == 9.0).all()


# ---- constructors ---------------------------------------------------------------------------


def test_from_lengths_placements():
    right = Layout.from_lengths([3, 1, 0])
    assert right.segments == [(0, 0, 3, 0, 3), (1, 0, 1, 0, 1), (2, 0, 0, 0, 0)]
    assert (right.n_rows, right.q_width, right.packed) == (3, 3, False)
    left = Layout.from_lengths([3, 1], placement="left", capacity=5)
    assert left.segments == [(0, 2, 3, 2, 3), (1, 4, 1, 4, 1)]
    np.testing.assert_array_equal(left.mask2d(), [[0, 0, 1, 1, 1], [0, 0, 0, 0, 1]])
    packed = Layout.from_lengths([3, 1, 2], placement="packed")
    assert packed.packed and packed.q_width == 6 and packed.n_rows == 1
    rows = Layout.from_lengths([3, 1, 2, 4], placement="packed", capacity=5)
    assert rows.segments == [(0, 0, 3, 0, 3), (0, 3, 1, 3, 1), (1, 0, 2, 0, 2), (1, 2, 4, 2, 4)] or \
        rows.segments == [(0, 0, 3, 0, 3), (0, 3, 1, 3, 1), (1, 0, 2, 0, 2), (2, 0, 4, 0, 4)]
    assert rows.segments[3] == (2, 0, 4, 0, 4)  # next-fit: 2 + 4 > 5 opens row 2
    with pytest.raises(Error) as e:
        Layout.from_lengths([3, 6], placement="packed", capacity=5)
    assert e.value.index == (1,)
    with pytest.raises(Error) as e:
        Layout.from_lengths([3, -1])
    assert e.value.status == "MASKPACK_ERR_VALUE" and e.value.index == (1,)
    # lengths from numpy / torch / array.array
    assert Layout.from_lengths(np.array([3, 1])) == Layout.from_lengths([3, 1])
    assert Layout.from_lengths(array.array("q", [3, 1])) == Layout.from_lengths([3, 1])
    assert isinstance(Layout.from_lengths(torch.tensor([3, 1])).position_ids(), torch.Tensor)


def test_from_mask2d_keep_and_doc_id():
    keep = np.array([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=bool)
    lay = Layout.from_mask2d(keep)  # default convention: keep
    assert lay.segments == [(0, 1, 2, 1, 2), (1, 0, 4, 0, 4)]  # both-side padding is accepted
    assert lay.n_rows == 3 and lay.q_width == 4
    doc = np.array([[1, 1, 2, 2, 2, 0], [3, 3, 3, 0, 0, 0]])
    d = Layout.from_mask2d(doc, convention="doc_id")
    assert d.segments == [(0, 0, 2, 0, 2), (0, 2, 3, 2, 3), (1, 0, 3, 0, 3)]
    with pytest.raises(Error) as e:
        Layout.from_mask2d(np.array([[1, 2, 1, 0]]), convention="doc_id")  # document 1 split in two
    assert e.value.index[:2] == (0, 2)


def test_from_cu_seqlens_forms_padded_and_cross():
    te = Layout.from_cu_seqlens([0, 3, 5, 5, 9])
    npu = Layout.from_cu_seqlens([3, 5, 5, 9], form="npu")
    assert te == npu
    assert te.seqlens.tolist() == [3, 2, 0, 4]  # equal entries: an empty segment
    tail = Layout.from_cu_seqlens([0, 3, 5], total=8)
    assert tail.q_width == 8 and tail.n_tokens == 5
    # TE example from the docs: tokens a a a . b b . . c c c c .
    pad = Layout.from_cu_seqlens([0, 3, 5, 9], cu_padded=[0, 4, 8, 13])
    assert pad.segments == [(0, 0, 3, 0, 3), (0, 4, 2, 4, 2), (0, 8, 4, 8, 4)]
    np.testing.assert_array_equal(pad.cu_seqlens_padded(), [0, 4, 8, 13])
    np.testing.assert_array_equal(pad.mask2d().astype(int), [1, 1, 1, 0, 1, 1, 0, 0, 1, 1, 1, 1, 0])
    cross = Layout.from_cu_seqlens([0, 2, 5], cu_kv=[0, 4, 6], alignment="bottom_right")
    assert cross.segments == [(0, 0, 2, 0, 4), (0, 2, 3, 4, 2)]
    assert cross.q_width == 5 and cross.kv_width == 6 and not cross.is_self
    np.testing.assert_array_equal(cross.cu_seqlens(kv=True), [0, 4, 6])
    # bottom-right: query i sees keys j <= i + kv_len - q_len
    np.testing.assert_array_equal(cross.allowed()[0, :2, :4].astype(int), [[1, 1, 1, 0], [1, 1, 1, 1]])
    tl = Layout.from_cu_seqlens([0, 2, 5], cu_kv=[0, 4, 6], alignment="top_left")
    np.testing.assert_array_equal(tl.allowed()[0, :2, :4].astype(int), [[1, 0, 0, 0], [1, 1, 0, 0]])
    with pytest.raises(Error) as e:  # q_len != kv_len without an explicit alignment
        Layout.from_cu_seqlens([0, 2, 5], cu_kv=[0, 4, 6])
    assert e.value.status == "MASKPACK_ERR_CONVENTION" and e.value.argument == "alignment"
    # bidirectional attention does not depend on the alignment
    assert Layout.from_cu_seqlens([0, 2, 5], cu_kv=[0, 4, 6], causal=False).n_segments == 2


def test_unstated_alignment_is_the_library_policy():
    # the refusal is the C library's (MASKPACK_ALIGN_UNSTATED), worded for the keyword argument
    segs = [(0, 0, 3, 0, 3), (0, 3, 2, 3, 5)]
    with pytest.raises(Error) as e:
        Layout.from_segments(segs, 1, 5, 8, packed=True)
    assert e.value.message == ("alignment: segment 1 has q_len 2 != kv_len 5; pass alignment='bottom_right' "
                            "(flash-attn >= 2.1, NPU mode 3) or alignment='top_left' (torch SDPA is_causal, "
                            "NPU mode 2) explicitly")
    assert (e.value.status, e.value.argument, e.value.index) == ("MASKPACK_ERR_CONVENTION", "alignment", (1,))
    # the same refusal where the rule becomes causal again later
    bidir = Layout.from_segments(segs, 1, 5, 8, packed=True, causal=False)
    with pytest.raises(Error) as e:
        bidir.with_rule(window=(1, 0))
    assert e.value.argument == "alignment" and e.value.index == (1,)
    assert bidir.with_rule(window=(1, 0), alignment="top_left").rule["alignment"] == "top_left"
    # the extension itself refuses an unstated alignment: every binding gets the policy
    with pytest.raises(Error) as e:
        maskpack._maskpack.from_segments(segs, 1, 5, 8, True, (1, 2, -1, -1, [], None))
    assert e.value.argument == "rule.alignment" and e.value.index == (1,)
    # the rule's own fields are named first
    with pytest.raises(Error) as e:
        Layout.from_segments(segs, 1, 5, 8, packed=True, window=(-3, -1))
    assert e.value.argument == "rule.window"


def test_one_extension_module_layout_handles_checked_by_type():
    # the planner and kernel bindings are parts of the one extension module and take its Layout
    # handle, checked by type: an address (or any other object) is a TypeError, never dereferenced
    from maskpack import _maskpack

    lay = Layout.from_lengths([3, 2], placement="packed")
    assert type(lay._h) is _maskpack.Layout
    q = torch.zeros(5, 1, 8)
    for bad in (12345, lay, None):
        with pytest.raises(TypeError, match="layout: expected a maskpack layout handle"):
            _maskpack.attention.forward(bad, None, None, None, 0.0, 0.0, None, None, 1, 0)
        with pytest.raises(TypeError, match="layout: expected a maskpack layout handle"):
            _maskpack.gdn.l2norm(bad, (None, None), 1e-6)
    assert not hasattr(_maskpack, "ptr") and not hasattr(_maskpack, "adopt")
    # the planner's row layouts are such handles too
    h = maskpack.plan([3, 2], capacity=8)._h
    assert type(_maskpack.plan.row_layout(h, 0, None)) is _maskpack.Layout
    with pytest.raises(TypeError):
        _maskpack.plan.row_layout(lay._h, 0, None)  # a layout where a plan is expected
    # and the kernels run through the handle
    out = maskpack.attention(q, q, q, lay)[0]
    assert out.shape == q.shape


def test_from_position_ids_boundary_rules():
    pos = [0, 1, 2, 5, 6]
    assert Layout.from_position_ids(pos, rule="reset").seqlens.tolist() == [5]
    assert Layout.from_position_ids(pos, rule="step").seqlens.tolist() == [3, 2]
    assert Layout.from_position_ids(pos).seqlens.tolist() == [5]  # default: reset (HF flash path)
    # tail padding written as zeros is padding, not a run of length-1 sequences (bug class 8)
    tail = Layout.from_position_ids(np.array([0, 1, 2, 0, 1, 0, 0, 0]))
    assert tail.seqlens.tolist() == [3, 2] and tail.q_width == 8 and tail.n_tokens == 5
    np.testing.assert_array_equal(tail.mask2d(), [1, 1, 1, 1, 1, 0, 0, 0])
    batch = Layout.from_position_ids(torch.tensor([[0, 1, 2, 3], [0, 1, 0, 1]]))
    assert batch.segments == [(0, 0, 4, 0, 4), (1, 0, 2, 0, 2), (1, 2, 2, 2, 2)]
    assert isinstance(batch.cu_seqlens(), torch.Tensor)
    mrope = np.stack([np.array([[0, 1, 2, 0, 1]]), np.array([[9, 9, 9, 9, 9]]), np.array([[0, 0, 0, 0, 0]])])
    assert Layout.from_position_ids(mrope).seqlens.tolist() == [3, 2]  # the text row decides


def test_from_mask4d_recovers_rules_and_requires_a_convention():
    src = Layout.from_lengths([5, 3], placement="left", window=(2, 0))
    for conv in ("keep", "masked"):
        back = Layout.from_mask4d(src.mask4d(conv), convention=conv)
        np.testing.assert_array_equal(back.allowed(), src.allowed())
        assert back.segments == src.segments
    back = Layout.from_mask4d(torch.from_numpy(src.mask4d("additive", fill="min")), convention="additive")
    assert isinstance(back.mask2d(), torch.Tensor)
    np.testing.assert_array_equal(back.allowed().numpy(), src.allowed())
    # polarity matters: reading a keep mask as masked describes another batch, or none at all
    try:
        wrong = Layout.from_mask4d(src.mask4d("keep"), convention="masked")
    except Error:
        pass
    else:
        assert not np.array_equal(wrong.allowed(), src.allowed())
    with pytest.raises(Error) as e:
        Layout.from_mask4d(np.ones((2, 4, 4), bool), convention="keep")
    assert e.value.status == "MASKPACK_ERR_SHAPE"


def test_from_segments_forms_and_validation():
    a = Layout.from_segments([(0, 1, 3), (1, 0, 2)], 2, 5)
    b = Layout.from_segments([(0, 1, 3, 1, 3), (1, 0, 2, 0, 2)], 2, 5, 5)
    assert a == b and hash(a) == hash(b)
    p = Layout.from_segments([(0, 0, 2), (0, 3, 2)], 1, 6, packed=True)
    assert p.packed and p.mask2d().shape == (6,)
    with pytest.raises(Error) as e:
        Layout.from_segments([(0, 0, 3), (0, 2, 2)], 1, 6)
    assert e.value.status == "MASKPACK_ERR_UNSORTED" and e.value.index == (1,)
    with pytest.raises(Error) as e:
        Layout.from_segments([(0, 0, 3), (2, 0, 2)], 2, 6)
    assert e.value.status == "MASKPACK_ERR_VALUE" and e.value.argument == "segments"
    with pytest.raises(Error) as e:  # cross segment, causal, no alignment: ambiguous
        Layout.from_segments([(0, 0, 2, 0, 4)], 1, 2, 4)
    assert e.value.status == "MASKPACK_ERR_CONVENTION"
    with pytest.raises(Error) as e:
        Layout.from_segments([(0, 0, 3)], 1, 3, spans=[(0, 1, 5)])
    assert e.value.status == "MASKPACK_ERR_RULE" and e.value.argument == "rule.spans"
    with pytest.raises(Error) as e:
        Layout.from_segments([(0, 0, 3)], 1, 3, prefix=[1, 2])
    assert e.value.status == "MASKPACK_ERR_RULE"


def test_rule_keywords_and_with_rule():
    lay = Layout.from_lengths([6], window_hf=3)
    assert lay.rule["window"] == (2, 2)
    assert Layout.from_lengths([6], window_gym=3).rule["window"] == (3, 3)
    r = Layout.from_lengths([6, 4], causal=False, spans=[(0, 1, 3)], prefix=[2, 0], alignment="top_left")
    assert r.rule == {"causal": False, "alignment": "top_left", "window": (-1, -1), "spans": [(0, 1, 3)],
                      "prefix": [2, 0]}
    # with_rule keeps what it is not told to change
    c = r.with_rule(causal=True)
    assert c.rule == dict(r.rule, causal=True)
    assert c.with_rule(spans=None, prefix=None).rule == {"causal": True, "alignment": "top_left",
                                                          "window": (-1, -1), "spans": [], "prefix": None}
    assert c.segments == r.segments
    # the rule dict is usable as keyword arguments again
    assert Layout.from_lengths([6, 4], **r.rule) == r
    assert Layout.from_lengths([2], prefix=np.array([0])).rule["prefix"] is None  # all-zero prefix = none


# ---- numpy in, numpy out; torch in, torch out ------------------------------------------------


OUTPUT_METHODS = [
    ("mask2d", {}), ("position_ids", {}), ("segment_ids", {}), ("valid_indices", {}),
    ("last_token_index", {}), ("cu_seqlens", {}), ("cu_seqlens_padded", {}), ("allowed", {}),
    ("mask4d", {"convention": "masked"}),
]


def test_numpy_in_numpy_out():
    lay = Layout.from_mask2d(np.array([[1, 1, 0], [1, 1, 1]], dtype=np.uint8))
    for name, kw in OUTPUT_METHODS:
        assert isinstance(getattr(lay, name)(**kw), np.ndarray), name
    assert isinstance(lay.seqlens, np.ndarray)
    assert all(isinstance(v, np.ndarray) for k, v in lay.block_mask(2, 2).items() if k.endswith(("blocks", "indices")))
    assert all(isinstance(v, np.ndarray) for v in lay.magi_slices())
    # bf16 always comes back as torch (numpy has no bfloat16)
    assert lay.mask4d("additive", dtype="bfloat16").dtype == torch.bfloat16


def test_torch_in_torch_out_from_non_contiguous_views_without_copies(monkeypatch):
    base = torch.zeros(3, 12, dtype=torch.bool)
    base[0, 0:6] = True
    base[1, 2:8] = True
    base[2, 4:12] = True
    view = base[:, ::2]  # [3, 6], strides (12, 2): not contiguous
    assert not view.is_contiguous()
    want = Layout.from_mask2d(view.contiguous().numpy())

    def no_copy(*a, **k):
        raise AssertionError("the input was copied")

    monkeypatch.setattr(torch.Tensor, "contiguous", no_copy)
    monkeypatch.setattr(torch.Tensor, "clone", no_copy)
    monkeypatch.setattr(torch.Tensor, "numpy", no_copy)
    monkeypatch.setattr(np, "ascontiguousarray", no_copy)
    lay = Layout.from_mask2d(view)
    monkeypatch.undo()
    assert lay.segments == want.segments == [(0, 0, 3, 0, 3), (1, 1, 3, 1, 3), (2, 2, 4, 2, 4)]
    for name, kw in OUTPUT_METHODS:
        out = getattr(lay, name)(**kw)
        assert isinstance(out, torch.Tensor), name
        np.testing.assert_array_equal(out.numpy(), getattr(want, name)(**kw))
    assert isinstance(lay.seqlens, torch.Tensor) and lay.seqlens.dtype == torch.int32
    assert lay.position_ids().dtype == torch.int64
    assert lay.mask4d("keep").dtype == torch.bool
    assert lay.mask4d("additive").dtype == torch.float32
    q, k, t = lay.magi_slices()
    assert isinstance(q, torch.Tensor) and q.dtype == torch.int32
    bm = lay.block_mask(2, 2)
    assert isinstance(bm["kv_indices"], torch.Tensor) and bm["kv_indices"].dtype == torch.int32
    # a transposed (column-major) view and a negative-stride numpy view
    t_view = base.t().contiguous().t()  # same values, strides (1, 3)
    assert Layout.from_mask2d(t_view).segments == Layout.from_mask2d(base.numpy()).segments
    rev = base.numpy()[:, ::-1]
    assert Layout.from_mask2d(rev).segments == Layout.from_mask2d(rev.copy()).segments


def test_readonly_numpy_and_other_input_kinds():
    m = np.array([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=np.int32)
    m.setflags(write=False)
    want = Layout.from_mask2d(m)
    assert Layout.from_mask2d(memoryview(np.ascontiguousarray(m))) == want  # buffer protocol

    class DLPackOnly:  # only the DLPack protocol, like a JAX or CuPy-on-host array
        def __init__(self, t):
            self._t = t

        def __dlpack__(self, **kw):
            return self._t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._t.__dlpack_device__()

    assert Layout.from_mask2d(DLPackOnly(torch.from_numpy(m.copy()))) == want
    assert Layout.from_mask2d([[1, 1, 0, 0], [1, 1, 1, 0]]) == want
    assert Layout.from_mask2d([[True, True, False, False], [True, True, True, False]]) == want
    big = m.astype(">i4")  # non-native byte order is refused rather than misread
    with pytest.raises(TypeError):
        Layout.from_mask2d(big)


def test_dtype_options_accept_names_numpy_and_torch_dtypes():
    lay = Layout.from_lengths([3, 2], placement="packed")
    assert lay.cu_seqlens(dtype="int64").dtype == np.int64
    assert lay.cu_seqlens(dtype=np.int64).dtype == np.int64
    assert lay.cu_seqlens(dtype=torch.int64).dtype == np.int64
    assert lay.position_ids(dtype="int32").dtype == np.int32
    assert lay.mask2d(dtype="float32").dtype == np.float32
    assert lay.mask2d(dtype=bool).dtype == np.bool_
    with pytest.raises(Error) as e:
        lay.mask2d(dtype="int4")
    assert e.value.status == "MASKPACK_ERR_DTYPE"


# ---- outputs ------------------------------------------------------------------------------


def test_mask4d_conventions_defaults_fill_and_heads():
    lay = Layout.from_lengths([2, 3], placement="left")
    keep = lay.mask4d("keep")
    assert keep.dtype == np.bool_ and keep.shape == (2, 1, 3, 3)
    np.testing.assert_array_equal(keep[0, 0].astype(int), [[0, 0, 0], [0, 1, 0], [0, 1, 1]])
    np.testing.assert_array_equal(lay.mask4d("masked"), ~keep)
    add = lay.mask4d("additive")
    assert add.dtype == np.float32
    assert np.isneginf(add[0, 0, 0]).all() and add[0, 0, 2, 1] == 0
    mn = lay.mask4d("additive", fill="min", dtype="float16")
    assert mn[0, 0, 0, 0] == np.finfo(np.float16).min
    assert lay.mask4d("additive", fill=float("-inf"))[0, 0, 0, 0] == -np.inf
    assert lay.mask4d("keep", heads=3).shape == (2, 3, 3, 3)
    bf = lay.mask4d("additive", dtype=torch.bfloat16, fill="min")
    assert bf.dtype == torch.bfloat16 and bf[0, 0, 0, 0].item() == torch.finfo(torch.bfloat16).min
    with pytest.raises(Error) as e:
        lay.mask4d("keep", fill="max")
    assert e.value.argument == "fill"


def test_per_token_outputs_small_example():
    lay = Layout.from_segments([(0, 0, 2), (0, 3, 3), (1, 1, 2)], 2, 6)
    np.testing.assert_array_equal(lay.mask2d().astype(int), [[1, 1, 0, 1, 1, 1], [0, 1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(lay.position_ids(), [[0, 1, 0, 0, 1, 2], [0, 0, 1, 0, 0, 0]])
    np.testing.assert_array_equal(lay.segment_ids(), [[1, 1, 0, 2, 2, 2], [0, 3, 3, 0, 0, 0]])
    np.testing.assert_array_equal(lay.valid_indices(), [0, 1, 3, 4, 5, 7, 8])
    np.testing.assert_array_equal(lay.last_token_index(), [1, 5, 8])
    np.testing.assert_array_equal(lay.cu_seqlens(), [0, 2, 5, 7])
    np.testing.assert_array_equal(lay.cu_seqlens(form="npu"), [2, 5, 7])
    np.testing.assert_array_equal(lay.cu_seqlens_padded(), [0, 3, 6, 12])
    assert lay.max_seqlen == 3 and lay.n_tokens == 7 and lay.n_segments == 3
    assert lay.segment_of_query(0, 4) == 1 and lay.segment_of_query(0, 2) == -1
    assert lay.allowed_at(0, 4, 3) and not lay.allowed_at(0, 3, 4) and not lay.allowed_at(0, 3, 1)
    assert not lay.allowed_at(5, 0, 0)  # out of grid


def test_block_mask_shapes_and_zero_initialised_tail():
    lay = Layout.from_lengths([6, 2], placement="packed")
    bm = lay.block_mask(block_q=4, block_k=4)
    assert bm["kv_num_blocks"].shape == (1, 1, 2)
    assert bm["kv_indices"].shape == (1, 1, 2, 2)
    # q block 0 (rows 0-3) x kv block 0: causal triangle -> partial; q block 1 (rows 4-7):
    # kv block 0 is full for rows 4,5 only -> partial, kv block 1 partial
    assert bm["kv_num_blocks"].tolist() == [[[1, 2]]]
    assert bm["kv_indices"].tolist() == [[[[0, 0], [0, 1]]]]
    assert bm["full_kv_num_blocks"].tolist() == [[[0, 0]]]
    assert bm["q_num_blocks"].tolist() == [[[2, 1]]]
    with pytest.raises(Error) as e:
        lay.block_mask(0, 4)
    assert e.value.argument == "block_q"


def test_flex_block_mask_matches_torch_create_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    lay = Layout.from_lengths([40, 0, 70, 18], placement="packed", window=(30, -1))
    allowed = torch.from_numpy(lay.allowed())

    def mask_mod(b, h, q, kv):
        return allowed[b, q, kv]

    ref = create_block_mask(mask_mod, 1, 1, lay.q_width, lay.kv_width, device="cpu", BLOCK_SIZE=16)
    ours = lay.flex_block_mask(16, 16)
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        assert torch.equal(getattr(ours, name), getattr(ref, name)), name
    for name, count in (("kv_indices", "kv_num_blocks"), ("full_kv_indices", "full_kv_num_blocks"),
                        ("q_indices", "q_num_blocks"), ("full_q_indices", "full_q_num_blocks")):
        n = getattr(ref, count)
        a, b = getattr(ours, name), getattr(ref, name)
        for i in range(n.shape[-1]):
            c = int(n[0, 0, i])
            assert sorted(a[0, 0, i, :c].tolist()) == sorted(b[0, 0, i, :c].tolist()), (name, i)


def test_magi_slices_example_and_window_refusal():
    lay = Layout.from_lengths([3, 2], placement="packed", causal=True)
    q, k, t = lay.magi_slices()
    assert q.tolist() == [[0, 3], [3, 5]] and k.tolist() == [[0, 3], [3, 5]] and t.tolist() == [1, 1]
    full = lay.with_rule(causal=False).magi_slices()
    assert full[2].tolist() == [0, 0]
    with pytest.raises(Error) as e:
        lay.with_rule(window=(2, 0)).magi_slices()
    assert e.value.status == "MASKPACK_ERR_NOT_REPRESENTABLE"


# ---- npu ----------------------------------------------------------------------------------


def _call_kwargs(args):
    return {k: v for k, v in args.items() if not k.startswith("maskpack_")}


def test_npu_args_tnd_causal_and_validation_round_trip():
    lay = Layout.from_lengths([3, 5, 0, 4], placement="packed")
    args = lay.npu_args("TND", head_dim=64)
    assert args["input_layout"] == "TND"
    assert args["sparse_mode"] == 3  # rightDownCausal
    assert args["actual_seq_qlen"] == [3, 8, 8, 12] and args["actual_seq_kvlen"] == [3, 8, 8, 12]
    assert args["scale"] == pytest.approx(0.125)
    m = args["atten_mask"]
    assert m.shape == (2048, 2048) and m.dtype == np.bool_
    np.testing.assert_array_equal(m[:6, :6], np.triu(np.ones((6, 6), bool), 1))
    assert "pre_tockens" in args and "next_tockens" in args  # torch_npu's own spelling
    assert args["maskpack_mask_kind"] == "compressed" and args["maskpack_fully_masked_rows"] == 0
    assert args["maskpack_fully_masked_pad_rows"] == 0
    kw = _call_kwargs(args)
    assert maskpack.validate_npu_args(**kw, query_shape=(12, 8, 64), key_shape=(12, 2, 64), intended=lay) == []
    # each classic mistake is reported
    codes = lambda **over: {f["code"] for f in maskpack.validate_npu_args(
        **dict(kw, **over), query_shape=(12, 8, 64), key_shape=(12, 2, 64), intended=lay)}
    assert "MASKPACK_NPU_CAUSAL_WITHOUT_MASK" in codes(atten_mask=None)
    assert "MASKPACK_NPU_LEADING_ZERO" in codes(actual_seq_qlen=[0, 3, 8, 8, 12], actual_seq_kvlen=[0, 3, 8, 8, 12])
    assert "MASKPACK_NPU_SCALE_DEFAULT" in codes(scale=None)
    assert "MASKPACK_NPU_BAD_MASK_DTYPE" in codes(atten_mask=m.astype(np.float32))
    # q_len == kv_len everywhere: leftUp (2) and rightDown (3) causal agree, so mode 2 is also right
    assert codes(sparse_mode=2) == set()
    # ... but a causal call does not compute a bidirectional layout
    mismatch = maskpack.validate_npu_args(**kw, query_shape=(12, 8, 64), intended=lay.with_rule(causal=False))
    assert [f["code"] for f in mismatch] == ["MASKPACK_NPU_MASK_MISMATCH"]
    assert "(b 0, head 0, i 0, j 1)" in mismatch[0]["message"]
    with pytest.raises(Error) as e:
        maskpack.validate_npu_args(**dict(kw, atten_mask=None), query_shape=(12, 8, 64), raise_on_error=True)
    assert e.value.status == "MASKPACK_ERR_NPU_CONTRACT"
    assert "CAUSAL_WITHOUT_MASK" in e.value.message
    assert any(f["code"] == "MASKPACK_NPU_CAUSAL_WITHOUT_MASK" for f in e.value.findings)
    # MindSpeed's spelling of the window arguments is accepted as well
    ms = dict(kw)
    ms["pre_tokens"] = ms.pop("pre_tockens")
    ms["next_tokens"] = ms.pop("next_tockens")
    assert maskpack.validate_npu_args(**ms, query_shape=(12, 8, 64), key_shape=(12, 2, 64)) == []


def test_npu_args_padded_bsnd_full_mask_matches_mask4d():
    lay = Layout.from_lengths([3, 5], placement="right", capacity=6)
    args = lay.npu_args("BSND", scale=0.5)
    assert args["scale"] == 0.5
    assert args["actual_seq_qlen"] is None and args["actual_seq_kvlen"] is None
    # padded rows of unequal lengths: the full [B,1,S,S] masked-convention mask, pad rows seeing nothing
    assert args["maskpack_mask_kind"] == "full"
    np.testing.assert_array_equal(args["atten_mask"], lay.mask4d("masked"))
    assert args["inner_precise"] == 2
    q = torch.empty(2, 6, 4, 32)
    assert maskpack.validate_npu_args(**_call_kwargs(args), query=q, key=q, intended=lay) == []
    bad = maskpack.validate_npu_args(**dict(_call_kwargs(args), atten_mask=lay.mask2d()), query=q, key=q)
    assert "MASKPACK_NPU_BAD_MASK_SHAPE" in {f["code"] for f in bad}  # a [B,S] mask: error 561103
    with pytest.raises(Error) as e:
        lay.npu_args("TND", scale=1.0)
    assert e.value.status == "MASKPACK_ERR_SHAPE"
    with pytest.raises(Error) as e:
        lay.npu_args("BSND")  # neither scale nor head_dim: the operator's 1.0 default is a bug
    assert e.value.argument == "scale"
    torch_args = Layout.from_lengths(torch.tensor([3, 5]), capacity=6).npu_args("BSND", scale=0.5)
    assert isinstance(torch_args["atten_mask"], torch.Tensor)  # torch in, torch out
    assert torch.equal(torch_args["atten_mask"], torch.from_numpy(lay.mask4d("masked")))


def test_validate_npu_args_shapes_for_each_layout():
    lay = Layout.from_lengths([4, 4], placement="right")
    args = _call_kwargs(lay.npu_args("BSH", head_dim=16))
    assert maskpack.validate_npu_args(**args, query_shape=(2, 4, 64), key_shape=(2, 4, 32), head_num=4,
                                      intended=lay) == []
    sbh = _call_kwargs(lay.npu_args("SBH", head_dim=16))
    assert maskpack.validate_npu_args(**sbh, query_shape=(4, 2, 64), head_num=4, intended=lay) == []
    bnsd = _call_kwargs(lay.npu_args("BNSD", head_dim=16))
    assert maskpack.validate_npu_args(**bnsd, query_shape=(2, 4, 4, 16), intended=lay) == []
    heads = maskpack.validate_npu_args(**bnsd, query_shape=(2, 4, 4, 16), key_shape=(2, 3, 4, 16))
    assert "MASKPACK_NPU_BAD_HEADS" in {f["code"] for f in heads}  # 4 % 3 != 0
    with pytest.raises(Error) as e:
        maskpack.validate_npu_args(**bnsd, query_shape=(2, 4, 16))
    assert e.value.status == "MASKPACK_ERR_SHAPE"
    unknown = maskpack.validate_npu_args(input_layout="NSD", scale=1.0)
    assert "MASKPACK_NPU_BAD_LAYOUT" in {f["code"] for f in unknown}


# ---- object protocol ------------------------------------------------------------------------


def test_repr_eq_hash_pickle_and_output_preference():
    lay = Layout.from_lengths([3, 1, 2], placement="packed", window=(2, 0), spans=[(0, 0, 2)])
    text = repr(lay)
    assert "packed T=6" in text and "3 segments" in text and "window=(2, 0)" in text and "1 spans" in text
    assert lay == Layout.from_lengths([3, 1, 2], placement="packed", window=(2, 0), spans=[(0, 0, 2)])
    assert lay != lay.with_rule(window=(-1, -1))
    assert len({lay, lay.with_rule(window=(2, 0))}) == 1
    back = pickle.loads(pickle.dumps(lay))
    assert back == lay and back.segments == lay.segments
    t = lay.with_outputs("torch")
    assert t == lay and isinstance(t.mask2d(), torch.Tensor) and isinstance(lay.mask2d(), np.ndarray)
    assert isinstance(pickle.loads(pickle.dumps(t)).mask2d(), torch.Tensor)
    assert lay != "layout"


def test_mask2d_from_mask4d():
    lay = Layout.from_lengths([2, 4], placement="right")
    want = lay.mask2d()
    np.testing.assert_array_equal(maskpack.mask2d_from_mask4d(lay.mask4d("masked"), "masked"), want)
    # ms-swift style: pad query rows still see the valid keys -> the column rule still finds the tokens
    keep = lay.mask4d("keep")
    keep[0, 0, 2:, :2] = True
    np.testing.assert_array_equal(maskpack.mask2d_from_mask4d(keep, "keep"), want)
    out = maskpack.mask2d_from_mask4d(torch.from_numpy(lay.mask4d("keep")), "keep", dtype="int64")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.int64
    with pytest.raises(Error):
        maskpack.mask2d_from_mask4d(np.ones(3, bool), "keep")


def test_long_calls_release_the_gil():
    # A progress check, not a timing one: with a switch interval far longer than the test the
    # interpreter never takes the GIL from a running thread on its own, so the main thread can only
    # run while the worker is inside the C call of mask4d if that call releases the GIL. A profile
    # hook on the worker reads the main thread's counter as the call enters and as it returns; the
    # worker repeats the call (up to 50 times) until one saw the counter move. A call that held the
    # GIL would see it still in every call, however loaded the machine.
    lay = Layout.from_lengths([4000, 4000], placement="packed")
    progress = [0]
    moved = []
    result = {}
    at_call = threading.Event()

    def hook(frame, event, arg):
        if event in ("c_call", "c_return") and getattr(arg, "__name__", None) == "mask4d" and \
                type(arg).__name__ == "builtin_function_or_method":
            if event == "c_call":
                result["enter"] = progress[0]
                at_call.set()
            else:
                moved.append(progress[0] != result["enter"])

    def work():
        sys.setprofile(hook)
        try:
            for _ in range(50):
                result["m"] = lay.mask4d("keep")
                if moved[-1]:
                    break
        finally:
            sys.setprofile(None)

    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        th = threading.Thread(target=work)
        th.start()
        # returns with the GIL: only while the worker's call has let it go (or after the worker is
        # done); the timeout only guards against a hook that never fires
        reached = at_call.wait(timeout=120)
        progress[0] += 1
        th.join()
    finally:
        sys.setswitchinterval(old)
    m = result["m"]
    assert m.shape == (1, 1, 8000, 8000)
    assert m[0, 0, 7999, 4000] and not m[0, 0, 3999, 4000]
    assert reached, "the profile hook never saw the C call mask4d"
    assert moved and moved[-1], "the main thread never ran during a mask4d call (%d calls)" % len(moved)


# ---- robustness: arbitrary arrays never crash the process -----------------------------------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

_ANY_DTYPE = st.sampled_from([np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32,
                              np.float64, np.uint16, np.complex64])


@given(hnp.arrays(np.int8, hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=5),
                  elements=st.integers(-3, 3)),
       _ANY_DTYPE, st.sampled_from(["view", "plain", "torch"]))
def test_arbitrary_arrays_give_a_layout_or_a_clean_error(values, dtype, how):
    arr = values.astype(dtype)
    if how == "view" and arr.ndim:
        arr = arr[..., ::-1]
    if how == "torch" and arr.dtype not in (np.uint16, np.complex64):
        arr = torch.from_numpy(np.ascontiguousarray(arr))
    calls = [
        lambda: Layout.from_mask2d(arr, convention="keep"),
        lambda: Layout.from_mask2d(arr, convention="doc_id", window=(1, 0)),
        lambda: Layout.from_mask4d(arr, convention="masked"),
        lambda: Layout.from_mask4d(arr, convention="additive"),
        lambda: Layout.from_position_ids(arr, rule="step"),
        lambda: Layout.from_cu_seqlens(arr, form="npu"),
        lambda: Layout.from_cu_seqlens(arr, cu_padded=arr),
        lambda: maskpack.mask2d_from_mask4d(arr, "keep"),
        lambda: maskpack.validate_npu_args(input_layout="TND", atten_mask=arr, actual_seq_qlen=arr,
                                           actual_seq_kvlen=arr, prefix=arr, sparse_mode=3, scale=1.0),
    ]
    for call in calls:
        try:
            out = call()
        except (Error, TypeError):
            continue
        if isinstance(out, Layout):  # whatever came back is a usable layout
            assert out.n_tokens == int(np.asarray(out.mask2d()).sum())
            out.mask4d("keep")


def test_npu_args_goldens_from_the_operator_documentation():
    """npu_fusion_attention's documented conventions (torch_npu API reference, ptaoplist_000850 of
    hiascend.com; the sparse-mode introduction of Ascend ops-transformer), written here by hand for TND
    and BSND in sparse modes 0-4 and 6, independently of the library's builder and validator:
    actual_seq_qlen/kvlen are cumulative ends without a leading 0 (lengths 2 2 2 2 2 -> 2 4 6 8 10);
    mode 0 with no mask ignores pre/next; mode 1 takes the whole mask (True = masked); modes 2
    (leftUpCausal) and 3 (rightDownCausal) take the 2048 x 2048 compressed mask, lower triangle 0 and
    upper triangle 1; mode 4 (band) keeps pre_tockens keys before and next_tockens after the diagonal;
    mode 6 (prefix, compressed) takes a 3072 x 2048 mask and one prefix N per sequence."""
    big = 2147483647
    tri = np.triu(np.ones((2048, 2048), bool), k=1)

    def args(lay, fmt):
        return lay.npu_args(fmt, scale=0.125)

    # TND, mode 0: the documentation's own length example, no mask
    a = args(Layout.from_lengths([2] * 5, placement="packed", causal=False), "TND")
    assert (a["sparse_mode"], a["atten_mask"]) == (0, None)
    assert list(a["actual_seq_qlen"]) == [2, 4, 6, 8, 10] and list(a["actual_seq_kvlen"]) == [2, 4, 6, 8, 10]
    # TND, modes 2 and 3: causal cross attention, queries [2, 3], keys [4, 5]
    for align, mode in (("top_left", 2), ("bottom_right", 3)):
        a = args(Layout.from_cu_seqlens([0, 2, 5], cu_kv=[0, 4, 9], alignment=align), "TND")
        assert a["sparse_mode"] == mode
        assert list(a["actual_seq_qlen"]) == [2, 5] and list(a["actual_seq_kvlen"]) == [4, 9]
        np.testing.assert_array_equal(np.asarray(a["atten_mask"]), tri)
    # TND, mode 4: a causal window of 2 keys back, and a two-sided one (2 back, 1 ahead)
    for kw, pre, nxt in (({"window": (2, 0)}, 2, 0), ({"window": (2, 1), "causal": False}, 2, 1)):
        a = args(Layout.from_lengths([3, 5], placement="packed", **kw), "TND")
        assert (a["sparse_mode"], a["pre_tockens"], a["next_tockens"]) == (4, pre, nxt)
        assert list(a["actual_seq_qlen"]) == [3, 8] and np.asarray(a["atten_mask"]).shape == (2048, 2048)
    # TND, mode 6: prefix-LM, one N per sequence
    a = args(Layout.from_lengths([3, 5], placement="packed", prefix=[1, 2]), "TND")
    assert a["sparse_mode"] == 6 and list(a["prefix"]) == [1, 2]
    assert np.asarray(a["atten_mask"]).shape == (3072, 2048) and list(a["actual_seq_qlen"]) == [3, 8]

    # BSND, mode 0: equal rows, bidirectional: no mask, no lists
    a = args(Layout.from_lengths([4, 4], placement="right", causal=False), "BSND")
    assert (a["sparse_mode"], a["atten_mask"], a["actual_seq_qlen"]) == (0, None, None)
    # BSND, mode 1: rows of unequal lengths need the whole [B,1,S,S] mask: True = masked
    a = args(Layout.from_lengths([3, 5], placement="right"), "BSND")
    want = np.ones((2, 1, 5, 5), bool)
    for b, n in enumerate([3, 5]):
        want[b, 0, :n, :n] = np.triu(np.ones((n, n), bool), k=1)
    assert (a["sparse_mode"], a["pre_tockens"], a["next_tockens"]) == (1, big, big)
    np.testing.assert_array_equal(np.asarray(a["atten_mask"]), want)
    # BSND, mode 3 (causal equal rows; q_len == kv_len, so rightDownCausal is leftUpCausal) + compressed mask
    a = args(Layout.from_lengths([4, 4], placement="right"), "BSND")
    assert a["sparse_mode"] in (2, 3)
    np.testing.assert_array_equal(np.asarray(a["atten_mask"]), tri)
    # BSND, mode 4 and mode 6
    a = args(Layout.from_lengths([4, 4], placement="right", window=(1, 0)), "BSND")
    assert (a["sparse_mode"], a["pre_tockens"], a["next_tockens"]) == (4, 1, 0)
    a = args(Layout.from_lengths([4, 4], placement="right", prefix=[1, 2]), "BSND")
    assert a["sparse_mode"] == 6 and list(a["prefix"]) == [1, 2] and np.asarray(a["atten_mask"]).shape == (3072, 2048)


def test_npu_args_count_the_padding_rows_a_full_mask_hides():
    # a padded batch: no real row sees nothing, but each pad slot does, and the operator needs
    # inner_precise 2 for them; the two counts are reported apart
    mask = np.array([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], dtype=np.int8)
    lay = Layout.from_mask2d(mask, convention="keep")
    args = lay.npu_args("BSND", head_dim=64)
    assert args["sparse_mode"] == 1 and args["inner_precise"] == 2
    assert args["maskpack_fully_masked_rows"] == 0 and args["maskpack_fully_masked_pad_rows"] == 3
    rows_seeing_nothing = (~args["atten_mask"][:, 0]).sum(axis=-1) == 0
    assert int(rows_seeing_nothing.sum()) == 3  # the mask itself agrees
    # the same sequences packed (TND): no pad rows at all
    packed = Layout.from_lengths([3, 4], placement="packed").npu_args("TND", head_dim=64)
    assert packed["maskpack_fully_masked_pad_rows"] == 0 and packed["inner_precise"] == 0


def test_numpy_bfloat16_arrays_cross_as_torch_views():
    """numpy has no bfloat16; ml_dtypes' arrays have no buffer format, so they reach the extension as a
    torch view of the same memory, read and written in place."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    lay = maskpack.Layout.from_lengths([3, 1], placement="right")
    x = (np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4) / 8).astype(ml_dtypes.bfloat16)[:, ::1]
    packed = lay.pack(x)
    want = lay.pack(torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16))
    assert torch.equal(torch.as_tensor(np.asarray(packed, dtype=np.float32)), want.float())
    out = np.zeros((4, 4), dtype=ml_dtypes.bfloat16)
    assert lay.pack(x, out=out) is out
    np.testing.assert_array_equal(out.astype(np.float32), want.float().numpy())


# ---- status_message -----------------------------------------------------------------------------------

def test_status_message_for_every_status():
    names = maskpack._maskpack.status_names()
    msgs = [maskpack._maskpack.status_message(code) for code in range(len(names))]
    assert all(isinstance(m, str) and m for m in msgs)
    assert len(set(msgs)) == len(msgs), "one description per status"
    assert "success" in msgs[0].lower() or "ok" in msgs[0].lower()
    unknown = maskpack._maskpack.status_message(10_000)
    assert isinstance(unknown, str) and unknown not in msgs[1:]
    with pytest.raises(TypeError):
        maskpack._maskpack.status_message("MASKPACK_OK")


# ---- int32 output buffers -----------------------------------------------------------------------------

def _desc(a):
    """What the extension reads for a buffer argument: the numpy array itself."""
    return a


def _block_mask_buffers(lay, bq, bk):
    qb, kb = maskpack._maskpack.block_mask_dims(lay._h, bq, bk)
    b = lay.n_rows
    sizes = [b * qb, b * qb * kb, b * qb, b * qb * kb, b * kb, b * kb * qb, b * kb, b * kb * qb]
    return [np.zeros(n, dtype=np.int32) for n in sizes]


def test_block_mask_buffer_checks():
    lay = maskpack.Layout.from_lengths([5, 3], placement="right")
    bufs = _block_mask_buffers(lay, 4, 4)
    maskpack._maskpack.block_mask(lay._h, 4, 4, tuple(_desc(a) for a in bufs))
    want = lay.block_mask(4, 4)
    np.testing.assert_array_equal(bufs[0], np.asarray(want["kv_num_blocks"]).ravel())
    # int64 where int32 is needed
    bad = list(bufs)
    bad[2] = np.zeros(bufs[2].size, dtype=np.int64)
    with pytest.raises(TypeError, match="full_kv_num_blocks: expected an int32 buffer"):
        maskpack._maskpack.block_mask(lay._h, 4, 4, tuple(_desc(a) for a in bad))
    # one element short
    bad = list(bufs)
    bad[1] = np.zeros(bufs[1].size - 1, dtype=np.int32)
    with pytest.raises(ValueError, match="kv_indices: expected %d elements, found %d" % (bufs[1].size, bufs[1].size - 1)):
        maskpack._maskpack.block_mask(lay._h, 4, 4, tuple(_desc(a) for a in bad))
    # every other element of a buffer twice as long: the right count, not contiguous
    bad = list(bufs)
    bad[5] = np.zeros(bufs[5].size * 2, dtype=np.int32)[::2]
    with pytest.raises(ValueError, match="q_indices: expected a C-contiguous buffer"):
        maskpack._maskpack.block_mask(lay._h, 4, 4, tuple(_desc(a) for a in bad))
    with pytest.raises(TypeError, match="expected 8 output arrays"):
        maskpack._maskpack.block_mask(lay._h, 4, 4, tuple(_desc(a) for a in bufs[:7]))


def test_magi_slices_buffer_checks():
    lay = maskpack.Layout.from_lengths([5, 3], placement="packed")
    n = maskpack._maskpack.magi_slices(lay._h, None, None, None, 0)
    assert n == 2
    q, k, t = np.zeros(2 * n, np.int32), np.zeros(2 * n, np.int32), np.zeros(n, np.int32)
    assert maskpack._maskpack.magi_slices(lay._h, _desc(q), _desc(k), _desc(t), n) == n
    np.testing.assert_array_equal(q, [0, 5, 5, 8])
    with pytest.raises(TypeError, match="all three buffers are needed"):
        maskpack._maskpack.magi_slices(lay._h, _desc(q), None, _desc(t), n)
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        maskpack._maskpack.magi_slices(lay._h, None, None, None, -1)
    with pytest.raises(TypeError, match="types: expected an int32 buffer"):
        maskpack._maskpack.magi_slices(lay._h, _desc(q), _desc(k), _desc(np.zeros(n, np.int64)), n)
    with pytest.raises(ValueError, match="k_ranges: expected 4 elements, found 2"):
        maskpack._maskpack.magi_slices(lay._h, _desc(q), _desc(np.zeros(2, np.int32)), _desc(t), n)
