"""torch.compile: a compiled step that takes layouts built outside it calls the moves and the derived
outputs with no graph break (fullgraph=True), through maskpack's custom ops and their fake
implementations; its outputs and gradients equal the eager step's bit for bit (aot_eager: the graph
Dynamo and AOTAutograd capture, run without code generation, so the comparison is exact). Layouts,
including derived ones (packed_of, padded_of, cp_shard), are built outside the compiled function, as a
dataloader does."""

import numpy as np
import pytest
import torch

import maskpack
from maskpack import Layout


def _step(x, lay, packed, left_lay, labels):
    tokens = lay.pack(x)                                   # [T, H]
    h = torch.tanh(tokens) * 2
    cu = lay.cu_seqlens(device=x.device)
    pos = lay.position_ids(device=x.device)
    seg = lay.segment_ids(device=x.device)
    keep = lay.mask4d("keep", device=x.device)
    sl = lay.shift_labels(labels)
    w = lay.loss_weights(labels=sl, device=x.device)
    back = lay.unpack(h, pad_value=0.0)                    # [B, S, H]
    left = maskpack.relayout(back, lay, left_lay, pad_value=-1.0)
    last = lay.gather_last_tokens(back)                    # [N, H]
    parts = [packed.shard(h, 2, r) for r in range(2)]
    gathered = maskpack.cp_gather(parts, packed)           # the whole packed batch again
    shard = lay.shard(x, 2, 1)
    return ((back.sum(-1) * w).sum() + last.square().sum() + left.sum() * 1e-3 + gathered.sum() * 0.5
            + shard.sum() + (cu.sum() + pos.sum() + seg.sum() + keep.sum()).to(x.dtype) * 1e-6
            + (sl == -100).sum().to(x.dtype) * 1e-6)


def test_fullgraph_step_equals_eager():
    torch._dynamo.reset()
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]])
    lay = Layout.from_mask2d(mask)
    labels = torch.where(mask.bool(), torch.arange(18).reshape(3, 6), -100)
    x = torch.randn(3, 6, 4, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(_step, fullgraph=True, backend="aot_eager")
    args = (lay, lay.packed_of(), lay.padded_of("left", width=9), labels)
    y = compiled(x, *args)
    (g,) = torch.autograd.grad(y, x)
    y_ref = _step(x, *args)
    (g_ref,) = torch.autograd.grad(y_ref, x)
    assert torch.equal(y, y_ref)
    assert torch.equal(g, g_ref)
    # the same layout again: no recompilation; outputs still exact
    x2 = torch.randn(3, 6, 4, dtype=torch.float64, requires_grad=True)
    assert torch.equal(compiled(x2, *args), _step(x2, *args))


def test_compiled_moves_on_meta_and_several_sources():
    torch._dynamo.reset()
    lay = Layout.from_lengths([5, 2, 7], placement="left")
    packed = lay.packed_of()

    def f(parts):
        return maskpack.cp_gather(parts, packed, scheme="contiguous").sum(-1)

    parts = [packed.shard(torch.randn(packed.n_tokens, 3), 4, r, scheme="contiguous").requires_grad_()
             for r in range(4)]
    out = torch.compile(f, fullgraph=True, backend="aot_eager")(parts)
    out.sum().backward()
    ref = [p.detach().clone().requires_grad_() for p in parts]
    f(ref).sum().backward()
    assert torch.equal(out, f(ref))
    for p, q in zip(parts, ref):
        assert torch.equal(p.grad, q.grad)  # each part's gradient: its shard of the whole's, pads zero


def test_compiled_graph_names_a_freed_layout():
    torch._dynamo.reset()
    from maskpack import _compile

    with pytest.raises(maskpack.Error) as e:
        _compile.move_op([torch.zeros(2, 3)], [12345], 0, "pack", "", 0.0, 0, "")
    assert e.value.status == "MASKPACK_ERR_NOT_FOUND"
