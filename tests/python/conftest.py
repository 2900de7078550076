"""Shared pytest configuration for the maskpack Python tests.

Hypothesis runs derandomized (the same examples on every run and machine) so a failure always
reproduces. Profiles: "ci" (default, 200 examples per property) and "quick" (40) and "thorough"
(1000); choose with MASKPACK_HYPOTHESIS_PROFILE. Nothing is skipped: a missing optional dependency
(torch, transformers) makes the importing test module fail, because CI installs all of them.
"""

import os
import sys

from hypothesis import HealthCheck, settings

_COMMON = dict(
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("ci", max_examples=200, **_COMMON)
settings.register_profile("quick", max_examples=40, **_COMMON)
settings.register_profile("thorough", max_examples=1000, **_COMMON)
settings.load_profile(os.environ.get("MASKPACK_HYPOTHESIS_PROFILE", "ci"))

sys.path.insert(0, os.path.dirname(__file__))  # for _reference.py


def pytest_report_header(config):
    import maskpack

    return f"maskpack {maskpack.__version__} from {os.path.dirname(maskpack.__file__)}"


def pytest_sessionstart(session):
    # tools/run_sanitized.sh sets MASKPACK_EXPECT_SANITIZED=1: the run is only worth something if the
    # extension imported is the sanitized one it built (not an installed copy) and ASan is loaded.
    if os.environ.get("MASKPACK_EXPECT_SANITIZED") != "1":
        return
    import maskpack
    from maskpack import _maskpack

    with open("/proc/self/maps") as f:
        maps = f.read()
    if "libasan" not in maps:
        raise RuntimeError("MASKPACK_EXPECT_SANITIZED=1 but AddressSanitizer is not loaded in this process")
    roots = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    ext = os.path.abspath(_maskpack.__file__)
    if not any(ext.startswith(r + os.sep) for r in roots):
        raise RuntimeError(f"MASKPACK_EXPECT_SANITIZED=1 but maskpack's extension comes from {ext}, not from "
                           f"PYTHONPATH {roots} (maskpack at {maskpack.__file__})")


def pytest_terminal_summary(terminalreporter):
    # kernels this CPU could not run (test_attention, test_gdn): a passing run checked less
    missing = set()
    for key, mod in list(sys.modules.items()):
        if key.rsplit(".", 1)[-1].startswith("test_"):
            names = mod.__dict__.get("NOT_RUN_ON_THIS_CPU") if hasattr(mod, "__dict__") else None
            if isinstance(names, list):
                missing.update(names)
    missing = sorted(missing)
    if missing:
        terminalreporter.write_sep("-", "kernels NOT RUN on this CPU (it lacks their ISA)")
        terminalreporter.write_line(", ".join(missing))
    # the hypothesis feature frequencies of test_properties (test_strategies_cover_every_feature)
    for key, mod in list(sys.modules.items()):
        lines = mod.__dict__.get("FEATURE_REPORT") if key.endswith("test_properties") else None
        if isinstance(lines, list) and lines:
            terminalreporter.write_sep("-", "hypothesis: share of examples with each feature")
            for line in lines:
                terminalreporter.write_line(line)
            break
