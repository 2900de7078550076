

# ---- errors that name the problem ---------------------------------------------------------------------

def _error(fn, status, argument, *fragments):
    with pytest.raises(Error) as ei:
        fn()
    e = ei.value
    assert e.status == status, e
    assert e.argument == argument, e
    for f in fragments:
        assert f in str(e), (f, str(e))
    return e


def test_integers_past_int64_are_errors_naming_the_argument():
    # were OverflowError "int too big to convert"
    e = _error(lambda: Layout.from_lengths([3, 2 ** 63]), "MASKPACK_ERR_OVERFLOW", "lengths", "lengths[1]",
               str(2 ** 63))
    assert e.index == (1,)
    _error(lambda: Layout.from_lengths(np.array([2 ** 63], np.uint64)), "MASKPACK_ERR_OVERFLOW", "lengths")
    _error(lambda: Layout.from_cu_seqlens([0, 2 ** 63]), "MASKPACK_ERR_OVERFLOW", "cu_seqlens")
    _error(lambda: Layout.from_lengths([3], placement="packed", capacity=2 ** 64), "MASKPACK_ERR_OVERFLOW",
           "capacity")


def _gdn_inputs(T=5, H=1, K=4, V=4):
    torch.manual_seed(0)
    return (torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, H, V), -torch.rand(T, H), torch.rand(T, H))


def test_gated_delta_rule_argument_errors():
    L = Layout.from_lengths([3, 2], placement="packed")
    q, k, v, g, beta = _gdn_inputs()
    # K = 0: was ZeroDivisionError
    _error(lambda: maskpack.gated_delta_rule(q[..., :0], k[..., :0], v, g, beta, L), "MASKPACK_ERR_SHAPE", "q",
           "K >= 1")
    # numpy inputs: was AttributeError "no attribute 'dim'"
    with pytest.raises(TypeError, match="q: expected a torch.Tensor, found numpy.ndarray"):
        maskpack.gated_delta_rule(q.numpy(), k, v, g, beta, L)
    with pytest.raises(TypeError, match="beta: expected a torch.Tensor"):
        maskpack.gated_delta_rule(q, k, v, g, beta.numpy(), L)
    # layout=None: was AttributeError about n_segments
    with pytest.raises(TypeError, match="layout: expected a maskpack.Layout, found NoneType"):
        maskpack.gated_delta_rule(q, k, v, g, beta, None)
    # threads 0 / -1 / 257 refused as attention and relayout do (were clamped silently)
    for bad in (0, -1, 257):
        _error(lambda: maskpack.gated_delta_rule(q, k, v, g, beta, L, threads=bad), "MASKPACK_ERR_INVALID_ARGUMENT",
               "threads", f"found {bad}")
    with pytest.raises(TypeError, match="threads: expected an int"):
        maskpack.gated_delta_rule(q, k, v, g, beta, L, threads=1.5)
    o, _ = maskpack.gated_delta_rule(q, k, v, g, beta, L, threads=np.int64(2))
    assert torch.equal(o, maskpack.gated_delta_rule(q, k, v, g, beta, L, threads=1)[0])


def test_causal_conv1d_width_zero_is_a_shape_error():
    L = Layout.from_lengths([3, 2], placement="packed")
    x = torch.randn(5, 8)
    # was torch's RuntimeError about a negative dimension
    _error(lambda: maskpack.causal_conv1d(x, torch.randn(8, 0), L), "MASKPACK_ERR_SHAPE", "weight", "W >= 1")
    _error(lambda: maskpack.causal_conv1d(x, torch.randn(8, 1, 0), L), "MASKPACK_ERR_SHAPE", "weight")
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        maskpack.causal_conv1d(x.numpy(), torch.randn(8, 4), L)


def test_unpack_pad_value_must_fit_the_output():
    L = Layout.from_lengths([3, 5], placement="right", capacity=5)
    packed32 = torch.arange(8, dtype=torch.int32).reshape(8, 1)
    # 1.5 into int32 silently wrote 1
    _error(lambda: L.unpack(packed32, pad_value=1.5), "MASKPACK_ERR_VALUE", "pad_value", "1.5", "int32")
    assert L.unpack(packed32, pad_value=-1.0)[0, 4, 0].item() == -1  # an integral float is fine
    packed8 = torch.arange(8, dtype=torch.int8).reshape(8, 1)
    # 1000 into int8 was OverflowError
    _error(lambda: L.unpack(packed8, pad_value=1000), "MASKPACK_ERR_OVERFLOW", "pad_value", "[-128, 127]", "1000")
    assert L.unpack(packed8, pad_value=-128)[0, 3, 0].item() == -128
    # a string was ValueError from numpy
    with pytest.raises(TypeError, match="pad_value: expected a number, found str"):
        L.unpack(packed32, pad_value="x")
    _error(lambda: L.unpack(torch.zeros(8, 1, dtype=torch.float16), pad_value=1e6), "MASKPACK_ERR_OVERFLOW",
           "pad_value", "float16")
    assert L.unpack(torch.zeros(8, 1), pad_value=float("-inf"))[0, 4, 0].item() == float("-inf")


def test_relayout_shape_error_shows_every_dimension():
    L = Layout.from_lengths([3, 4], placement="right", capacity=4)
    x = np.zeros((3, 5, 7), np.float32)  # the grid is [2, 4]
    e = _error(lambda: L.pack(x), "MASKPACK_ERR_SHAPE", "x[0]")
    assert "[3, 5, 7]" in str(e), str(e)


def test_npy_element_count_overflow_keeps_the_shape(tmp_path):
    h = "{'descr': '<i8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 0), }"
    h += " " * (-(10 + len(h) + 1) % 64) + "\n"
    f = tmp_path / "over.npy"
    f.write_bytes(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode())
    exe = os.environ.get("MASKPACK_CLI")
    if exe is None:
        pytest.skip("MASKPACK_CLI (the built maskpack binary) not set")
