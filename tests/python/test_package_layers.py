"""The package reads top-down (issue #36): each module of maskpack imports only modules of the layers below
it, at import time and inside its functions alike, so no two modules import each other. The one way up is
by name through the bottom layer (maskpack._runtime.above), for the paths that live above their caller (a
kernel's context-parallel path, torch.compile's custom ops, a Batch's torch integrations), each provided by
a module above that the package's top loads (maskpack.__init__._ABOVE). ``import maskpack`` loads no
torch, and no public name of the package is shadowed by a submodule of the same name (``maskpack.plan`` is
the function; the module is maskpack._plan).

The layers, bottom first, are declared once: LAYERS below. The C extension (maskpack._maskpack) is below
every one of them."""

import ast
import json
import os
import subprocess
import sys

import pytest

import maskpack

PKG = os.path.dirname(maskpack.__file__)

LAYERS = (
    ("_errors",),  # the error type
    ("_runtime",),  # the threads= rule and default, worker teams, layout caches, the paths above by name
    ("_alloc", "_tensors"),  # torch's output cache; tensor arguments and outputs, small validators
    ("_rule", "_shm"),  # attention rules; shared-memory buffers for the collectives
    ("_moves",),  # the move engine (plans, both engines, autograd, relayout, cp_gather)
    ("_layout",),  # maskpack.Layout, in one file
    ("_npu", "_plan", "padding"),  # over a layout: NPU arguments, batch planning, padding policies
    ("batch",),  # a model batch over layouts and moves
    ("collator", "_attention"),  # the collator over batches; the attention kernels
    ("gdn",),  # the Gated DeltaNet kernels and layers (read a batch as prepare_batch does)
    ("distributed",),  # context parallelism over the kernels
    ("_compile",),  # torch.compile's custom ops over every layer below
    ("hf", "compat"),  # a transformers model on maskpack; the framework adapters
    ("__init__",),  # the package: its public names, in one table
    ("demo",),  # the end-to-end demo program
)
LAYER = {m: i for i, names in enumerate(LAYERS) for m in names}
EXTENSION = "_maskpack"


def _module_files():
    """{layer name: [source files]} of every Python module of the package (compat: the subpackage)."""
    out = {}
    for f in sorted(os.listdir(PKG)):
        if f.endswith(".py"):
            out[f[:-3]] = [os.path.join(PKG, f)]
    sub = os.path.join(PKG, "compat")
    out["compat"] = [os.path.join(sub, f) for f in sorted(os.listdir(sub)) if f.endswith(".py")]
    return out


FILES = _module_files()


def _targets(node, in_compat):
    """The package modules (layer names) an import statement names; EXTENSION for the C extension,
    "compat" for the adapters' own modules."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names if a.name == "maskpack" or a.name.startswith("maskpack.")]
        return ["__init__" if n == "maskpack" else n.split(".")[1] for n in names]
    if node.level == 0:
        mod = node.module or ""
        if mod == "maskpack":
            return [a.name for a in node.names]
        return [mod.split(".")[1]] if mod.startswith("maskpack.") else []
    level = node.level - (1 if in_compat else 0)  # how far above maskpack/ the statement reaches
    if level == 0:  # compat's own modules
        return ["compat"]
    if node.module:
        return [node.module.split(".")[0]]
    return [a.name for a in node.names]


def _imports(layer):
    """[(file, line, target, at import time)] of every import of a package module in a layer's files."""
    out = []
    for path in FILES[layer]:
        tree = ast.parse(open(path).read(), path)
        inner = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner.update(id(n) for n in ast.walk(fn) if n is not fn)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _targets(node, layer == "compat"):
                    out.append((os.path.relpath(path, PKG), node.lineno, t, id(node) not in inner))
    return out


def test_every_module_has_a_layer():
    assert sorted(FILES) == sorted(LAYER), "a module of the package is missing from LAYERS, or LAYERS names one " \
                                           "that does not exist"


@pytest.mark.parametrize("layer", sorted(LAYER))
def test_a_module_imports_only_the_layers_below_it(layer):
    """At import time and inside functions: a module a layer imports is in a layer below it (the extension is
    below all); the adapters in compat import each other."""
    wrong = []
    for path, line, target, top in _imports(layer):
        if target == EXTENSION or (layer == "compat" and target == "compat"):
            continue
        if target not in LAYER:
            wrong.append(f"{path}:{line}: imports maskpack.{target}, which is no module of LAYERS")
        elif LAYER[target] >= LAYER[layer]:
            wrong.append(f"{path}:{line}: imports {target} (layer {LAYER[target]}) from layer {LAYER[layer]}"
                         f"{'' if top else ' inside a function'}")
    assert not wrong, "\n".join(wrong)


def _above_calls(layer):
    """The path names a layer's files ask maskpack._runtime.above for (``_above("cp")``)."""
    out = []
    for path in FILES[layer]:
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_above"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                out.append((os.path.relpath(path, PKG), node.lineno, node.args[0].value))
    return out


def test_the_way_up_is_only_to_a_layer_above():
    """maskpack._runtime.above is for paths that live above their caller: each path a module asks for is
    provided by a module of the package above it (a module below is imported directly)."""
    from maskpack import _runtime

    assert set(_runtime._PROVIDERS) == set(maskpack._ABOVE)
    provider = {}
    for path in maskpack._ABOVE:
        name = _runtime.above(path).__name__
        assert name.startswith("maskpack.") and name[9:] in LAYER, (path, name)
        provider[path] = name[9:]
    wrong = []
    for layer in LAYER:
        for path, line, name in _above_calls(layer):
            if name not in provider or LAYER[provider[name]] <= LAYER[layer]:
                wrong.append(f"{path}:{line}: _above({name!r}) from layer {LAYER[layer]}: provided by "
                             f"{provider.get(name)!r}")
    assert not wrong, "\n".join(wrong)


def _fresh(code):
    """Runs code in a fresh interpreter with this maskpack on the path -> its last line of output, parsed."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(PKG), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


_LOADED = ("import sys, json\n"
           "def loaded():\n"
           "    return {m.split('.')[1] for m in sys.modules if m.startswith('maskpack.')}\n")


def test_import_maskpack_is_torch_free_and_loads_only_its_eager_layers():
    got = _fresh(_LOADED + "import maskpack\n"
                 "print(json.dumps(['torch' in sys.modules, sorted(loaded()), sorted(maskpack._EAGER)]))")
    torch_loaded, loaded, eager = got
    assert not torch_loaded, "import maskpack must not import torch"
    top = max(LAYER[m[1:]] for m in eager)
    assert {m[1:] for m in eager} <= set(loaded)
    extra = [m for m in loaded if m != EXTENSION and (m not in LAYER or LAYER[m] > top)]
    assert not extra, f"import maskpack loads modules above its eager ones: {extra}"


@pytest.mark.parametrize("layer", [m for m in sorted(LAYER) if m not in ("__init__", "demo")])
def test_importing_a_module_loads_only_it_and_the_layers_below(layer):
    """In a fresh interpreter, after ``import maskpack``: importing the module loads no module of a layer
    at or above its own but itself (sys.modules before and after)."""
    name = "maskpack." + layer
    new = _fresh(_LOADED + "import maskpack\nbefore = loaded()\n"
                 f"import {name}\nprint(json.dumps(sorted(loaded() - before)))")
    wrong = [m for m in new if m != layer and m != EXTENSION and (m not in LAYER or LAYER[m] >= LAYER[layer])]
    assert not wrong, f"importing {name} loads {wrong}"


def test_no_public_name_is_shadowed_by_a_submodule():
    """Every public submodule is the package attribute of its name, and no public name of another kind has
    a submodule of the same name (``maskpack.plan`` is the function, there is no maskpack/plan.py)."""
    import importlib

    public_modules = [m for m in FILES if not m.startswith("_") and m != "demo"]
    for m in public_modules:
        mod = importlib.import_module("maskpack." + m)
        assert getattr(maskpack, m) is mod, f"maskpack.{m} is not the module maskpack/{m}"
    for name in maskpack.__all__:
        value = getattr(maskpack, name)
        if name in FILES or name.lstrip("_") in FILES and name.startswith("_"):
            assert isinstance(value, type(maskpack)), f"maskpack.{name} is a {type(value).__name__} and a module"
    for m in FILES:
        if m.startswith("_") and m != "__init__":
            assert m[1:] not in FILES, f"maskpack/{m}.py and maskpack/{m[1:]}.py: one name, two modules"
