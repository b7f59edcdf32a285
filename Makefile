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

# Recreated / re-installed whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install '$(TORCH)'
	$(PIP) install -e '.[test]'
	touch $@

# `make .venv` also creates and installs the environment.
.PHONY: $(VENV)
$(VENV): $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check src tests

test: $(STAMP)
	$(PY) -m ruff check src tests
	$(PY) -m pytest -q

demo: $(STAMP)
	$(PY) -m ollie demo

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
