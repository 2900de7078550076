# Thin wrapper over meson. `make run` is the main job, `make test` runs every test.
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
COV_BUILD ?= build-cov
FUZZ_SECONDS ?= 20
FUZZ_LONG_SECONDS ?= 300
PY := .venv/bin/python

.PHONY: all deps deps-c build run python test test-c test-install test-python test-python-emulated-amx test-conformance test-sanitize test-fuzz fuzz-long coverage test-mutation bench format install clean

all: build

deps-c:
	bash tools/install_deps.sh c

deps:
	bash tools/install_deps.sh all

$(BUILD)/build.ninja:
	meson setup $(BUILD) -Dpython=false

build: deps-c $(BUILD)/build.ninja
	ninja -C $(BUILD)

# The main job: `maskpack demo` (python/maskpack/demo.py): a batch drawn from data/sft_lengths.txt, planned,
# a small Qwen3.5 hybrid trained on it padded (transformers), packed and at cp = 2 (gloo); one table, the
# attention backends' arguments, pictures in $(BUILD)/demo/. Sets up the Python side first when the
# .venv lacks torch, transformers or this tree's maskpack.demo (a fresh clone: make python). DEMO_ARGS: its options.
run: build
	@src=$$(ls python/maskpack/_maskpack*.so >/dev/null 2>&1 && echo python); PYTHONPATH=$$src $(PY) -c "import filecmp, \
		torch, transformers, maskpack.demo as d; raise SystemExit(not filecmp.cmp(d.__file__, 'python/maskpack/demo.py'))" \
		2>/dev/null || $(MAKE) --no-print-directory python
	./$(BUILD)/maskpack demo $(DEMO_ARGS)

python: deps
	$(PY) -m pip install -q --no-build-isolation .

test: deps build python
	$(MAKE) --no-print-directory test-c test-install test-python test-python-emulated-amx test-conformance test-fuzz \
		test-sanitize

test-c:
	meson test -C $(BUILD) --print-errorlogs

# The installed library, header and pkg-config file build the README's C example.
test-install:
	bash tools/check_install.sh $(BUILD)

# (the compat twins' modules run once, in test-conformance, after their upstream packages are installed)
test-python:
	$(PY) -m pytest tests/python -q --ignore-glob='tests/python/test_compat_*'

# The kernel-facing Python tests against an extension whose AVX-512, AVX512-BF16 and AMX intrinsics are
# carried out in portable C and whose CPU check reports AMX: what an AMX CPU runs under AUTO, on any CPU.
test-python-emulated-amx:
	bash tools/test_python_emulated_amx.sh build-emu-amx

# maskpack.compat's twins against the pinned upstream functions (installed without dependencies into
# build/upstream, once), bit for bit; per-twin case counts in build/conformance/counts.json.
test-conformance: python
	PY=$(PY) sh tools/install_upstream.sh build/upstream
	rm -f build/conformance/counts.json
	PYTHONPATH=tests/python $(PY) -m pytest tests/python/test_compat_*.py -q -p no:cacheprovider
	cat build/conformance/counts.json

# Every fuzz target on its seed corpus for FUZZ_SECONDS each (libFuzzer when clang is present).
test-fuzz:
	bash tools/fuzz_ci.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

# A longer fuzz run, not part of `make test`: every target (the CLI's inspect analysis and plan parsing
# included) for FUZZ_LONG_SECONDS each (default 5 minutes; about an hour in all).
fuzz-long:
	bash tools/fuzz_ci.sh $(FUZZ_BUILD) $(FUZZ_LONG_SECONDS)

# The whole C suite and the Python suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test-sanitize:
	bash tools/run_sanitized.sh $(ASAN_BUILD)

# Line and branch coverage (not part of `test`): an instrumented build in $(COV_BUILD), every meson
# test, the fuzz corpora and the Python suite against it, gcovr's report in $(COV_BUILD)/coverage/.
coverage: deps
	PY=$(PY) bash tools/coverage.sh $(COV_BUILD)

# Planted bugs (tests/mutations/mutations.py), one at a time in a scratch copy under /tmp: every one
# must make its tests fail. Not part of `make test` (about 20 minutes on 2 cores).
test-mutation: python
	PY=$(PY) $(PY) tools/run_mutations.py

# Every benchmark program against its baselines in one run (their shapes and arguments: bench/shapes.json),
# plus sweeps over sequence length and cp-sim -> bench/report.md, plots in bench/report/ (the lead runs it
# on a quiet machine; most of an hour on 2 cores). BENCH_ARGS: e.g. --quick, --only bench_gdn,bench_plan.
bench: build python
	$(PY) bench/report.py $(BENCH_ARGS)

# Every C file in the style of .clang-format (Debian's clang-format; a developer tool, not a build step).
format:
	@command -v clang-format >/dev/null || { echo "make format: clang-format is not installed (apt-get install clang-format)"; exit 1; }
	git ls-files '*.c' '*.h' '*.inc' | xargs clang-format -i --style=file

install: build
	meson install -C $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(COV_BUILD)
