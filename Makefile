# The README's two commands: `make demo` and `make test`.
PY ?= python3
export PREFECT_SERVER_ANALYTICS_ENABLED = false
export DO_NOT_TRACK = 1
export TOKENIZERS_PARALLELISM = false

.PHONY: install demo test

install:
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"

demo: install
	hindsight run pipeline -c configs/demo.yaml

test: install
	$(PY) -m pytest -q
