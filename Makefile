# Two commands do everything on a fresh machine: `make repro` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help install repro test test-fast benchmarks clean-pipeline

help:
	@echo "make repro   set up .venv and run the whole DVC pipeline (params.yaml)"
	@echo "make test    set up .venv and run the test suite"

# torch==2.13.0 first: its CPU wheel lies on this disk, while the range in pyproject alone
# would make pip fetch a 5.5 GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# DVC needs a repository; a fresh clone has .dvc/ committed, so `dvc repro` runs the DAG in dvc.yaml.
repro: $(STAMP)
	$(BIN)/dvc repro
	@echo; cat reports/table1.md

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

benchmarks: $(STAMP)
	$(BIN)/python benchmarks/train_throughput.py
