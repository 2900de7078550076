"""Moves inside a training step: autograd through every move (gradcheck and gradgradcheck in float64,
both engines), the torch engine equal to the C engine bit for bit, meta tensors, a verl-style flow
whose weight gradients equal the dense padded reference, and the bad inputs of a move.

The expected gradients are built here from the definition, not from the library: a move copies the
source token (sequence k, position p) to the destination token (k, p), so the gradient of a source
token is the destination gradient at the same (k, p), and zero for padding and for tokens the
destination does not hold."""

import numpy as np
import pytest
import torch

import maskpack
from maskpack import Layout

ENGINES = ("c", "torch")


def _padded(lengths, left=False, width=None):
    return Layout.from_lengths(lengths, placement="left" if left else "right", capacity=width)


def _check(f, *xs):
    assert torch.autograd.gradcheck(f, xs, eps=1e-6, atol=1e-9)
    assert torch.autograd.gradgradcheck(f, xs, eps=1e-6, atol=1e-9)


def _rand(*shape, grad=True):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=grad)


def _positions(layout):
    """(row, column) of each real token of a padded layout, sequence by sequence, from its mask."""
    m = np.asarray(layout.mask2d())
    return [tuple(rc) for rc in np.argwhere(m)]


@pytest.mark.parametrize("engine", ENGINES)
def test_pack_unpack_gradcheck(engine, run_limit):
    lay = Layout.from_mask2d(torch.tensor([[0, 1, 1, 1, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]]))
    x = _rand(4, 5, 3)
    _check(lambda x: lay.pack(x, engine=engine), x)
    p = _rand(lay.n_tokens, 3)
    _check(lambda p: lay.unpack(p, pad_value=2.5, engine=engine), p)
    # composition: left padded <-> right padded of another width, through no packed tensor
    left = lay.padded_of("left", width=7)
    _check(lambda x: maskpack.relayout(x, lay, left, pad_value=-1.0, engine=engine), x)


@pytest.mark.parametrize("engine", ENGINES)
def test_pack_gradient_is_the_scatter_into_zeros(engine):
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    lay = Layout.from_mask2d(mask)
    x = _rand(2, 5, 4)
    g = torch.randn(lay.n_tokens, 4, dtype=torch.float64)
    (lay.pack(x, engine=engine) * g).sum().backward()
    want = torch.zeros(2, 5, 4, dtype=torch.float64)
    for t, (r, c) in enumerate(_positions(lay)):
        want[r, c] = g[t]
    assert torch.equal(x.grad, want)  # pad slots: exactly zero
    # unpack: the pad slots' gradient goes nowhere, the tokens' gradient goes back to the packed rows
    p = _rand(lay.n_tokens, 4)
    gu = torch.randn(2, 5, 4, dtype=torch.float64)
    (lay.unpack(p, pad_value=9.0, engine=engine) * gu).sum().backward()
    assert torch.equal(p.grad, torch.stack([gu[r, c] for r, c in _positions(lay)]))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("cp,scheme", [(2, "zigzag"), (4, "zigzag"), (2, "contiguous"), (4, "contiguous")])
def test_shard_gather_gradcheck(engine, cp, scheme, run_limit):
    pad = _padded([5, 1, 0, 7], left=True)
    packed = pad.packed_of()
    x = _rand(4, 7, 2)
    whole = packed.pad_to_multiple(maskpack.cp_multiple(cp))
    for r in range(cp):
        _check(lambda x: pad.shard(x, cp, r, scheme=scheme, engine=engine), x)  # padded -> a rank's part
        _check(lambda x: maskpack.relayout(x, pad, whole.cp_shard(cp, r, scheme=scheme, align=None),
                                           engine=engine), x)
    xp = _rand(packed.n_tokens, 2)
    parts = [t.detach().requires_grad_() for t in
             (packed.shard(xp, cp, r, scheme=scheme, engine=engine) for r in range(cp))]
    _check(lambda *ps: maskpack.cp_gather(list(ps), whole, scheme=scheme, align=None, engine=engine), *parts)
    # gather straight into the dataloader's left-padded layout
    shards = [whole.cp_shard(cp, r, scheme=scheme, align=None) for r in range(cp)]
    _check(lambda *ps: maskpack.relayout(list(ps), shards, pad, pad_value=0.5, engine=engine), *parts)


@pytest.mark.parametrize("engine", ENGINES)
def test_shard_gradient_lands_in_the_whole(engine):
    """The adjoint of a shard places the part's gradient into the whole; every token other ranks hold,
    and every pad slot, receives zero. Expected from cp_shard_indices' definition: rank r holds global
    slots r and 2cp-1-r of each sequence's 2cp chunks (zigzag)."""
    cp = 2
    lengths, slots, starts = [6, 2], [8, 4], [0, 6]
    packed = Layout.from_lengths(lengths, placement="packed")  # aligned to 4: slots 8 and 4
    x = _rand(packed.n_tokens, 3)
    for r in range(cp):
        x.grad = None
        part = packed.shard(x, cp, r, engine=engine)
        g = torch.randn_like(part)
        (part * g).sum().backward()
        want = torch.zeros_like(x)
        local = 0
        for k in range(len(lengths)):
            chunk = slots[k] // (2 * cp)
            for c in (r, 2 * cp - 1 - r):
                for i in range(chunk):
                    pos = c * chunk + i
                    if pos < lengths[k]:  # a pad slot's gradient lands nowhere
                        want[starts[k] + pos] = g[local]
                    local += 1
        assert local == part.shape[0]
        assert torch.equal(x.grad, want)


@pytest.mark.parametrize("engine", ENGINES)
def test_gather_last_tokens_and_to_padded_gradcheck(engine):
    lay = _padded([3, 0, 4], left=False)
    x = _rand(3, 4, 2)
    _check(lambda x: lay.gather_last_tokens(x), x)
    out = lay.gather_last_tokens(x)
    assert torch.equal(out[1], torch.zeros(2, dtype=torch.float64))  # the empty sequence
    batch = {"input_ids": torch.tensor([[1, 2, 3, 0], [0, 0, 0, 0], [4, 5, 6, 7]]),
             "attention_mask": torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])}
    for cp in (1, 2):
        bundles = [maskpack.prepare_batch(batch, padding_free=True, cp=cp, cp_rank=r) for r in range(cp)]
        outs = [_rand(*b.input_ids.shape, 2) for b in bundles]
        if cp == 1:
            _check(lambda o: bundles[0].to_padded(o), outs[0])
        else:
            _check(lambda *o: bundles[0].to_padded(o[0], parts=list(o)), *outs)


@pytest.fixture(params=[0, 32, 10**9], ids=["index", "runs", "all-runs"])
def run_limit(request, monkeypatch):
    """The torch engine's two ways: index kernels (limit 0) and contiguous runs (few runs, the default)."""
    import maskpack._moves as moves

    monkeypatch.setattr(moves, "_RUN_LIMIT", request.param)
    return request.param


def test_run_split_of_a_move():
    import maskpack._moves as moves

    pad = Layout.from_mask2d(torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]]))
    mv = moves._plan([pad.packed_of()], pad)  # unpack: rows' pads and tokens
    toks, fills = mv.runs()
    # (dst start, source, source start, length): row 0's tokens and row 1's touch in both grids, one run
    assert toks == [(2, 0, 0, 7), (12, 0, 7, 6)]
    assert fills == [(0, 2), (9, 3)]
    many = _padded([3] * 40, width=4)  # 40 rows with a pad each: 80 runs, over the limit
    assert moves._plan([many.packed_of()], many).runs() is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.bool])
def test_torch_engine_equals_c_engine_bitwise(dtype, run_limit):
    pad = Layout.from_mask2d(torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]]))
    packed = pad.packed_of()
    whole = packed.pad_to_multiple(8)
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 6, 5, generator=gen) * 50).to(dtype)
    pv = True if dtype == torch.bool else 3
    for f in (lambda e: pad.pack(x, engine=e),
              lambda e: pad.unpack(pad.pack(x), pad_value=pv, engine=e),
              lambda e: pad.shard(x, 4, 1, engine=e, pad_value=pv),
              lambda e: maskpack.cp_gather([packed.shard(pad.pack(x), 4, r) for r in range(4)], packed, engine=e),
              lambda e: maskpack.relayout(pad.pack(x), packed, whole, pad_value=pv, engine=e),
              lambda e: maskpack.relayout(x, pad, pad.padded_of("left", width=9), pad_value=pv, engine=e)):
        a, b = f("c"), f("torch")
        assert a.dtype == b.dtype == dtype and a.shape == b.shape
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))  # bit for bit


def test_torch_engine_out_and_strided_inputs(run_limit):
    pad = _padded([2, 4])
    x = torch.randn(2, 4, 3)
    want = pad.pack(x, engine="c")
    out = torch.full((6, 3), 7.0)
    assert pad.pack(x, out=out, engine="torch") is out and torch.equal(out, want)
    # a non-contiguous out (a transposed buffer) is written through its own strides
    big = torch.zeros(3, 6)
    assert torch.equal(pad.pack(x, out=big.t(), engine="torch"), want) and torch.equal(big.t(), want)
    # a strided input (every other row)
    wide = torch.zeros(4, 4, 3)
    wide[::2] = x
    assert torch.equal(pad.pack(wide[::2], engine="torch"), want)
    u = torch.empty(2, 4, 3)
    assert pad.unpack(want, out=u, pad_value=-1.0, engine="torch") is u
    assert torch.equal(u, pad.unpack(want, pad_value=-1.0, engine="c"))


def test_meta_tensors_give_shapes_without_data():
    pad = _padded([5, 1, 3], left=True)
    x = torch.empty(3, 5, 16, 8, device="meta", dtype=torch.bfloat16)
    p = pad.pack(x)
    assert p.device.type == "meta" and p.shape == (9, 16, 8) and p.dtype == torch.bfloat16
    u = pad.unpack(p)
    assert u.device.type == "meta" and u.shape == (3, 5, 16, 8)
    s = pad.shard(x, 2, 0)
    assert s.device.type == "meta" and s.shape == (3, 4, 16, 8)
    xg = torch.empty(3, 5, 4, device="meta", requires_grad=True)
    y = pad.pack(xg)
    y.sum().backward()
    assert xg.grad.shape == xg.shape and xg.grad.device.type == "meta"
    assert pad.gather_last_tokens(x).shape == (3, 16, 8)
    with pytest.raises(maskpack.Error) as e:
        pad.pack(x, engine="c")
    assert e.value.status == "MASKPACK_ERR_UNSUPPORTED" and e.value.argument == "engine"


def test_bad_input_names_argument_and_writes_nothing():
    pad = _padded([3, 2])
    x = torch.randn(2, 3, 4)
    # two devices in one call
    whole = pad.packed_of().pad_to_multiple(4)
    parts = [pad.shard(x, 2, r) for r in range(2)]
    with pytest.raises(maskpack.Error) as e:
        maskpack.cp_gather([parts[0], parts[1].to("meta")], whole, align=None)
    assert e.value.argument == "x[1]" and "cpu" in str(e.value) and "meta" in str(e.value)
    # out on another device, out of another dtype
    with pytest.raises(maskpack.Error) as e:
        pad.pack(x, out=torch.empty(5, 4, device="meta"))
    assert e.value.argument == "out" and "meta" in str(e.value)
    out = torch.full((5, 4), 7.0, dtype=torch.float64)
    for engine in ENGINES:
        with pytest.raises(maskpack.Error) as e:
            pad.pack(x, out=out, engine=engine)
        assert e.value.status == "MASKPACK_ERR_DTYPE" and e.value.argument == "out"
        assert (out == 7.0).all()
    # out= while autograd records
    xg = x.clone().requires_grad_()
    out = torch.full((5, 4), 7.0)
    with pytest.raises(maskpack.Error) as e:
        pad.pack(xg, out=out)
    assert e.value.argument == "out" and "autograd" in str(e.value)
    assert (out == 7.0).all()
    with torch.no_grad():  # allowed when nothing records
        assert pad.pack(xg, out=out) is out
    # token dims that do not match the layout: expected and found named
    for engine in ENGINES:
        with pytest.raises(maskpack.Error) as e:
            pad.pack(torch.randn(2, 4, 4), engine=engine)
        assert e.value.status == "MASKPACK_ERR_SHAPE" and "3" in str(e.value) and "4" in str(e.value)
    with pytest.raises(maskpack.Error) as e:
        pad.pack(x, engine="gpu")
    assert e.value.argument == "engine"


def test_double_backward_through_a_move():
    """A second-order quantity through pack: d/dx of ||d(sum(pack(x)^3))/dx||^2, against the dense formula."""
    lay = _padded([2, 3], left=True)
    x = _rand(2, 3, 2)
    y = lay.pack(x)
    (gx,) = torch.autograd.grad((y ** 3).sum(), x, create_graph=True)
    (ggx,) = torch.autograd.grad((gx ** 2).sum(), x)
    m = torch.as_tensor(np.asarray(lay.mask2d()))[..., None].to(torch.float64)
    want = m * 2 * (3 * x.detach() ** 2) * 6 * x.detach()
    torch.testing.assert_close(ggx, want, rtol=1e-12, atol=0)


def test_verl_style_flow_gradients_equal_dense_reference():
    """A verl-style RL step: left-padded prompts and right-padded responses concatenated into [B, S],
    packed, split for cp = 2, a per-token model on each rank, the ranks' outputs gathered and moved back to
    the padded batch for a masked loss. The weight gradient equals the dense padded computation's."""
    torch.manual_seed(0)
    prompts = [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 1, 1]]
    responses = [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    mask = torch.tensor([p + r for p, r in zip(prompts, responses)])
    # a response mask (loss on response tokens only) and the padded layout of the whole sequences
    resp = torch.tensor([[0] * 5 + r for r in responses])
    # left + right padding in one row is not a padding mask: segments start at the first real token
    lay = Layout.from_mask2d(mask)
    B, S, H = mask.shape[0], mask.shape[1], 6
    hidden = torch.randn(B, S, H, dtype=torch.float64)
    w_ref = torch.randn(H, H, dtype=torch.float64, requires_grad=True)
    w = w_ref.detach().clone().requires_grad_()

    def model(h, w):
        return torch.tanh(h @ w).sum(-1)  # per-token values

    # dense reference
    values = model(hidden, w_ref)
    loss_ref = (values * resp).sum() / resp.sum()
    loss_ref.backward()

    # maskpack: pack, cp = 2 shards (zigzag), per-rank model, gather, back to padded
    cp = 2
    packed = lay.packed_of()
    whole = packed.pad_to_multiple(maskpack.cp_multiple(cp))
    h_packed = lay.pack(hidden)
    outs = [model(packed.shard(h_packed, cp, r), w) for r in range(cp)]
    shards = [whole.cp_shard(cp, r, align=None) for r in range(cp)]
    values_pad = maskpack.relayout(outs, shards, lay)
    loss = (values_pad * resp).sum() / resp.sum()
    loss.backward()
    torch.testing.assert_close(loss, loss_ref, rtol=1e-13, atol=0)
    torch.testing.assert_close(w.grad, w_ref.grad, rtol=1e-12, atol=1e-14)


def test_readme_training_step_trains():
    """The README's training step on a tiny model: a padding-free bundle per CP rank, the ranks' logits
    back to the padded batch with to_padded(parts=...), the loss backpropagated; the gradient equals the
    padded run's."""
    torch.manual_seed(1)
    vocab, dim = 11, 8
    emb = torch.nn.Embedding(vocab, dim).double()
    head = torch.nn.Linear(dim, vocab).double()
    batch = {"input_ids": torch.tensor([[3, 4, 5, 6, 0, 0], [0, 7, 8, 9, 1, 2]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]])}
    labels = torch.where(batch["attention_mask"].bool(), batch["input_ids"], -100)

    def step(logits_padded):
        lay = Layout.from_mask2d(batch["attention_mask"])
        shifted = lay.shift_labels(labels)
        return torch.nn.functional.cross_entropy(logits_padded.reshape(-1, vocab), shifted.reshape(-1),
                                                 ignore_index=-100)

    ref = step(head(emb(batch["input_ids"])))
    ref.backward()
    g_ref = head.weight.grad.clone()
    head.weight.grad = None
    cp = 2
    bundles = [maskpack.prepare_batch(batch, backend="flash_attn", padding_free=True, cp=cp, cp_rank=r)
               for r in range(cp)]
    logits = [head(emb(b.input_ids)) for b in bundles]  # each rank's own tokens
    padded = bundles[0].to_padded(logits[0], parts=logits)  # all_gather(out.logits) in a real run
    loss = step(padded)
    loss.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-13, atol=0)
    torch.testing.assert_close(head.weight.grad, g_ref, rtol=1e-12, atol=1e-14)
    assert emb.weight.grad is not None and torch.isfinite(emb.weight.grad).all()


def test_derived_outputs_take_device_and_pin_memory():
    lay = Layout.from_mask2d(np.array([[1, 1, 1, 0], [0, 1, 1, 1]]))
    for name, call in [("cu_seqlens", lambda **k: lay.cu_seqlens(**k)),
                       ("cu_seqlens_padded", lambda **k: lay.cu_seqlens_padded(**k)),
                       ("mask2d", lambda **k: lay.mask2d(**k)),
                       ("mask4d", lambda **k: lay.mask4d("keep", **k)),
                       ("position_ids", lambda **k: lay.position_ids(**k)),
                       ("segment_ids", lambda **k: lay.segment_ids(**k)),
                       ("valid_indices", lambda **k: lay.valid_indices(**k)),
                       ("last_token_index", lambda **k: lay.last_token_index(**k)),
                       ("loss_weights", lambda **k: lay.loss_weights(**k)),
                       ("cp_shard_indices", lambda **k: lay.cp_shard_indices(2, 1, **k))]:
        host = call()
        assert isinstance(host, np.ndarray), name  # as before: numpy in, numpy out
        on = call(device="cpu")
        assert isinstance(on, torch.Tensor) and np.array_equal(on.numpy(), host), name
        meta = call(device="meta")
        assert meta.device.type == "meta" and tuple(meta.shape) == host.shape, name
        with pytest.raises(maskpack.Error) as e:  # this machine has no accelerator to pin for
            call(pin_memory=True)
        assert e.value.argument == "pin_memory", name
    r, loc = lay.cp_last_token(2, device="meta")
    assert r.device.type == loc.device.type == "meta" and r.shape == (2,)
    bm = lay.block_mask(2, 2, device="meta")
    assert bm["kv_indices"].device.type == "meta" and bm["block_size"] == (2, 2)


@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_labels_on_the_torch_path_equal_the_c_library(mode):
    """shift_labels and loss_weights of labels on an accelerator run there; engine='torch' runs that
    path on the CPU: the values equal the C library's bit for bit."""
    rng = np.random.default_rng(5)
    mask = np.array([[0, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    for lay in (Layout.from_mask2d(mask), Layout.from_mask2d(mask).packed_of()):
        shape = lay._per_token_shape()
        labels = torch.from_numpy(rng.integers(0, 50, size=shape))
        labels[torch.from_numpy(rng.random(shape) < 0.3)] = -100
        for dt in (torch.int64, torch.int32):
            a = lay.shift_labels(labels.to(dt), ignore_index=-7)
            b = lay.shift_labels(labels.to(dt), ignore_index=-7, engine="torch")
            assert a.dtype == b.dtype and torch.equal(a, b)
        sl = lay.shift_labels(labels)
        for lab in (sl, None):
            for dtype in ("float32", "float64"):
                wa, da = lay.loss_weights(mode, labels=lab, dtype=dtype, return_denominator=True)
                wb, db = lay.loss_weights(mode, labels=lab, dtype=dtype, return_denominator=True, engine="torch")
                assert da == db
                assert torch.equal(torch.as_tensor(np.asarray(wa)), wb)
        meta = lay.shift_labels(labels.to("meta"))
        assert meta.device.type == "meta" and meta.shape == labels.shape
        assert lay.loss_weights(mode, labels=sl.to("meta")).device.type == "meta"


def test_batch_to_moves_every_tensor():
    batch = {"input_ids": torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
             "labels": torch.tensor([[1, 2, 3, -100], [4, 5, -100, -100]])}
    for kw in (dict(backend="sdpa"), dict(backend="flash_attn", padding_free=True, cp=2, cp_rank=1),
               dict(backend="npu", padding_free=True, head_dim=64)):
        b = maskpack.prepare_batch(batch, **kw)
        m = b.to("meta", non_blocking=True)
        for k, v in b.as_dict().items():
            mv = m.as_dict()[k]
            if isinstance(v, (torch.Tensor, np.ndarray)):
                assert isinstance(mv, torch.Tensor) and mv.device.type == "meta" and tuple(mv.shape) == v.shape, k
            elif isinstance(v, dict):
                for kk, vv in v.items():
                    if isinstance(vv, (torch.Tensor, np.ndarray)):
                        assert mv[kk].device.type == "meta", (k, kk)
            else:
                assert mv == v, k
        assert m.layout is b.layout and b.input_ids.device.type == "cpu"  # the original is unchanged


def test_device_check_script_runs_its_device_path_on_the_cpu():
    """tools/device/check_moves_cuda.py (run where a GPU is lent) exercises the same torch-engine code on
    the CPU with --device cpu: it must pass here, so the prepared script is known to work."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, os.path.join(root, "tools", "device", "check_moves_cuda.py"), "--device", "cpu"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all checks passed" in r.stdout and "DIFFERENT" not in r.stdout
