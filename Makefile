# Front doors: `make demo`, `make test`, `make bench`. Each installs what it needs first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: install demo test test-fast bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_PIN)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: install
	$(BIN)/qkstudy run jobs/cpu-demo.yaml
	$(BIN)/qkstudy report jobs/cpu-demo.yaml --out runs/cpu-demo/report

test: install
	$(BIN)/python -m pytest -q --timeout=1200 tests

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow" tests

bench: install
	$(BIN)/python -m model.bench
	$(BIN)/python -m data_pipeline.bench
	$(BIN)/python -m orchestrator.report.bench
	$(BIN)/python -m orchestrator.bench --training --startup

clean:
	rm -rf runs .pytest_cache

lint: install
	$(BIN)/python -m pip install -q -r requirements-lint.txt
	$(BIN)/ruff check model data_pipeline orchestrator tests
	$(BIN)/mypy
