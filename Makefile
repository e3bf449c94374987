# Two commands matter: `make run` (the whole system on this machine) and `make test`.
SHELL := /bin/bash
export PYTHONSAFEPATH := 1
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
HELM := $(VENV)/tools/helm
FUZZ := $(VENV)/fuzz
export LADING_HELM := $(abspath $(HELM))

.PHONY: run test lint typecheck imports unit bench reliability api-fuzz crds clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-* && touch $(STAMP)

$(HELM): hack/install_helm.py | $(STAMP)
	$(BIN)/python hack/install_helm.py $(HELM)

run: $(STAMP)
	$(BIN)/lading run examples/quickstart.yaml

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

imports: $(STAMP)
	$(BIN)/lint-imports

test: lint typecheck imports $(HELM)
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

crds: $(STAMP)
	$(BIN)/lading crds --output-dir crds --output-dir charts/lading/crds

bench: $(STAMP)
	$(BIN)/python hack/bench.py

# Lading beside Celery and Procrastinate in one run (docs/benchmarks.md "Side by side"); installs the peers.
bench-compare: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python hack/bench.py compare

# The fault suite (docs/reliability.md), the full run: ARGS='--scenario worker-kill --seed 7' reruns one.
reliability: $(STAMP)
	$(BIN)/python hack/reliability.py $(ARGS)

# Schemathesis against a live `lading api` (docs/api.md), a few minutes: not part of `make test`.
# Its own environment under .venv/fuzz (its pytest plugin stays out of the test suite's).
# ARGS='--max-examples 200' goes to `st run`.
$(FUZZ)/bin/st:
	$(PYTHON) -m venv $(FUZZ)
	$(FUZZ)/bin/python -m pip install --quiet 'schemathesis>=4.32'

api-fuzz: $(STAMP) $(FUZZ)/bin/st
	PATH=$(abspath $(FUZZ))/bin:$$PATH $(BIN)/python hack/api_fuzz.py $(ARGS)

clean:
	rm -rf $(VENV) .lading .pytest_cache .mypy_cache .ruff_cache
