# The README names these targets. `make up` brings everything up; `make test` runs every test.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test test-unit test-integration test-e2e lint typecheck crds chart-crds image \
        cluster-up cluster-down cluster-status images up down clean kwok-up kwok-down

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[operator,acas,test]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests hack benchmarks
	$(VENV)/bin/ruff format --check src tests hack benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy

crds: $(STAMP)
	$(PY) hack/gen_crds.py
	$(PY) hack/chart_crds.py

chart-crds: $(STAMP)
	$(PY) hack/chart_crds.py

image: $(STAMP)
	bash operator/build-image.sh import

# The README's first command: local cluster (or $$KUBECONFIG), images, chart, a sample sandbox.
up: $(STAMP)
	bash hack/up.sh

down:
	bash hack/down.sh

# The whole suite: static checks, unit tests, then integration and e2e tests against a real
# cluster (the fixtures bring the local one up unless KUBECONFIG points at one).
test: $(STAMP) lint typecheck
	$(PY) -m pytest tests --durations=30

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit

test-integration: $(STAMP)
	$(PY) -m pytest tests/integration

test-e2e: $(STAMP)
	$(PY) -m pytest tests/e2e

cluster-up: $(STAMP)
	$(PY) hack/cluster.py up

cluster-down: $(STAMP)
	$(PY) hack/cluster.py down

cluster-status: $(STAMP)
	$(PY) hack/cluster.py status

images: $(STAMP)
	$(PY) hack/cluster.py images

# Fake nodes for scale tests (docs/cluster.md, "Fake nodes: kwok"); the cluster must be up.
KWOK_NODES ?= 3

kwok-up: $(STAMP)
	$(PY) hack/cluster.py kwok up --nodes $(KWOK_NODES)

kwok-down: $(STAMP)
	$(PY) hack/cluster.py kwok down

clean:
	rm -rf $(VENV) build dist src/*.egg-info
