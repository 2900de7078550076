"""The installed package is the source tree's: every module of python/maskpack (and its subpackages) is
listed in python/meson.build, which installs the package file by file (a module missing there imports from
the source tree and fails only once installed: `pip install .`, the wheel, CI)."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_module_is_installed():
    listed = set(re.findall(r"'(maskpack/[^']*(?:\.py|py\.typed))'", open(os.path.join(ROOT, "python", "meson.build")).read()))
    pkg = os.path.join(ROOT, "python")
    found = set()
    for folder, _, files in os.walk(os.path.join(pkg, "maskpack")):
        if "__pycache__" in folder:
            continue
        for f in files:
            if f.endswith(".py") or f == "py.typed":
                found.add(os.path.relpath(os.path.join(folder, f), pkg))
    assert found - listed == set(), f"not installed by python/meson.build: {sorted(found - listed)}"
    assert listed - found == set(), f"listed but missing: {sorted(listed - found)}"
