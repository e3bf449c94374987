# Two commands matter: `make run` (the whole system on this machine) and `make test`.
SHELL := /bin/bash
export PYTHONSAFEPATH := 1
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
HELM := $(VENV)/tools/helm
export LADING_HELM := $(abspath $(HELM))

.PHONY: run test lint typecheck imports unit bench reliability crds clean

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

# The fault suite (docs/reliability.md), the full run: ARGS='--scenario worker-kill --seed 7' reruns one.
reliability: $(STAMP)
	$(BIN)/python hack/reliability.py $(ARGS)

clean:
	rm -rf $(VENV) .lading .pytest_cache .mypy_cache .ruff_cache
