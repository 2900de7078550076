"""The planted bugs of tests/mutations/mutations.py (make test-mutation) still plant: each entry's `find`
snippet occurs exactly once in its file, and the tests it names exist, so a refactor that moves the code
cannot silently turn an entry into a no-op (the mutation run itself is not part of `make test`)."""

import importlib.util
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _mutations():
    spec = importlib.util.spec_from_file_location("mutations", os.path.join(ROOT, "tests", "mutations", "mutations.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.MUTATIONS


def _c_tests():
    """The names of the meson tests declared under tests/ (test('name', ...) and the foreach-built ones)."""
    names = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "tests")):
        for f in files:
            if f == "meson.build":
                text = open(os.path.join(folder, f)).read()
                names |= set(re.findall(r"\btest\(\s*'([A-Za-z0-9_]+)'", text))
                names |= set(re.findall(r"'(test_[A-Za-z0-9_]+)'", text))
                for base in re.findall(r"\[\s*'(test_[A-Za-z0-9_]+)'\s*,", text):
                    names |= {base + "_emulated_avx512", base + "_emulated_amx"}
    return names


def test_every_planted_bug_still_plants():
    muts = _mutations()
    assert len(muts) >= 50
    seen = set()
    c_tests = _c_tests()
    for m in muts:
        assert m["name"] not in seen, m["name"]
        seen.add(m["name"])
        path = os.path.join(ROOT, m["file"])
        assert os.path.isfile(path), f"{m['name']}: {m['file']} is gone"
        n = open(path).read().count(m["find"])
        assert n == 1, f"{m['name']}: its snippet occurs {n} times in {m['file']} (the code moved: update the entry)"
        assert m["find"] != m["replace"], m["name"]
        for t in m.get("c", []):
            assert t in c_tests, f"{m['name']}: no meson test {t!r}"
        for arg in m.get("py", []):
            p = arg.split("::")[0]
            if p.endswith(".py"):
                assert os.path.isfile(os.path.join(ROOT, p)), f"{m['name']}: {p} is gone"
