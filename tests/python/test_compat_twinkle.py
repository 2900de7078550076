"""maskpack.compat.twinkle against twinkle-kit 0.5.1's InputProcessor methods (extracted unmodified from
build/upstream/twinkle/processor/base.py and called on a fake processor: its device mesh, framework and
platform faked per case), bit for bit."""

from __future__ import annotations

import ast
import dataclasses
import types
from typing import Any, Dict, List, Optional

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import maskpack
from maskpack.compat import twinkle as tw

import compat_upstream as cu

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
BASE = "twinkle/processor/base.py"


@pytest.fixture(scope="module")
def up():
    cu.require_upstream("twinkle")
    platform = {"prefix": "cuda"}
    npu = {"on": False}
    ns = {"torch": torch, "Optional": Optional, "List": List, "Dict": Dict, "Any": Any, "dataclass": dataclasses.dataclass,
          "Platform": types.SimpleNamespace(device_prefix=lambda: platform["prefix"]),
          "torch_util": types.SimpleNamespace(is_torch_npu_available=lambda: npu["on"]),
          "InputFeature": dict}
    text = (cu.UPSTREAM / BASE).read_text()
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    psp = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PackedSeqParams")
    exec(compile("".join(lines[psp.lineno - 2:psp.end_lineno]), BASE, "exec"), ns)  # with its @dataclass line
    proc = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "InputProcessor")
    pm = next(n for n in proc.body if isinstance(n, ast.Assign) and n.targets[0].id == "padding_map")
    padding_map = ast.literal_eval(pm.value)
    fns = {name: cu.extract(BASE, name, ns, cls="InputProcessor")
           for name in ("drop_causal_4d_mask", "pad_cp", "split_cp", "_get_packed_seq_params")}
    yield types.SimpleNamespace(platform=platform, npu=npu, padding_map=padding_map, PSP=ns["PackedSeqParams"], **fns)
    cu.write_counts()


def _proc(up, cp=1, tp=1, sp=False, rank=0):
    mesh = types.SimpleNamespace(cp_world_size=cp, tp_world_size=tp, sequence_parallel=sp, cp_rank=rank)
    return types.SimpleNamespace(device_mesh=mesh, framework="megatron", padding_map=up.padding_map)


def test_padding_map_is_twinkles(up):
    assert tw.PADDING_MAP == up.padding_map


@st.composite
def packed_rows(draw, mult_cp=None):
    lens = draw(st.lists(st.integers(1, 9), min_size=1, max_size=4))
    if mult_cp:
        lens = [2 * mult_cp * -(-n // (2 * mult_cp)) for n in lens]
    pos = torch.cat([torch.arange(n) for n in lens])
    return lens, pos


def _inputs(lens, pos, seed, mrope=False, mask=True):
    t = pos.numel()
    g = torch.Generator().manual_seed(seed)
    inp = {"input_ids": torch.randint(1, 99, (1, t), generator=g), "labels": torch.randint(1, 99, (1, t), generator=g),
           "position_ids": pos.expand(3, 1, t).clone() if mrope else pos.unsqueeze(0).clone(),
           "completion_mask": torch.randint(0, 2, (1, t), generator=g), "other": torch.arange(4)}
    if mask:
        inp["attention_mask"] = torch.ones(1, t, dtype=torch.int64)
    return inp


@SETTINGS
@given(packed_rows(), st.booleans())
def test_get_packed_seq_params(up, case, npu):
    lens, pos = case
    up.npu["on"] = npu
    a = up._get_packed_seq_params(pos.unsqueeze(0))
    b = tw.get_packed_seq_params(pos.unsqueeze(0), npu=npu)
    for f in dataclasses.fields(a):
        cu.assert_same(getattr(a, f.name), getattr(b, f.name), f.name)
    cu.count("twinkle.get_packed_seq_params")


@SETTINGS
@given(packed_rows(), st.integers(1, 4), st.integers(1, 4), st.booleans(), st.booleans(), st.booleans())
def test_pad_cp(up, case, cp, tp, sp, mrope, mask):
    lens, pos = case
    inp = _inputs(lens, pos, len(lens) * 31 + cp, mrope, mask)
    a = up.pad_cp(_proc(up, cp, tp, sp), [dict(inp)])
    b = tw.pad_cp([dict(inp)], cp=cp, tp=tp, sequence_parallel=sp)
    assert a[0].keys() == b[0].keys()
    for k in a[0]:
        cu.assert_same(a[0][k], b[0][k], k)
    cu.count("twinkle.pad_cp")


@SETTINGS
@given(st.integers(1, 4), st.data(), st.booleans(), st.booleans(), st.booleans())
def test_split_cp(up, cp, data, packed, mrope, mask4d):
    lens, pos = data.draw(packed_rows(mult_cp=cp))
    inp = _inputs(lens, pos, len(lens) * 17 + cp, mrope)
    t = pos.numel()
    if mask4d:
        inp["attention_mask"] = torch.rand(1, 1, t, t, generator=torch.Generator().manual_seed(t)) > 0.5
    if packed:
        inp["packed_seq_params"] = tw.get_packed_seq_params(pos.unsqueeze(0), npu=False)
    inp["mm_token_type_ids"] = torch.randint(0, 3, (1, t), generator=torch.Generator().manual_seed(t))
    for r in range(cp):
        a = up.split_cp(_proc(up, cp, 1, False, r), [dict(inp)])
        b = tw.split_cp([dict(inp)], cp=cp, cp_rank=r)
        assert a[0].keys() == b[0].keys()
        for k in a[0]:
            if k == "attention_mask" and cp > 1:
                # twinkle leaves the mask whole; the twin splits it with the tokens
                cu.assert_same(a[0][k], inp[k], "upstream leaves attention_mask unsplit")
                assert b[0][k].shape[-2 if mask4d else -1] == t // cp
                continue
            if k == "packed_seq_params":
                assert a[0][k] is b[0][k]
                continue
            cu.assert_same(a[0][k], b[0][k], k)
        cu.count("twinkle.split_cp")


@SETTINGS
@given(st.booleans(), st.sampled_from(["causal", "full", None]), st.booleans())
def test_drop_causal_4d_mask(up, npu, kind, four_d):
    mask = torch.rand(2, 1, 5, 5) > 0.5 if four_d else torch.ones(2, 5, dtype=torch.int64)
    inp = [{"attention_mask": mask, "input_ids": torch.zeros(2, 5)}, {"input_ids": torch.zeros(1)}]
    up.platform["prefix"] = "npu" if npu else "cuda"
    a = up.drop_causal_4d_mask(None, [dict(x) for x in inp], attention_mask_type=kind)
    b = tw.drop_causal_4d_mask([dict(x) for x in inp], npu=npu, attention_mask_type=kind)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            cu.assert_same(x[k], y[k], k)
    cu.count("twinkle.drop_causal_4d_mask")


def test_bad_input():
    with pytest.raises(maskpack.Error) as e:  # twinkle would drop the tokens before the first 0
        tw.pad_cp([{"position_ids": torch.tensor([[3, 4, 0, 1]]), "input_ids": torch.zeros(1, 4)}], cp=2, tp=1)
    assert e.value.argument == "position_ids"
    with pytest.raises(maskpack.Error) as e:  # twinkle pads only the key columns of a 4D mask
        tw.pad_cp([{"position_ids": torch.tensor([[0, 1, 2]]), "attention_mask": torch.ones(1, 1, 3, 3)}], cp=2, tp=1)
    assert e.value.argument == "attention_mask"
    with pytest.raises(maskpack.Error) as e:
        tw.split_cp([{"input_ids": torch.zeros(1, 6)}], cp=2, cp_rank=0)
    assert e.value.argument == "inputs"
    with pytest.raises(maskpack.Error) as e:
        tw.split_cp([{"input_ids": torch.zeros(1, 8)}])
    assert e.value.argument == "cp"
