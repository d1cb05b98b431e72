# The two commands a newcomer needs: `make demo` and `make test`. Both install what is
# missing first (a Python venv, the test bed's binaries, Azurite), so a fresh machine works.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: test demo dev-up dev-down deps bins azurite chromium lint typecheck unit crds clean \
	image test-real node-clean node-debs checkov chart-package

deps: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml requirements/lock.txt Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements/lock.txt -e '.[server,dev]'
	@# the test bed (testbed/) is importable in this venv only: it ships in no wheel or image
	$(BIN)/python -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "o41-testbed.pth").write_text("$(CURDIR)\n")'
	touch $@

bins:
	@hack/testbed-bin.sh >/dev/null

# checkov, the chart's second static check (tests/chart/test_chart_hygiene.py), in a venv of its
# own: it pins boto3 1.35, the product needs 1.40+. Run offline by the test, never online.
checkov: .venv-checkov/.installed
.venv-checkov/.installed: requirements/checkov.txt
	test -x .venv-checkov/bin/python || $(PY) -m venv .venv-checkov
	.venv-checkov/bin/python -m pip install -q --no-deps -r requirements/checkov.txt
	touch $@

azurite:
	@hack/install-azurite.sh >/dev/null

# The app, etcd and pause images with podman from Debian's packages (no Docker, no
# registry); rebuilt only when what goes into them changes. Prints their references.
image:
	@hack/image.sh

# Debian's Chromium for the usage page's browser test (Playwright drives it; it never
# downloads a browser of its own).
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

lint: deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: deps
	$(BIN)/mypy

# The whole suite, the real node's and the image's tests included (root: podman builds the
# images, a kubelet, containerd, runc, CNI, kube-proxy and CoreDNS run the chart's own pods).
# Three workers on CI's two cores (pytest-xdist; TEST_WORKERS=0 for one process): most of
# a test's time is spent waiting on the processes it starts (API servers, etcd, pods), so a
# third worker fills the cores (run 19: 812 s against 1,050 s on two). Each module goes
# whole to one worker, the real node's tests all to the same one (tests/conftest.py).
TEST_WORKERS ?= 3
test: deps bins checkov azurite chromium image node-debs lint typecheck
	$(BIN)/pytest -n $(TEST_WORKERS) --no-loadscope-reorder

# Both charts as .tgz in dist/charts, versioned as the image (pyproject's version);
# CHART_REGISTRY=oci://registry.example.com/charts also pushes them (docs/chart.md, "Shipping").
chart-package: bins
	@hack/chart-package.sh dist/charts $(if $(CHART_REGISTRY),--push $(CHART_REGISTRY))

# Only the real node's tests, and the chart's pods on it.
test-real: deps bins image node-debs
	$(BIN)/pytest -m "real or image"

# Debian's containerd, runc, CNI plugins, iptables, conntrack and socat, when missing.
node-debs:
	@hack/install-debs.sh node

# Put back what a real node of a run that died left on the machine (bridge, iptables,
# mounts, cgroups, processes): `make dev-down` and the next start do it too.
node-clean: deps
	$(BIN)/python -m testbed node-clean

unit: deps checkov
	$(BIN)/pytest -m "not kube and not etcd and not stores"

demo: deps bins azurite
	$(BIN)/python -m testbed demo

# REAL_NODE=1: also a real node (root), with the project's images imported.
dev-up: deps bins azurite $(if $(REAL_NODE),image node-debs)
	$(BIN)/python -m testbed up --dir .dev $(if $(REAL_NODE),--real-node)

dev-down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m testbed down --dir .dev; fi
	@rm -f .dev/env .dev/examples.yaml

clean: dev-down
	rm -rf .dev .venv-checkov .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .grimp_cache test-artifacts

# Regenerate the CRDs from o41/kube/api.py, and the chart's copies (tests fail on drift).
crds: deps
	$(BIN)/python -m o41.kube.crd crds/
	cp crds/*.yaml charts/o41-artifacts/crds/
