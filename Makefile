# The README names these targets. `make up` brings everything up; `make test` runs every test.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The maf-sandbox backend (sandbox_operator.maf) and its tier need Python 3.12 (maf-sandbox's
# floor): a second venv. maf-sandbox-codeact is the published kind its tier runs unchanged.
VENV_MAF := .venv-maf
PY_MAF := $(VENV_MAF)/bin/python
MAF_STAMP := $(VENV_MAF)/.installed
MAF_PYENV_VERSION ?= 3.12.1
MAF_CODEACT := maf-sandbox-codeact==0.25.0
MAF_SOURCES = $(shell find src/sandbox_operator/maf -name '*.py') tests/fixtures/maf_fingerprint.py

.PHONY: venv venv-maf test test-unit test-integration test-e2e test-cluster test-cluster-concurrent test-cluster-exclusive test-maf lint typecheck crds chart-crds docs image \
        cluster-up cluster-down cluster-status images up down clean kwok-up kwok-down

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[operator,acas,test]'
	touch $(STAMP)

venv: $(STAMP)

$(MAF_STAMP): pyproject.toml
	@if ! test -x $(PY_MAF); then \
	  if command -v pyenv >/dev/null && pyenv versions --bare | grep -qx '$(MAF_PYENV_VERSION)'; then \
	    PYENV_VERSION=$(MAF_PYENV_VERSION) python -m venv $(VENV_MAF); \
	  elif command -v python3.12 >/dev/null; then \
	    python3.12 -m venv $(VENV_MAF); \
	  else \
	    echo "error: the maf tier needs Python 3.12: install python3.12 or pyenv's $(MAF_PYENV_VERSION)" >&2; \
	    exit 1; \
	  fi; \
	fi
	$(PY_MAF) -m pip install -q --upgrade pip
	$(PY_MAF) -m pip install -q -e '.[operator,acas,test,maf]' '$(MAF_CODEACT)'
	touch $(MAF_STAMP)

venv-maf: $(MAF_STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests hack benchmarks
	$(VENV)/bin/ruff format --check src tests hack benchmarks
	$(VENV)/bin/xenon --max-absolute D --max-modules D --max-average A src/sandbox_operator

typecheck: $(STAMP) $(MAF_STAMP)
	$(VENV)/bin/mypy
	$(VENV_MAF)/bin/mypy --python-version 3.12 $(MAF_SOURCES)

crds: $(STAMP)
	$(PY) hack/gen_crds.py
	$(PY) hack/chart_crds.py

chart-crds: $(STAMP)
	$(PY) hack/chart_crds.py

# The reasons, metrics and RBAC tables of docs/, from the code and the chart (sandbox_operator.docgen).
docs: $(STAMP)
	$(PY) hack/gen_docs.py

image: $(STAMP)
	bash operator/build-image.sh import

# The README's first command: local cluster (or $$KUBECONFIG), images, chart, a sample sandbox.
up: $(STAMP)
	bash hack/up.sh

down:
	bash hack/down.sh

# One pytest run: its output in build/test-NAME.log, its slowest tests in
# build/durations-NAME.txt; the run's exit status.
define pytest_run
	@mkdir -p build
	@set -o pipefail; $(2) 2>&1 | tee build/test-$(1).log; rc=$$?; \
	sed -n '/slowest .*durations/,/^=/p' build/test-$(1).log > build/durations-$(1).txt; \
	exit $$rc
endef

# A tier run in two parts, test-NAME-concurrent then test-NAME-exclusive (both run even if the
# first fails): one log (build/test-NAME.log), the slowest of each kept, and one closing line
# summing both (hack/pytest_total.py); the run's exit status.
define two_part_run
	@rc=0; \
	$(MAKE) --no-print-directory test-$(1)-concurrent || rc=1; \
	$(MAKE) --no-print-directory test-$(1)-exclusive || rc=1; \
	cat build/test-$(1)-concurrent.log build/test-$(1)-exclusive.log > build/test-$(1).log; \
	cat build/durations-$(1)-concurrent.txt build/durations-$(1)-exclusive.txt \
	  > build/durations-$(1).txt; \
	$(PY) hack/pytest_total.py --drop=deselected build/test-$(1)-concurrent.log \
	  build/test-$(1)-exclusive.log > build/test-$(1)-total.txt || rc=1; \
	cat build/test-$(1)-total.txt; \
	echo "$$(tail -1 build/test-$(1)-total.txt)" >> build/test-$(1).log; \
	exit $$rc
endef

# The whole suite: static checks, then three runs: unit tests (4 workers), the integration and
# e2e tests against a real cluster (the fixtures bring the local one up unless KUBECONFIG
# points at one), and the maf tier on Python 3.12. All three run even if one fails; the
# target fails if any did, after printing each run's slowest tests and, last, one closing line
# summing the three runs' (hack/pytest_total.py: CI reads the verdict from the last one).
test: $(STAMP) $(MAF_STAMP) lint typecheck
	@rc=0; rm -f build/test-unit.log build/test-cluster.log build/test-maf.log; \
	$(MAKE) --no-print-directory test-unit || rc=1; \
	$(MAKE) --no-print-directory test-cluster || rc=1; \
	$(MAKE) --no-print-directory test-maf || rc=1; \
	for run in unit cluster maf; do \
	  echo "== slowest tests of the $$run run (build/durations-$$run.txt)"; \
	  cat build/durations-$$run.txt 2>/dev/null; \
	done; \
	$(PY) hack/pytest_total.py build/test-unit.log build/test-cluster.log build/test-maf.log \
	  || rc=1; \
	exit $$rc

test-unit: $(STAMP)
	$(call pytest_run,unit,$(PY) -m pytest tests/unit -n 4 --durations=15)

# The cluster tiers: the tests that only use their own namespace run concurrently (pytest-xdist,
# CLUSTER_WORKERS workers, a module per worker), then the `exclusive` ones alone; one log and one
# closing line for both (hack/pytest_total.py), the slowest of each kept.
CLUSTER_WORKERS ?= 3
test-cluster: $(STAMP)
	$(call two_part_run,cluster)

test-cluster-concurrent: $(STAMP)
	$(call pytest_run,cluster-concurrent,$(PY) -m pytest tests/integration tests/e2e -m "not exclusive" -n $(CLUSTER_WORKERS) --dist loadfile --durations=30)

test-cluster-exclusive: $(STAMP)
	$(call pytest_run,cluster-exclusive,$(PY) -m pytest tests/integration tests/e2e -m exclusive --durations=15)

test-integration: $(STAMP)
	$(call pytest_run,integration,$(PY) -m pytest tests/integration --durations=15)

test-e2e: $(STAMP)
	$(call pytest_run,e2e,$(PY) -m pytest tests/e2e --durations=15)

# maf-sandbox's own conformance suites: over the local data plane (tests/unit/maf) and through
# the operator on the real cluster, runc and gVisor (tests/maf). Run as the cluster tiers are: its modules concurrently (an operator per runtime per
# module, each in its own namespace), then the `exclusive` ones alone (cluster-wide installs,
# timings); one log and one closing line for both.
MAF_WORKERS ?= 2
test-maf: $(MAF_STAMP)
	$(call two_part_run,maf)

test-maf-concurrent: $(MAF_STAMP)
	$(call pytest_run,maf-concurrent,$(PY_MAF) -m pytest tests/unit/maf tests/maf -m "not exclusive" -n $(MAF_WORKERS) --dist loadfile --durations=15)

test-maf-exclusive: $(MAF_STAMP)
	$(call pytest_run,maf-exclusive,$(PY_MAF) -m pytest tests/maf -m exclusive --durations=15)

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
	rm -rf $(VENV) $(VENV_MAF) build dist src/*.egg-info
