# Ollie developer tasks. On a fresh clone `make demo` / `make test` do all the set-up.
#
# torch is installed FIRST and pinned to 2.13.0: on the CPU machines that version is a
# local CPU build (taken through pip's constraint file); letting `pip install -e .`
# resolve a bare `torch` requirement instead would pull multi-GB CUDA wheels.

VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: all venv test lint demo clean

all: test

venv: $(STAMP)

# Recreated / re-installed whenever pyproject.toml or this file changes. The optional model suites
# (extra 'models': torchvision, transformers) are installed too, so their tests run.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install '$(TORCH)'
	$(PIP) install -e '.[test,models]'
	touch $@

# `make .venv` also creates and installs the environment.
.PHONY: $(VENV)
$(VENV): $(STAMP)

# mypy checks the packages [tool.mypy] in pyproject.toml lists (`files`).
lint: $(STAMP)
	$(PY) -m ruff check src tests
	$(PY) -m mypy

# The tests run in TEST_JOBS worker processes (pytest-xdist), each test file in one worker
# (its module fixtures made once), so both cores are busy during numba compiles and Python
# work (docs/design/038-test-workers.md). TEST_JOBS=0 runs them in this process.
TEST_JOBS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile

test: $(STAMP)
	$(PY) -m ruff check src tests
	$(PY) -m mypy
	$(PYTEST)

# `make test-load`: the whole suite while tools/cpu_hog.py keeps every core busy (one
# busy-looping process per core, started before pytest and stopped when it ends, pass or fail;
# its processes also exit if the run is interrupted or killed). A check by hand that no test
# depends on how fast or idle the machine is: expect it to take about twice `make test`'s time
# on 2 cores. (`make test` itself already runs the tests marked `timing`, the ones of time
# budgets and measurements, under such a load: tests/conftest.py's `cpu_hog` fixture.)
.PHONY: test-load
test-load: $(STAMP)
	$(PY) -m ruff check src tests
	$(PY) tools/cpu_hog.py >/dev/null & hog=$$!; \
	$(PYTEST); status=$$?; \
	kill $$hog; wait $$hog; exit $$status

# `make fuzz`: the fuzzing suite (tests/fuzz) with many generated cases each: malformed
# expression text, generated graphs through ollie.optimize against eager PyTorch and ONNX
# Runtime, bad call-time inputs. `make test` runs the same tests with a few cases each.
# FUZZ_EXAMPLES sets the cases per test (default 300); hypothesis draws fresh ones each run.
FUZZ_EXAMPLES ?= 300
.PHONY: fuzz
fuzz: $(STAMP)
	OLLIE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q tests/fuzz -p no:cacheprovider

demo: $(STAMP)
	$(PY) -m ollie demo

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
