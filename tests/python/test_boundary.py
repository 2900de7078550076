"""One Python boundary: the extension's tensor reader is the only gate for tensor arguments, and every
handle is an extension type.

Each refusal of a tensor argument has one message and one exception, whichever way the tensor reaches
the reader (a layout constructor, a move, an attention or GDN kernel, the reader itself): a
maskpack.Error with its status and the argument's name that is also a TypeError (the type these
refusals always had). The package converts what it is given and checks nothing itself.
"""

import numpy as np
import pytest
import torch

import maskpack
from maskpack import _maskpack
from maskpack._errors import ArgumentError
from maskpack._tensors import register_torch


def _refusal(call):
    with pytest.raises(ArgumentError) as e:
        call()
    assert isinstance(e.value, TypeError) and isinstance(e.value, maskpack.Error)
    return e.value


def _neg(shape, dtype=torch.float32):
    x = torch.zeros(*shape, dtype=torch.complex64).conj().imag.to(dtype)
    assert x.is_neg()
    return x


def test_each_refusal_has_one_message_whichever_way_the_tensor_comes():
    register_torch()
    lay = maskpack.Layout.from_lengths([2, 1], placement="right")
    packed = maskpack.Layout.from_lengths([3], placement="packed")
    ro = np.zeros((3, 4), np.float32)
    ro.setflags(write=False)
    gdn_in = [torch.randn(3, 1, 8), torch.randn(3, 1, 8), torch.randn(3, 1, 8), -torch.rand(3, 1), torch.rand(3, 1)]
    cases = {  # failure -> (status, message, the calls that meet it: (argument, call))
        "device": ("MASKPACK_ERR_UNSUPPORTED", "{a}: maskpack reads host memory; found a tensor on meta (call .cpu() first)",
                   [("mask", lambda: _maskpack.from_mask2d(torch.ones(2, 2, device="meta"), 0, None)),
                    ("q", lambda: _maskpack.tensor_info(torch.ones(2, device="meta"), "q"))]),
        "dtype": ("MASKPACK_ERR_DTYPE", "{a}: dtype torch.complex64 is not supported (expected one of bool, uint8, int8, "
                  "int16, int32, int64, float16, bfloat16, float32, float64)",
                  [("mask", lambda: maskpack.Layout.from_mask2d(torch.ones(2, 2, dtype=torch.complex64))),
                   ("mask", lambda: _maskpack.from_mask2d(torch.ones(2, 2, dtype=torch.complex64), 0, None)),
                   ("x", lambda: lay.pack(torch.zeros(2, 2, 4, dtype=torch.complex64))),
                   ("q", lambda: maskpack.attention(*(torch.zeros(3, 2, 8, dtype=torch.complex64),) * 3, packed))]),
        "negative bit": ("MASKPACK_ERR_UNSUPPORTED", "{a}: a tensor with the negative bit set (pass {a}.resolve_neg())",
                         [("out", lambda: lay.pack(torch.randn(2, 2, 4), out=_neg((3, 4)))),
                          ("mask", lambda: _maskpack.from_mask2d(_neg((2, 2)), 0, None)),
                          ("q", lambda: maskpack.gated_delta_rule(_neg((3, 1, 8)), *gdn_in[1:], packed))]),
        "read-only": ("MASKPACK_ERR_INVALID_ARGUMENT", "{a}: expected a writable array, found a read-only one",
                      [("out", lambda: lay.pack(np.ones((2, 2, 4), np.float32), out=ro)),
                       ("out", lambda: maskpack.attention(*(np.ones((3, 1, 4), np.float32),) * 3, packed,
                                                          out=_read_only((3, 1, 4))))]),
        "missing": ("MASKPACK_ERR_NULL_ARGUMENT", "{a}: expected an array or tensor, found None",
                    [("mask", lambda: maskpack.Layout.from_mask2d(None)),
                     ("x", lambda: _maskpack.tensor_info(None))]),
        "no tensor": ("MASKPACK_ERR_INVALID_ARGUMENT", "{a}: expected a torch tensor or a numpy array, found str",
                      [("mask", lambda: maskpack.Layout.from_mask2d("11")),
                       ("mask", lambda: _maskpack.from_mask2d("11", 0, None))]),
        "not torch (the kernels)": ("MASKPACK_ERR_INVALID_ARGUMENT", "{a}: expected a torch tensor, found numpy.ndarray",
                                    [("a", lambda: _maskpack.gdn.gates(packed._h, tuple([np.zeros((3, 1), np.float32)]
                                                                                        + [None] * 5)))]),
    }
    for failure, (status, message, calls) in cases.items():
        for arg, call in calls:
            e = _refusal(call)
            want = message.format(a=arg)
            assert (e.status, e.argument, e.message) == (status, arg, want), (failure, e.status, e.argument, e.message)


def _read_only(shape):
    a = np.zeros(shape, np.float32)
    a.setflags(write=False)
    return a


def test_every_handle_is_an_extension_type_and_the_wrong_kind_is_named():
    lay = maskpack.Layout.from_lengths([2, 1], placement="right")
    team = _maskpack.workers_create(2)
    plan = _maskpack.plan_create((lay._h,), maskpack.Layout.from_lengths([2, 1], placement="packed")._h)
    op = _maskpack.attention.op_create(lay._h, 1, 1, 8, 8, 1, 0)
    for h, t in ((lay._h, _maskpack.Layout), (team, _maskpack.Team), (plan, _maskpack.RelayoutPlan),
                 (op, _maskpack.attention.Op)):
        assert type(h) is t
        with pytest.raises(TypeError):
            t()  # handles are only made by the module's constructors
    assert _maskpack.workers_pool(team) == "own"
    with pytest.raises(TypeError, match="team: expected a maskpack._maskpack.Team, found maskpack._maskpack.RelayoutPlan"):
        _maskpack.workers_pool(plan)
    x, out = np.ones((2, 2, 3), np.float32), np.zeros((3, 3), np.float32)
    with pytest.raises(TypeError, match="plan: expected a maskpack._maskpack.RelayoutPlan, found maskpack._maskpack.Team"):
        _maskpack.plan_execute(team, (x,), out, None, None)
    with pytest.raises(TypeError, match="team: expected a maskpack._maskpack.Team, found maskpack._maskpack.AttentionOp"):
        _maskpack.plan_execute(plan, (x,), out, None, op)
    _maskpack.plan_execute(plan, (x,), out, None, team)
    assert out.sum() == 9
