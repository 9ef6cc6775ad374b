# Front doors: `make demo`, `make test`, `make bench`. Each installs what it needs first.
PYTHON ?= python3
# The tiers' recipes use bash's PIPESTATUS.
SHELL  := /bin/bash
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Every version comes from constraints.txt (the lock; `make lock` regenerates it).
LOCK   := constraints.txt
# CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH_PIN ?= $(shell grep -m1 '^torch==' $(LOCK))

.PHONY: install demo test test-unit test-slow test-stack bench lint clean lock evidence base-image wheelhouse images images-unlocked stack-up stack-down

install: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c $(LOCK) pip
	$(BIN)/python -m pip install -q -c $(LOCK) $(TORCH_PIN)
	$(BIN)/python -m pip install -q -c $(LOCK) -e '.[dev]'
	$(BIN)/python -m orchestrator.run.ext_lock --prebuild
	touch $(STAMP)

demo: install
	$(BIN)/qkstudy run jobs/cpu-demo.yaml
	$(BIN)/qkstudy report jobs/cpu-demo.yaml --out runs/cpu-demo/report

# The evidence study of RESULTS.md (about 90 minutes on 2 CPU cores): trains its three specs, then
# publishes each store (gzipped SQLite, artifact paths rewritten: orchestrator/track/publish.py)
# and the report built from it under results/. The kernel documentation corpus is Debian's
# linux-doc-6.1 (installed here when missing).
EVIDENCE := cpu-evidence cpu-evidence-mqar-easy cpu-evidence-mqar-medium
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

clean:
	rm -rf runs .pytest_cache

lint: install
	$(BIN)/python -m pip install -q -c $(LOCK) -r requirements-lint.txt
	$(BIN)/ruff check model data_pipeline orchestrator tests benchmarks
	$(BIN)/ruff format --check model data_pipeline orchestrator tests benchmarks
	$(BIN)/mypy

# The lock from the venv `make test` passed in (torch without its +cpu/+cuXXX build tag).
lock: install
	{ sed -n '1,/^# Regenerate/p' $(LOCK); $(BIN)/python -m pip freeze --all --exclude-editable \
	  | grep -v '^#' | sed -E 's/^torch==([0-9.]+)\+.*/torch==\1/'; } > $(LOCK).tmp && mv $(LOCK).tmp $(LOCK)

# --- Images and the compose stack (docker/README.md) ------------------------------------------
# CPU by default (Debian bookworm from debootstrap, this machine's torch); GPU=1: CUDA base,
# CUDA torch, one GPU worker per host. The legacy builder needs no frontend image (offline).
GPU            ?= 0
IMAGE_TAG      ?= latest
SERVICE_BASE   ?= qkstudy-base:bookworm
export DOCKER_BUILDKIT ?= 0
ifeq ($(GPU),1)
BASE_IMAGE     ?= nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
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

# ENV_FILE (default docker/.env), WORKERS=N (CPU Ray workers), GPU=1, KEEP_DATA=1: docker/stack.sh.
stack-up: images
	GPU=$(GPU) docker/stack.sh up

stack-down:
	GPU=$(GPU) docker/stack.sh down
