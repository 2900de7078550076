"""The C enum values the package uses against include/maskpack.h.

The package passes enum values to C as integers (placements, conventions, CP schemes, plan options,
dtype codes, ISAs, NPU finding codes). It keeps no copy of them: the extension exports its enum tables
(``_maskpack.enums()``: the package's name for each constant, with the constant itself as the value),
the thread limit and the dtype and ISA names, and the modules read those. This test parses the header
and checks the exported tables entry by entry against the named constants, checks that every module
table is the exported one (so a renumbered or inserted C value fails here instead of silently selecting
another option), and that no module of the package holds a literal copy of a C value.
"""

import ast
import importlib
import pathlib
import re

import numpy as np
import pytest
import torch

import maskpack
from maskpack import _maskpack, _runtime

# the modules themselves (the package exports functions under some of these names)
_layout, _moves, _npu, _rule, _tensors, gdn, plan = (
    importlib.import_module("maskpack." + m) for m in ("_layout", "_moves", "_npu", "_rule", "_tensors", "gdn", "_plan"))

HEADER = pathlib.Path(__file__).resolve().parents[2] / "include" / "maskpack.h"


def header_constants():
    """Every NAME = value of every enum in the header (C comments removed first)."""
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    consts = {}
    for body in re.findall(r"\benum\b[^{;]*\{(.*?)\}", text, flags=re.S):
        for name, value in re.findall(r"\b(MASKPACK_\w+)\s*=\s*(-?\d+)", body):
            assert name not in consts, f"{name} defined twice"
            consts[name] = int(value)
    return consts


C = header_constants()

# the extension's tables (_maskpack.enums()): its name -> {the package's word: the C constant it stands for}
EXPORTED = {
    "placement": {"right": "MASKPACK_PLACE_RIGHT", "left": "MASKPACK_PLACE_LEFT", "packed": "MASKPACK_PLACE_PACKED"},
    "mask2d_convention": {"keep": "MASKPACK_MASK2D_KEEP", "doc_id": "MASKPACK_MASK2D_DOC_ID"},
    "mask_convention": {"keep": "MASKPACK_MASK_KEEP", "masked": "MASKPACK_MASK_MASKED",
                        "additive": "MASKPACK_MASK_ADDITIVE"},
    "cu_form": {"te": "MASKPACK_CU_TE", "npu": "MASKPACK_CU_NPU"},
    "boundary": {"reset": "MASKPACK_BOUNDARY_RESET", "step": "MASKPACK_BOUNDARY_STEP"},
    "fill": {"-inf": "MASKPACK_FILL_NEG_INF", "min": "MASKPACK_FILL_DTYPE_MIN"},
    "alignment": {"top_left": "MASKPACK_ALIGN_TOP_LEFT", "bottom_right": "MASKPACK_ALIGN_BOTTOM_RIGHT",
                  "unstated": "MASKPACK_ALIGN_UNSTATED"},
    "npu_layout": {n: "MASKPACK_NPU_" + n for n in ("BSND", "BNSD", "BSH", "SBH", "TND")},
    "npu_mask_kind": {n.lower(): "MASKPACK_NPU_MASK_" + n for n in ("NONE", "COMPRESSED", "PREFIX_COMPRESSED", "FULL")},
    "cp_scheme": {"zigzag": "MASKPACK_CP_ZIGZAG", "contiguous": "MASKPACK_CP_CONTIGUOUS"},
    "cp_align": {"verl": "MASKPACK_CP_ALIGN_VERL", "minimal": "MASKPACK_CP_ALIGN_MINIMAL"},
    "loss_mode": {"token": "MASKPACK_LOSS_TOKEN", "sequence": "MASKPACK_LOSS_SEQUENCE"},
    "plan_objective": {"tokens": "MASKPACK_PLAN_TOKENS", "attention": "MASKPACK_PLAN_ATTENTION"},
    "plan_algorithm": {"bfd": "MASKPACK_PLAN_BFD", "ffd": "MASKPACK_PLAN_FFD", "nextfit": "MASKPACK_PLAN_NEXTFIT"},
    "plan_row_width": {"capacity": "MASKPACK_PLAN_WIDTH_CAPACITY", "used": "MASKPACK_PLAN_WIDTH_USED"},
    "isa": {n: "MASKPACK_ISA_" + n.upper() for n in ("auto", "ref", "avx512", "avx2", "avx512_bf16", "amx")},
    # every NPU finding of the header, by its own name
    "npu_finding": {k: k for k in C if k.startswith("MASKPACK_NPU_")
                    and k[len("MASKPACK_NPU_"):] not in ("BSND", "BNSD", "BSH", "SBH", "TND")
                    and k[len("MASKPACK_NPU_MASK_"):] not in ("NONE", "COMPRESSED", "PREFIX_COMPRESSED", "FULL")},
    "status": {k: k for k in C if k.startswith("MASKPACK_ERR_") or k == "MASKPACK_OK"},
}

# (Python dict, its key -> the C constant it stands for)
TABLES = [
    ("_layout._PLACEMENTS", _layout._PLACEMENTS,
     {"right": "MASKPACK_PLACE_RIGHT", "left": "MASKPACK_PLACE_LEFT", "packed": "MASKPACK_PLACE_PACKED"}),
    ("_layout._MASK2D_CONV", _layout._MASK2D_CONV, {"keep": "MASKPACK_MASK2D_KEEP", "doc_id": "MASKPACK_MASK2D_DOC_ID"}),
    ("_layout._MASK_CONV", _layout._MASK_CONV,
     {"keep": "MASKPACK_MASK_KEEP", "masked": "MASKPACK_MASK_MASKED", "additive": "MASKPACK_MASK_ADDITIVE"}),
    ("_layout._CU_FORMS", _layout._CU_FORMS, {"te": "MASKPACK_CU_TE", "npu": "MASKPACK_CU_NPU"}),
    ("_layout._BOUNDARY", _layout._BOUNDARY, {"reset": "MASKPACK_BOUNDARY_RESET", "step": "MASKPACK_BOUNDARY_STEP"}),
    ("_layout._FILLS", _layout._FILLS, {"-inf": "MASKPACK_FILL_NEG_INF", "min": "MASKPACK_FILL_DTYPE_MIN"}),
    ("_layout.NPU_LAYOUTS", _layout.NPU_LAYOUTS, {n: "MASKPACK_NPU_" + n for n in ("BSND", "BNSD", "BSH", "SBH", "TND")}),
    ("_rule.ALIGNMENTS", _rule.ALIGNMENTS,
     {"top_left": "MASKPACK_ALIGN_TOP_LEFT", "bottom_right": "MASKPACK_ALIGN_BOTTOM_RIGHT"}),
    # Ulysses splits the sequence in contiguous pieces: the contiguous scheme
    ("_moves._SCHEMES", _moves._SCHEMES,
     {"zigzag": "MASKPACK_CP_ZIGZAG", "contiguous": "MASKPACK_CP_CONTIGUOUS", "ulysses": "MASKPACK_CP_CONTIGUOUS"}),
    ("_moves._ALIGNS", _moves._ALIGNS, {"verl": "MASKPACK_CP_ALIGN_VERL", "minimal": "MASKPACK_CP_ALIGN_MINIMAL"}),
    ("_moves._PLACEMENTS", _moves._PLACEMENTS, {"right": "MASKPACK_PLACE_RIGHT", "left": "MASKPACK_PLACE_LEFT"}),
    ("_moves._LOSS_MODES", _moves._LOSS_MODES, {"token": "MASKPACK_LOSS_TOKEN", "sequence": "MASKPACK_LOSS_SEQUENCE"}),
    ("_plan._ALIGN", plan._ALIGN, {"verl": "MASKPACK_CP_ALIGN_VERL", "minimal": "MASKPACK_CP_ALIGN_MINIMAL"}),
    ("_plan._OBJECTIVE", plan._OBJECTIVE, {"tokens": "MASKPACK_PLAN_TOKENS", "attention": "MASKPACK_PLAN_ATTENTION"}),
    ("_plan._ALGORITHM", plan._ALGORITHM,
     {"bfd": "MASKPACK_PLAN_BFD", "ffd": "MASKPACK_PLAN_FFD", "nextfit": "MASKPACK_PLAN_NEXTFIT"}),
    ("_plan._ROW_WIDTH", plan._ROW_WIDTH, {"capacity": "MASKPACK_PLAN_WIDTH_CAPACITY", "used": "MASKPACK_PLAN_WIDTH_USED"}),
    # the reverse direction: C codes the package names
    ("_layout._NPU_MASK_KINDS", {v: k for k, v in _layout._NPU_MASK_KINDS.items()},
     {n.lower(): "MASKPACK_NPU_MASK_" + n for n in ("NONE", "COMPRESSED", "PREFIX_COMPRESSED", "FULL")}),
    ("_layout._NPU_LAYOUT_NAMES", {v: k for k, v in _layout._NPU_LAYOUT_NAMES.items()},
     {n: "MASKPACK_NPU_" + n for n in ("BSND", "BNSD", "BSH", "SBH", "TND")}),
    ("_rule.ALIGNMENT_NAMES", {v: k for k, v in _rule.ALIGNMENT_NAMES.items()},
     {"top_left": "MASKPACK_ALIGN_TOP_LEFT", "bottom_right": "MASKPACK_ALIGN_BOTTOM_RIGHT"}),
    ("_rule.ALIGN_UNSTATED", {"unstated": _rule.ALIGN_UNSTATED}, {"unstated": "MASKPACK_ALIGN_UNSTATED"}),
    ("_tensors.ISA_CODES", _tensors.ISA_CODES,
     {n: "MASKPACK_ISA_" + n.upper() for n in ("auto", "ref", "avx512", "avx2", "avx512_bf16", "amx")}),
]

# every module-level table of the package holding C integer codes: a new table must be added to TABLES
# (or to the dtype checks below) before test_every_enum_table_is_checked passes
CHECKED = {("_layout", "_NPU_MASK_KINDS"), ("_layout", "_NPU_LAYOUT_NAMES"), ("_rule", "ALIGNMENT_NAMES"),
           ("_rule", "_ALIGNMENT"),
           ("_tensors", "DTYPE_CODE"), ("_tensors", "_NP_CODE"), ("_tensors", "_TORCH_CODES"), ("_npu", "NPU_FINDING_NAMES")}
CHECKED |= {tuple(t[0].split(".")) for t in TABLES if t[0].count(".") == 1 and t[0] != "_rule.ALIGN_UNSTATED"}
DTYPE_CONST = {"bool": "MASKPACK_BOOL", "uint8": "MASKPACK_U8", "int8": "MASKPACK_I8", "int16": "MASKPACK_I16",
               "int32": "MASKPACK_I32", "int64": "MASKPACK_I64", "float16": "MASKPACK_F16",
               "bfloat16": "MASKPACK_BF16", "float32": "MASKPACK_F32", "float64": "MASKPACK_F64"}


def test_header_parsed():
    # the parse itself: known values, and enough of them that a broken regex cannot pass silently
    assert C["MASKPACK_ERR_UNSUPPORTED"] == 16 and C["MASKPACK_F32"] == 8 and C["MASKPACK_NPU_TND"] == 4
    assert len(C) > 90


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_exported_enum_tables_match_header(name):
    table, consts = _maskpack.enums()[name], EXPORTED[name]
    assert set(table) == set(consts), f"enums()[{name!r}]: keys {sorted(table)} vs the checked {sorted(consts)}"
    for key, const in consts.items():
        assert const in C, f"{name}[{key!r}]: {const} is not in maskpack.h"
        assert table[key] == C[const], f"enums()[{name!r}][{key!r}] = {table[key]}, maskpack.h has {const} = {C[const]}"


def test_exported_tables_are_complete_and_the_limits_and_names_are_the_headers():
    assert set(_maskpack.enums()) == set(EXPORTED) | {"dtype"}
    assert _maskpack.enums() is not _maskpack.enums()  # a new dict each call: no caller edits another's
    # dtype and ISA names in code order: the library's own (maskpack_dtype_name, maskpack_isa_name)
    assert len(_maskpack.DTYPE_NAMES) == C["MASKPACK_DTYPE_COUNT_"]
    for code, n in enumerate(_maskpack.DTYPE_NAMES):
        assert C[DTYPE_CONST[n]] == code and _maskpack.enums()["dtype"][n] == code
    assert len(_maskpack.ISA_NAMES) == C["MASKPACK_ISA_COUNT_"]
    for code, n in enumerate(_maskpack.ISA_NAMES):
        assert C["MASKPACK_ISA_" + n.upper()] == code
    assert _maskpack.enums()["status"] == {n: i for i, n in enumerate(_maskpack.status_names())}


@pytest.mark.parametrize("name,table,consts", TABLES, ids=[t[0] for t in TABLES])
def test_python_enum_dicts_match_header(name, table, consts):
    assert set(table) == set(consts), f"{name}: keys {sorted(table)} vs the checked {sorted(consts)}"
    for key, const in consts.items():
        assert const in C, f"{name}[{key!r}]: {const} is not in maskpack.h"
        assert table[key] == C[const], f"{name}[{key!r}] = {table[key]}, maskpack.h has {const} = {C[const]}"


def _int_table(v):
    """A dict between names and plain ints (bool excluded), either way round: a copy of C codes.
    (Caches keyed by a count, such as the worker teams, map ints to objects and are not tables.)"""
    def ints(xs):
        return all(isinstance(x, int) and not isinstance(x, bool) for x in xs)

    def strs(xs):
        return all(isinstance(x, str) for x in xs)
    return isinstance(v, dict) and bool(v) and ((strs(v) and ints(v.values())) or (ints(v) and strs(v.values())))


def test_every_enum_table_is_checked():
    pkg = pathlib.Path(maskpack.__file__).parent
    checked = {id(getattr(importlib.import_module("maskpack." + m), a)) for m, a in CHECKED}
    found = {}
    for path in sorted(pkg.glob("*.py")):
        if path.stem == "__init__":
            continue
        mod = importlib.import_module("maskpack." + path.stem)
        for attr, value in vars(mod).items():
            if _int_table(value):
                found.setdefault(id(value), f"{path.stem}.{attr}")  # an imported table is the same object
    # the scan itself must see the known tables (a broken scan would make the next assert vacuous)
    assert {id(_layout._PLACEMENTS), id(plan._ALGORITHM), id(_npu.NPU_FINDING_NAMES)} <= set(found)
    unchecked = sorted(n for i, n in found.items() if i not in checked)
    assert not unchecked, f"integer tables not checked against maskpack.h: {unchecked}"


def test_dtype_codes_match_header():
    assert set(_tensors.DTYPE_NAMES) == set(DTYPE_CONST)
    for code, n in enumerate(_tensors.DTYPE_NAMES):
        assert code == C[DTYPE_CONST[n]], f"DTYPE_NAMES[{code}] = {n!r}, maskpack.h has {DTYPE_CONST[n]} = {C[DTYPE_CONST[n]]}"
    assert len(_tensors.DTYPE_NAMES) == C["MASKPACK_DTYPE_COUNT_"]
    for n in DTYPE_CONST:  # torch dtypes: the same table (the kernels are checked with it too)
        assert _tensors._torch_code(torch, getattr(torch, n)) == C[DTYPE_CONST[n]], f"torch.{n}"
    for t, code in _tensors._TORCH_CODES.items():
        assert code == C[DTYPE_CONST[str(t).replace("torch.", "")]], f"_TORCH_CODES[{t}]"
    assert _tensors.dtype_code(_tensors.describe_kernel(torch.zeros(2, dtype=torch.bfloat16), "x")) == C["MASKPACK_BF16"]
    # the extension's own reader (DLPack codes for torch, buffer formats for numpy): the header's codes
    from maskpack import _maskpack

    _tensors.register_torch()
    for n in DTYPE_CONST:
        assert _maskpack.tensor_info(torch.zeros(2, dtype=getattr(torch, n)))[0] == C[DTYPE_CONST[n]], f"torch.{n}"
        if n != "bfloat16":
            assert _maskpack.tensor_info(np.zeros(2, dtype=n))[0] == C[DTYPE_CONST[n]], f"numpy {n}"
    for d, code in _tensors._NP_CODE.items():
        assert code == C[DTYPE_CONST[np.dtype(d).name if np.dtype(d).name != "bool" else "bool"]], f"_NP_CODE[{d}]"
    assert _tensors._torch_code(torch, torch.bfloat16) == C["MASKPACK_BF16"]


def test_npu_finding_names_match_header():
    for code, const in _npu.NPU_FINDING_NAMES.items():
        assert C.get(const) == code, f"NPU_FINDING_NAMES[{code}] = {const}, maskpack.h has {C.get(const)}"
    # every finding the header defines has a name on the Python side
    mask_kinds = {"MASKPACK_NPU_MASK_" + n for n in ("NONE", "COMPRESSED", "PREFIX_COMPRESSED", "FULL")}
    findings = {k for k in C if k.startswith("MASKPACK_NPU_") and k not in mask_kinds
                and k[len("MASKPACK_NPU_"):] not in _layout.NPU_LAYOUTS}
    assert findings == set(_npu.NPU_FINDING_NAMES.values())


def test_isa_names_are_the_header_vocabulary():
    # the names the bindings return come from the C side; they are the header's ISAs
    isas = {k[len("MASKPACK_ISA_"):].lower() for k in C if k.startswith("MASKPACK_ISA_") and not k.endswith("COUNT_")}
    assert isas == {"auto", "ref", "avx2", "avx512", "avx512_bf16", "amx"}
    assert maskpack.gdn_isa() in isas
    assert maskpack.attention_isa("float32") in isas


def test_thread_limit_matches_header():
    """The one thread limit: the ``threads=`` check of every Python call against the header's
    MASKPACK_MAX_THREADS (a #define, not an enum), and the C library refuses one thread more."""
    m = re.search(r"#define\s+MASKPACK_MAX_THREADS\s+(\d+)", HEADER.read_text())
    assert m, "MASKPACK_MAX_THREADS is not defined in the header"
    assert _runtime.MAX_THREADS == _tensors.MAX_THREADS == _maskpack.MAX_THREADS == int(m.group(1))
    from maskpack._maskpack import gdn as _gdn

    lay = maskpack.Layout.from_lengths([4], placement="packed")
    _gdn.op_create(lay._h, 1, 1, 16, 16, 0.25, True, True, int(m.group(1)), 0)
    with pytest.raises(maskpack.Error) as e:
        _gdn.op_create(lay._h, 1, 1, 16, 16, 0.25, True, True, int(m.group(1)) + 1, 0)
    assert e.value.argument == "opts.n_threads"


def _literal_codes(node) -> bool:
    """A literal that spells C codes: a dict display mapping names to int constants (or back), or an int
    constant (a bound such as MAX_THREADS), or a tuple of the dtype / ISA names."""
    def ints(xs):
        return xs and all(isinstance(x, ast.Constant) and type(x.value) is int for x in xs)

    def strs(xs):
        return xs and all(isinstance(x, ast.Constant) and isinstance(x.value, str) for x in xs)
    if isinstance(node, ast.Dict):
        return bool((strs(node.keys) and ints(node.values)) or (ints(node.keys) and strs(node.values)))
    if isinstance(node, (ast.Tuple, ast.List)) and strs(node.elts):
        names = {e.value for e in node.elts}
        return names <= set(_maskpack.DTYPE_NAMES) | set(_maskpack.ISA_NAMES) and len(names) > 2
    return False


def test_no_module_keeps_a_literal_copy_of_a_c_enum():
    """The package reads the extension's tables: no module-level name of any module is bound to a literal
    table of codes (a dict display of names and ints, a tuple of dtype or ISA names), and the thread
    limit is the extension's value."""
    pkg = pathlib.Path(maskpack.__file__).parent
    found = []
    for path in sorted(pkg.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) and node.value is not None else []
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if names and _literal_codes(node.value):
                found.append(f"{path.relative_to(pkg)}:{node.lineno} {names[0]}")
            if "MAX_THREADS" in names and isinstance(node.value, ast.Constant):
                found.append(f"{path.relative_to(pkg)}:{node.lineno} MAX_THREADS")
    assert not found, f"literal copies of C values: {found}"
    # the scan sees a literal where there is one
    assert _literal_codes(ast.parse('X = {"right": 0, "left": 1}').body[0].value)
    assert _literal_codes(ast.parse('X = ("bool", "uint8", "int8")').body[0].value)
    # the tables the modules use are the extension's
    assert _layout._PLACEMENTS == _maskpack.enums()["placement"] and _tensors.DTYPE_NAMES is _maskpack.DTYPE_NAMES
    assert _tensors.ISA_CODES == _maskpack.enums()["isa"] and _runtime.MAX_THREADS is _maskpack.MAX_THREADS
