# Front doors: `make demo`, `make test`, `make bench`. Each installs what it needs first.
PYTHON ?= python3
# The tiers' recipes use bash's PIPESTATUS.
SHELL  := /bin/bash
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Every version comes from the lock: requirements.lock (pip-tools, a sha256 for every distribution,
# torch's CPU wheel included, so no CUDA build can slip in) and constraints.txt, its pins without
# hashes (torch's public version) for the wheelhouse, the images, lint and the audit. `make lock`
# regenerates both.
LOCK   := constraints.txt
HASHED_LOCK := requirements.lock

.PHONY: install demo test test-unit test-slow test-stack bench lint clean lock lock-gpu audit evidence base-image wheelhouse images images-unlocked stack-up stack-down

install: $(STAMP)

# The whole environment from the hashed lock (--require-hashes: a download whose sha256 the lock
# does not list fails the install), then the project itself, editable, without build isolation
# (setuptools and wheel are locked too) and without dependencies (all installed already).
$(STAMP): pyproject.toml $(LOCK) $(HASHED_LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --require-hashes -c $(LOCK) -r $(HASHED_LOCK)
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -c $(LOCK) -e '.[dev]'
	$(BIN)/python -m orchestrator.run.ext_lock --prebuild
	touch $(STAMP)

demo: install
	$(BIN)/qkstudy run jobs/cpu-demo.yaml
	$(BIN)/qkstudy report jobs/cpu-demo.yaml --out runs/cpu-demo/report

# The evidence studies of RESULTS.md (about 7 hours on 2 CPU cores): trains their specs, then
# publishes each store (gzipped SQLite, artifact paths rewritten: orchestrator/track/publish.py)
# and the report built from it under results/. The kernel documentation corpus is Debian's
# linux-doc-6.1 (installed here when missing).
EVIDENCE := cpu-evidence cpu-evidence-mqar-easy cpu-evidence-mqar-medium cpu-mqar-easy cpu-mqar-easy-lr1e-3 cpu-ladder-gated cpu-controls cpu-controls-modern
evidence: install
	test -d /usr/share/doc/linux-doc-6.1/html/_sources || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends linux-doc-6.1; }
	for s in $(EVIDENCE); do \
	  $(BIN)/qkstudy run jobs/$$s.yaml && \
	  $(BIN)/python -m orchestrator.track.publish runs/$$s/mlflow.db results/$$s-mlflow.db.gz && \
	  $(BIN)/qkstudy report jobs/$$s.yaml --out results/$$s --no-log || exit $$?; \
	done

# Three tiers (CONTRIBUTING.md): unit (no Ray, no DeepSpeed, no training, no Docker; a guard in
# tests/fixtures/tiers.py fails a test that starts one), slow (real Ray, DeepSpeed, MLflow), stack (the compose
# stack, loopback multi-node clusters, kill tests). `make test` runs all three in that order,
# every tier even when an earlier one failed, and fails if any did. Each tier writes its
# durations and a JUnit XML under build/test/.
PYTEST  = $(BIN)/python -m pytest -q --timeout=1200 --durations=0
TIERDIR = build/test
# The unit tier runs in worker processes (pytest-xdist), up to 4: its tests wait on leases,
# subprocesses and servers more than they compute (one process used 0.86 of 2 cores).
UNIT_WORKERS ?= auto --maxprocesses 4
test-unit: install
	@mkdir -p $(TIERDIR)
	$(PYTEST) -n $(UNIT_WORKERS) -m "not slow and not stack" --junitxml=$(TIERDIR)/unit.xml tests | tee $(TIERDIR)/unit-durations.txt; exit $${PIPESTATUS[0]}

# The slow and stack tiers run in two pytest-xdist workers (SLOW_WORKERS=0: one process): a
# test that trains spends much of its wall-clock in start-ups that use one core of two (imports,
# a Ray start, about 14 s of Ray Train worker group per trainer). Tests on one shared fixture
# (a trained study, the local Ray, a cluster) stay on one worker, whose chain starts first
# (tests/fixtures/tiers.py: SharedFixtureScheduling). Measured in BENCHMARKS.md.
SLOW_WORKERS ?= 2
test-slow: install
	@mkdir -p $(TIERDIR)
	$(PYTEST) -n $(SLOW_WORKERS) --dist loadgroup -m "slow and not stack" --junitxml=$(TIERDIR)/slow.xml tests | tee $(TIERDIR)/slow-durations.txt; exit $${PIPESTATUS[0]}

test-stack: install
	@mkdir -p $(TIERDIR)
	$(PYTEST) -n $(SLOW_WORKERS) --dist loadgroup -m stack --junitxml=$(TIERDIR)/stack.xml tests | tee $(TIERDIR)/stack-durations.txt; exit $${PIPESTATUS[0]}

test: install
	@rc=0; for t in unit slow stack; do $(MAKE) --no-print-directory test-$$t || rc=1; done; \
	  $(BIN)/python -m tests.tier_summary $(TIERDIR); exit $$rc

bench: install
	$(BIN)/python -m benchmarks.model_steps
	$(BIN)/python -m benchmarks.profile_step --preset cpu-s --variant coupled --threads 1
	$(BIN)/python -m benchmarks.prepare
	$(BIN)/python -m benchmarks.report
	$(BIN)/python -m benchmarks.training --training --startup
	$(BIN)/python -m benchmarks.cli_latency
	$(BIN)/python -m benchmarks.bare_steps
	$(BIN)/python -m benchmarks.whole_run
	$(BIN)/python -m benchmarks.demo
	$(BIN)/python -m benchmarks.diag_spectrum
	$(BIN)/python -m benchmarks.head_memory

clean:
	rm -rf runs .pytest_cache

lint: install
	$(BIN)/python -m pip install -q -c $(LOCK) -r requirements-lint.txt
	$(BIN)/ruff check model data_pipeline orchestrator tests benchmarks
	$(BIN)/ruff format --check model data_pipeline orchestrator tests benchmarks
	$(BIN)/mypy

# The lock, compiled by pip-tools from pyproject.toml (dependencies, server and dev extras) and the
# tool lists requirements-lint.txt, requirements-audit.txt, with this machine's pip configuration
# (pip-compile reads it as pip does: find-links /opt/wheels holds torch's CPU build, so its hash is
# that wheel's). The pins already in requirements.lock are kept; UPGRADE=1 moves every package to
# its newest release the ranges allow, UPGRADE=PKG one package. constraints.txt is then rewritten
# as the lock's pins (its header kept, torch without its +cpu build tag). Needs PyPI.
UPGRADE ?=
lock: install
	$(BIN)/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links \
	  $(if $(filter 1,$(UPGRADE)),--upgrade,$(if $(UPGRADE),--upgrade-package $(UPGRADE))) \
	  --extra server --extra dev -o $(HASHED_LOCK) pyproject.toml requirements-audit.txt requirements-lint.txt
	{ sed -n '1,/^# Regenerate/p' $(LOCK); grep -E '^[A-Za-z0-9]' $(HASHED_LOCK) \
	  | sed -E 's/[ ;].*//; s/^torch==([0-9.]+)\+.*/torch==\1/'; } > $(LOCK).tmp && mv $(LOCK).tmp $(LOCK)

# The GPU image's lock (CUDA torch, nvidia-*, triton with their hashes), for the wheelhouse of
# GPU=1. Runs only where TORCH_INDEX_URL answers (not on the CI machine) and on the images' Python
# (GPU_LOCK_PYTHON, 3.12 on Ubuntu 24.04, Linux x86_64): pip-compile resolves for the interpreter
# that runs it. Pins start from constraints.txt's, so CPU and GPU share every version but torch's
# build (torch==2.13.0 resolves to the index's 2.13.0+cu128); the result, requirements-gpu.lock,
# is to be committed beside requirements.lock, and docker/wheelhouse.sh checks the GPU wheelhouse
# against it.
GPU_LOCK_PYTHON ?= python3.12
GPU_LOCK_VENV   ?= build/lock-gpu-venv
lock-gpu:
	test -x $(GPU_LOCK_VENV)/bin/python || $(GPU_LOCK_PYTHON) -m venv $(GPU_LOCK_VENV)
	$(GPU_LOCK_VENV)/bin/python -m pip install -q -c $(LOCK) pip-tools
	test -f requirements-gpu.lock || grep -v '^#' $(LOCK) > requirements-gpu.lock
	$(GPU_LOCK_VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
	  --no-emit-find-links --extra-index-url $${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu128} \
	  --extra server -o requirements-gpu.lock pyproject.toml

# `make audit`: pip-audit checks every pin of the lock (constraints.txt: requirements.lock's
# versions; torch 2.13.0+cpu is looked up as 2.13.0) against the advisories of AUDIT_SERVICE
# (pypi: PyPI's JSON API, one request per release; osv: osv.dev). --strict: a package it could not
# look up fails the audit as a vulnerability does. A service that does not answer fails first, in
# seconds, naming it (AUDIT_PROBE: a known-vulnerable release, so an answer that lacks advisories
# is caught too); AUDIT_UNREACHABLE=warn (.ci/run) makes that case a warning that nothing was
# audited. AUDIT_REQS audits another pinned list (tests/test_audit.py: the negative control).
AUDIT_SERVICE     ?= pypi
AUDIT_REQS        ?= $(LOCK)
AUDIT_UNREACHABLE ?= fail
AUDIT_PROBE_pypi  := https://pypi.org/pypi/torch/2.5.1/json
AUDIT_PROBE_osv   := https://api.osv.dev/v1/vulns/GHSA-53q9-r3pm-6pq6
AUDIT_PROBE       ?= $(AUDIT_PROBE_$(AUDIT_SERVICE))
audit: install
	@if ! err=$$(curl -fsS --max-time 15 -o /dev/null '$(AUDIT_PROBE)' 2>&1); then \
	  msg="the vulnerability service ($(AUDIT_SERVICE)) does not answer from here ($(AUDIT_PROBE): $$err): $(AUDIT_REQS) was NOT audited"; \
	  if [ "$(AUDIT_UNREACHABLE)" = warn ]; then echo "warning: $$msg" >&2; exit 0; fi; \
	  echo "error: $$msg (AUDIT_SERVICE=osv or pypi picks the other)" >&2; exit 1; \
	fi; \
	$(BIN)/pip-audit --strict --disable-pip --no-deps --progress-spinner off --aliases on --timeout 30 \
	  -s $(AUDIT_SERVICE) -r $(AUDIT_REQS)

# --- Images and the compose stack (docker/README.md) ------------------------------------------
# CPU by default (Debian bookworm from debootstrap, this machine's torch); GPU=1: CUDA base,
# CUDA torch, one GPU worker per host. The legacy builder needs no frontend image (offline).
GPU            ?= 0
IMAGE_TAG      ?= latest
SERVICE_BASE   ?= qkstudy-base:bookworm
export DOCKER_BUILDKIT ?= 0
ifeq ($(GPU),1)
# Pinned by digest (the tag is re-pushed with updates): the multi-platform index digest of that tag
# as public Dockerfiles pin it (not checked against the registry from here: none is reachable;
# a pull verifies the content against it, so a wrong one fails loudly).
BASE_IMAGE     ?= nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04@sha256:ac55d124da4882b497f732d8dfd9a702d5447a5f29d08d56da6f64f0a1eb34bc
DS_ACCELERATOR ?= cuda
TRAIN_WHEELS   ?= build/wheelhouse-gpu
TRAIN_WHEEL_ENV = WHEEL_PYTHON=$${WHEEL_PYTHON:-3.12} TORCH_INDEX_URL=$${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu128}
else
BASE_IMAGE     ?= $(SERVICE_BASE)
DS_ACCELERATOR ?= cpu
TRAIN_WHEELS   ?= build/wheelhouse
TRAIN_WHEEL_ENV =
endif
WHEEL_INPUTS   := pyproject.toml $(LOCK) docker/wheelhouse.sh docker/requirements.py

base-image:
	docker image inspect $(SERVICE_BASE) >/dev/null 2>&1 || docker/base/build-base-image.sh $(SERVICE_BASE)

build/wheelhouse/constraints.txt: $(WHEEL_INPUTS)
	PYTHON=$(BIN)/python WHEELHOUSE=build/wheelhouse docker/wheelhouse.sh

build/wheelhouse-gpu/constraints.txt: $(WHEEL_INPUTS)
	PYTHON=$(BIN)/python WHEELHOUSE=build/wheelhouse-gpu $(TRAIN_WHEEL_ENV) docker/wheelhouse.sh

wheelhouse: install build/wheelhouse/constraints.txt $(TRAIN_WHEELS)/constraints.txt

# One image build at a time (a flock held across the base image, the wheelhouse and the three
# builds): a second `make images` or `make stack-up` waits for the first, then finds the cache
# warm. .ci/run starts one in the background while the unit and slow tiers run (tests/fixtures/tiers.py:
# the stack tier waits for it to end).
IMAGES_LOCK ?= build/images.lock
images:
	mkdir -p $(dir $(IMAGES_LOCK)) && flock $(IMAGES_LOCK) $(MAKE) --no-print-directory images-unlocked

images-unlocked: base-image wheelhouse
	docker build -f docker/postgres.Dockerfile --build-arg BASE_IMAGE=$(SERVICE_BASE) -t qkstudy-postgres:$(IMAGE_TAG) docker/postgres
	docker build -f docker/mlflow.Dockerfile --build-arg BASE_IMAGE=$(SERVICE_BASE) -t qkstudy-mlflow:$(IMAGE_TAG) .
	docker build -f docker/Dockerfile --build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg DS_ACCELERATOR=$(DS_ACCELERATOR) \
	  --build-arg WHEELHOUSE=$(TRAIN_WHEELS) -t qkstudy:$(IMAGE_TAG) .

# ENV_FILE (default docker/.env), WORKERS=N (CPU Ray workers), GPU=1; stack-down keeps the
# volumes, PURGE=1 deletes them (all data): docker/stack.sh.
stack-up: images
	GPU=$(GPU) docker/stack.sh up

stack-down:
	GPU=$(GPU) docker/stack.sh down

# make backup BACKUP_DIR=DIR (stack up): Postgres dump + MLflow artifacts, MLflow users and the
# shared volume; make restore BACKUP_DIR=DIR into a purged or new stack (ENV_FILE as above).
.PHONY: backup restore
backup:
	BACKUP_DIR="$(BACKUP_DIR)" docker/backup.sh backup

restore:
	BACKUP_DIR="$(BACKUP_DIR)" docker/backup.sh restore
