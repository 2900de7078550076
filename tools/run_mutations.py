#!/usr/bin/env python3
"""Mutation run: plants each bug of tests/mutations/mutations.py, one at a time, in a scratch copy of
the working tree, rebuilds incrementally, runs the tests named for it and reports whether they
caught it (killed) or not (survived). Exit status 1 when any bug survives or cannot be planted.

    python3 tools/run_mutations.py [--keep] [--only NAME[,NAME...]] [--python PY] [--scratch DIR]

The working tree itself is never written: the copy lives under /tmp (or --scratch), with its own
meson build (-Dpython=true) and a throwaway package dir for the Python tests, as
tools/run_sanitized.sh does. `make test-mutation` runs it; it is not part of `make test`.
"""

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_mutations():
    spec = importlib.util.spec_from_file_location("mutations", os.path.join(ROOT, "tests", "mutations", "mutations.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.MUTATIONS


def sh(cmd, cwd, env=None, timeout=None):
    """-> (exit status, combined output); a timeout counts as a failure (status 124)."""
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + "\n[timed out after %ss]" % timeout


def copy_tree(dst):
    """The tracked and untracked-but-not-ignored files of the working tree, as they are now."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           stdout=subprocess.PIPE, check=True).stdout.split(b"\0")
    for f in files:
        if not f:
            continue
        rel = f.decode()
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src):  # deleted in the working tree
            continue
        os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
        shutil.copy2(src, os.path.join(dst, rel))


def package_dir(scratch, build):
    """A package dir with the scratch copy's .py files and its built extension modules."""
    pkg = os.path.join(build, "pyroot")
    shutil.rmtree(pkg, ignore_errors=True)
    os.makedirs(os.path.join(pkg, "maskpack"))
    src = os.path.join(scratch, "python", "maskpack")
    for f in os.listdir(src):
        if f.endswith(".py") or f == "py.typed":
            shutil.copy2(os.path.join(src, f), os.path.join(pkg, "maskpack", f))
        elif os.path.isdir(os.path.join(src, f)) and f != "__pycache__":  # subpackages (maskpack.compat)
            shutil.copytree(os.path.join(src, f), os.path.join(pkg, "maskpack", f),
                            ignore=shutil.ignore_patterns("__pycache__"))
    for f in os.listdir(os.path.join(build, "python")):
        if f.startswith("_") and f.endswith(".so"):
            shutil.copy2(os.path.join(build, "python", f), os.path.join(pkg, "maskpack", f))
    return pkg


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def c_target(name):
    return "tests/c/" + name


PY_TARGETS = ["_maskpack"]  # the one extension module (its planner and kernel parts included)


def meson_tests(build):
    """meson test name -> the build outputs its command line runs (the mpirun tests' programs)."""
    import json

    p = subprocess.run(["meson", "introspect", "--tests", build], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if p.returncode:
        sys.exit("meson introspect --tests failed")
    def built(a):  # a program of this build: absolute inside it, or relative to it (as meson writes args)
        if os.path.isabs(a):
            return os.path.relpath(a, build) if a.startswith(os.path.abspath(build) + os.sep) else None
        return a if not a.startswith("-") and os.sep in a else None

    return {t["name"]: [b for b in map(built, t["cmd"]) if b] for t in json.loads(p.stdout)}


def target_outputs(build):
    """meson target name -> its output files relative to the build dir (executables and modules)."""
    import json

    p = subprocess.run(["meson", "introspect", "--targets", build], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if p.returncode:
        sys.exit("meson introspect failed")
    out = p.stdout
    res = {}
    for t in json.loads(out):
        if t["type"] in ("executable", "shared module"):  # extension modules: "_maskpack.cpython-311-..."
            res.setdefault(t["name"].split(".")[0], []).extend(os.path.relpath(f, build) for f in t["filename"])
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", action="store_true", help="keep the scratch copy")
    ap.add_argument("--only", default="", help="comma-separated mutation names")
    ap.add_argument("--python", default=os.environ.get("PY", sys.executable), help="interpreter with torch, pytest")
    ap.add_argument("--scratch", default=None)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per test command")
    args = ap.parse_args()
    # The tests run inside the scratch copy (cwd=scratch): an interpreter named relative to where the
    # run was started (`make` passes PY=.venv/bin/python) must be resolved here, before that.
    py = shutil.which(args.python) if os.sep not in args.python else os.path.abspath(args.python)
    if not py or not os.path.exists(py):
        sys.exit("--python: interpreter %r not found (from %s)" % (args.python, os.getcwd()))
    args.python = py

    muts = load_mutations()
    names = [m["name"] for m in muts]
    assert len(set(names)) == len(names), "mutation names must be unique"
    if args.only:
        want = set(args.only.split(","))
        unknown = want - set(names)
        if unknown:
            sys.exit("unknown mutation(s): %s" % ", ".join(sorted(unknown)))
        muts = [m for m in muts if m["name"] in want]

    scratch = args.scratch or tempfile.mkdtemp(prefix="maskpack-mutation-")
    build = os.path.join(scratch, "build-mutation")
    t_start = time.time()
    print("mutation run: %d planted bugs, scratch copy %s" % (len(muts), scratch), flush=True)
    copy_tree(scratch)
    rc, out = sh(["meson", "setup", build, "-Dpython=true", "-Dbuildtype=release"], scratch)
    if rc:
        print(out)
        sys.exit("meson setup failed in the scratch copy")
    c_tests = sorted({t for m in muts for t in m.get("c", [])})
    mesons = sorted({t for m in muts for t in m.get("meson", [])})
    by_test = meson_tests(build) if mesons else {}
    unknown = [t for t in mesons if t not in by_test]
    if unknown:
        sys.exit("meson tests not in this build: %s" % ", ".join(unknown))
    need_py = any(m.get("py") or m.get("cli") for m in muts)
    outputs = target_outputs(build)

    def targets_of(m):
        """The ninja outputs a mutation's tests need (never the emulated AVX-512 test libraries)."""
        names = list(m.get("c", []))
        if m.get("py") or m.get("cli"):
            names += PY_TARGETS + ["maskpack"]
        return [o for n in names for o in outputs.get(n, [])] + [o for t in m.get("meson", []) for o in by_test[t]]

    everything = {"c": c_tests, "py": need_py, "cli": need_py, "meson": mesons}
    rc, out = sh(["ninja", "-C", build] + targets_of(everything), scratch)
    if rc:
        print(out[-4000:])
        sys.exit("the unmutated scratch copy does not build")
    env = dict(os.environ)
    env.pop("MASKPACK_ISA", None)
    pkg = package_dir(scratch, build) if need_py else None
    if pkg:
        env["PYTHONPATH"] = pkg  # the hypothesis profile stays the suite's ("ci"): fewer examples miss bugs

    def run_tests(m):
        """-> (all passed, output of the first failing command)."""
        for t in m.get("c", []):
            rc, out = sh([os.path.join(build, c_target(t))], scratch, env, args.timeout)
            if rc:
                return False, "%s: exit %d\n%s" % (t, rc, out[-3000:])
        if m.get("meson"):  # tests meson runs through another program (mpirun)
            rc, out = sh(["meson", "test", "-C", build, "--no-rebuild", "--print-errorlogs"] + list(m["meson"]),
                         scratch, env, args.timeout)
            if rc:
                return False, "meson test %s: exit %d\n%s" % (" ".join(m["meson"]), rc, out[-3000:])
        if m.get("py"):
            cmd = [args.python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"] + list(m["py"])
            rc, out = sh(cmd, scratch, env, args.timeout)
            if rc:
                return False, "pytest %s: exit %d\n%s" % (" ".join(m["py"]), rc, out[-3000:])
        if m.get("cli"):
            # test_cli.py MASKPACK_BINARY SOURCE_ROOT [CASE...]: the scratch copy is the source root
            cases = m["cli"] if isinstance(m["cli"], (list, tuple)) else []
            rc, out = sh([args.python, "tests/cli/test_cli.py", os.path.join(build, "maskpack"), scratch] + list(cases),
                         scratch, env, args.timeout)
            if rc:
                return False, "test_cli: exit %d\n%s" % (rc, out[-3000:])
        return True, ""

    # each distinct test command of the list once, unmutated
    seen = set()
    for m in [{"c": c_tests, "meson": mesons}] + [{"py": m["py"]} for m in muts if m.get("py")] + (
            [{"cli": True}] if any(m.get("cli") for m in muts) else []):
        key = repr(sorted(m.items()))
        if key in seen:
            continue
        seen.add(key)
        ok, out = run_tests(m)
        if not ok:
            print(out)
            sys.exit("the unmutated scratch copy fails its own tests: fix that first")
    print("baseline: builds and passes (%.0f s)" % (time.time() - t_start), flush=True)

    flags = cpu_flags()
    results = []
    for m in muts:
        t0 = time.time()
        if m.get("needs_cpu_flag") and m["needs_cpu_flag"] not in flags:
            # the planted bug is in a kernel this CPU never runs: nothing here could catch it
            results.append((m["name"], "not run", "this CPU lacks " + m["needs_cpu_flag"]))
            print("%-40s not run (this CPU lacks %s)" % (m["name"], m["needs_cpu_flag"]), flush=True)
            continue
        path = os.path.join(scratch, m["file"])
        with open(path) as f:
            orig = f.read()
        n = orig.count(m["find"])
        if n != 1:
            results.append((m["name"], "NOT PLANTED", "snippet found %d times in %s" % (n, m["file"])))
            print("%-40s NOT PLANTED (snippet found %d times in %s)" % (m["name"], n, m["file"]), flush=True)
            continue
        try:
            with open(path, "w") as f:
                f.write(orig.replace(m["find"], m["replace"]))
            rc, out = sh(["ninja", "-C", build] + targets_of(m), scratch, None, args.timeout)
            if rc:
                verdict, detail = "NOT PLANTED", "does not build:\n" + out[-2000:]
            else:
                if m.get("py"):
                    package_dir(scratch, build)
                passed, detail = run_tests(m)
                verdict = "survived" if passed else "killed"
        finally:
            with open(path, "w") as f:
                f.write(orig)
            # the restored file must look new to ninja, or the next mutation would link a stale object
            os.utime(path, None)
        first = detail.strip().splitlines()[:1] if verdict == "killed" else []
        print("%-40s %-11s %5.0f s  %s" % (m["name"], verdict, time.time() - t0, first[0][:90] if first else ""),
              flush=True)
        if verdict != "killed":
            print("  " + m.get("why", "") + "\n" + detail[-1500:])
        results.append((m["name"], verdict, detail))

    killed = sum(1 for r in results if r[1] == "killed")
    not_run = sum(1 for r in results if r[1] == "not run")
    print("\nmutation run: %d of %d planted bugs killed, %d survived, %d not planted, %d not run on this CPU "
          "(%.0f s)" % (killed, len(results) - not_run, sum(1 for r in results if r[1] == "survived"),
                        sum(1 for r in results if r[1] == "NOT PLANTED"), not_run, time.time() - t_start))
    for name, verdict, _ in results:
        if verdict not in ("killed", "not run"):
            print("  %s: %s" % (verdict, name))
    if not args.keep and not args.scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    sys.exit(0 if killed + not_run == len(results) else 1)


if __name__ == "__main__":
    main()
