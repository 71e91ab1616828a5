# Two commands from a fresh clone: `make run` (the demo on an embedded local Ray) and
# `make test` (the whole suite). Both create .venv and install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test bench docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/app-toolkit run examples.demo:app

test: $(STAMP)
	$(VENV)/bin/mypy
	$(PY) -m pytest
	$(VENV)/bin/mkdocs build --strict --site-dir .site

bench: $(STAMP)
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(PY) benchmarks/http_overhead.py

docs: $(STAMP)
	$(VENV)/bin/mkdocs serve

clean:
	rm -rf $(VENV) .site .pytest_cache
