# Two commands do everything on a fresh machine: `make repro` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help install repro test test-fast lint benchmarks clean-pipeline

help:
	@echo "make repro   set up .venv and run the whole DVC pipeline (params.yaml)"
	@echo "make test    set up .venv and run the test suite"
	@echo "make lint    ruff's lint and format checks (CI runs them before the tests)"
	@echo "make paper-table1 [PAPER_WORK=build/paper_scale]  Table 1 at the paper's size (380k outfits, 30k articles;"
	@echo "             studies/paper_scale/: its recipe, one training at a time, resumable, an ETA as it goes)"

# torch==2.13.0 first: its CPU wheel lies on this disk, while the range in pyproject alone
# would make pip fetch a 5.5 GB CUDA build.
# pip byte-compiles what it installs one file at a time: --no-compile, then compileall on every core
# (its status ignored, as pip ignores it: a few packages ship files of another Python's syntax).
# pip's own messages go to $(VENV)/install.log (its end is printed when an install fails).
$(STAMP): pyproject.toml
	@echo "installing into $(VENV) (log: $(VENV)/install.log)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@( $(BIN)/pip install --quiet --upgrade pip && $(BIN)/pip install --quiet --no-compile torch==2.13.0 && \
	   $(BIN)/pip install --quiet --no-compile -e '.[test,postgres]' ) > $(VENV)/install.log 2>&1 || \
	   { tail -n 30 $(VENV)/install.log; exit 1; }
	@$(BIN)/python -m compileall -q -j 0 $(VENV)/lib >> $(VENV)/install.log 2>&1 || true
	@touch $(STAMP)

install: $(STAMP)

# The stages call `contextual-bert`, so the venv's bin goes first on PATH (as `source .venv/bin/activate`).
# `dvc repro` runs one stage at a time; flows/repro.py runs the same stages through the pipeline flow,
# the trainings one per core in parallel (same dvc.lock; afterwards `dvc repro` has nothing to do).
repro: $(STAMP)
	@PATH="$(CURDIR)/$(BIN):$$PATH" PREFECT_HOME=$(PREFECT_HOME) $(BIN)/python -m flows.repro
	@echo; cat reports/table1.md

test: $(STAMP)
	$(BIN)/python -m pytest -q

# ruff (pyproject.toml's [tool.ruff]): the lint and the format, checked; `ruff format .` formats.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

benchmarks: $(STAMP)
	$(BIN)/python benchmarks/train_throughput.py

# Table 1 at the paper's size: studies/paper_scale/settings.yaml's recipe and runs; a run killed goes on from its
# last.pt when this is run again, a run done is skipped. On a CUDA machine it trains there (train.device: auto);
# GPU workers behind Prefect: docs/scaling.md (make prefect-pools GPUS="0 1").
PAPER_WORK ?= build/paper_scale
.PHONY: paper-table1
paper-table1: $(STAMP)
	@PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python studies/paper_scale/paper_scale.py --work $(PAPER_WORK)

# --- Prefect: server, pools, deployments, workers (flows/, prefect.yaml, docs/scaling.md) -----------
# The server keeps its SQLite database under PREFECT_HOME (.prefect/ here, ignored by git); for
# PostgreSQL set PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://user:pass@host:5432/prefect.
# Parallel trainings log through one MLflow server: start workers with MLFLOW_TRACKING_URI=http://...
PREFECT_PORT ?= 4200
PREFECT_HOME ?= $(CURDIR)/.prefect
PREFECT_API_URL ?= http://127.0.0.1:$(PREFECT_PORT)/api
GPUS ?=
CPU_TRAININGS ?= 2
POOL ?= cpu
QUEUE ?=
# The server's analytics off too: `prefect server start` does not import the package (contextual_bert.analytics).
PREFECT_ENV = PREFECT_HOME=$(PREFECT_HOME) PREFECT_API_URL=$(PREFECT_API_URL) PREFECT_SERVER_ANALYTICS_ENABLED=false

.PHONY: prefect-help prefect-server prefect-pools prefect-deploy prefect-worker prefect-ui prefect-run

prefect-help:
	@echo "make prefect-server                 Prefect server on 127.0.0.1:$(PREFECT_PORT) (SQLite in $(PREFECT_HOME)), auth string required"
	@echo "make prefect-pools [GPUS='0 1']     work pools cpu and gpu, slots train-cpu and gpu-<i>"
	@echo "make prefect-deploy                 pools, then prefect deploy --all (prefect.yaml)"
	@echo "make prefect-worker [POOL=gpu] [QUEUE=default|pipeline]  a process worker on the cpu (or gpu) pool"
	@echo "make prefect-ui                     open the Prefect UI"
	@echo "make prefect-run [SIZE=tiny] [FAN_OUT=remote] [REGISTRY=false]  run the nightly pipeline deployment now"
	@echo "make stack-up [WORKERS=2]           PostgreSQL, Prefect + MLflow servers on it, workers (.stack/)"
	@echo "make stack-status | stack-down      what runs / stop it all"
	@echo "make stack-rotate                   new secrets for every role, everything restarted"
	@echo "eval \"\$$(make -s stack-env AS=promoter)\"  URLs and credentials of a stack client (trainer|promoter|admin)"

# With the auth string of $(STACK_DIR)/credentials.env (made if missing), telemetry off; the profile it writes
# in $(PREFECT_HOME) (0600) gives the string to the targets below, which share that PREFECT_HOME.
prefect-server: $(STAMP)
	$(BIN)/python -m flows.infra.stack prefect-server --prefect-home $(PREFECT_HOME) --dir $(STACK_DIR) --port $(PREFECT_PORT)

prefect-pools: $(STAMP)
	$(PREFECT_ENV) $(BIN)/python -m flows.infra.work_pools --gpus "$(GPUS)" --cpu-trainings $(CPU_TRAININGS)

prefect-deploy: prefect-pools
	$(PREFECT_ENV) $(BIN)/prefect --no-prompt deploy --all

prefect-worker: $(STAMP)
	$(PREFECT_ENV) $(BIN)/prefect worker start --pool $(POOL) $(if $(QUEUE),--work-queue $(QUEUE))

prefect-ui:
	@echo "Prefect UI: http://127.0.0.1:$(PREFECT_PORT)"
	@-xdg-open "http://127.0.0.1:$(PREFECT_PORT)" >/dev/null 2>&1 || true

prefect-run: $(STAMP)
	$(PREFECT_ENV) $(BIN)/prefect deployment run pipeline/nightly $(if $(SIZE),--param size=$(SIZE)) $(if $(FAN_OUT),--param fan_out=$(FAN_OUT)) $(if $(REGISTRY),--param registry=$(REGISTRY))

# --- the whole stack on one machine, no compose (flows/infra/stack.py, docs/scaling.md) -------------------
# PostgreSQL (Debian's postgresql package), Prefect and MLflow servers on it, a DVC remote directory,
# WORKERS process workers in $(STACK_DIR)/worker-<i>. After `make stack-up`, `eval "$$(make -s stack-env)"`
# exports the URLs and credentials; then `make prefect-deploy` and `make prefect-run SIZE=tiny FAN_OUT=remote
# REGISTRY=false` (the workers are `trainer`: register and promote run as the promoter, docs/security.md).
# Secure by default: secrets in $(STACK_DIR)/credentials.env (0600), every server authenticates, both
# bound to STACK_HOST (loopback unless named). A client's environment: eval "$$(make -s stack-env AS=promoter)".
STACK_DIR ?= $(CURDIR)/.stack
WORKERS ?= 2
STACK_HOST ?= 127.0.0.1
AS ?= trainer

.PHONY: stack-up stack-down stack-status stack-env stack-rotate

stack-up: $(STAMP)
	$(BIN)/python -m flows.infra.stack up --dir $(STACK_DIR) --workers $(WORKERS) --host $(STACK_HOST)

stack-env:
	@$(BIN)/python -m flows.infra.stack env --dir $(STACK_DIR) --as $(AS)

stack-down:
	$(BIN)/python -m flows.infra.stack down --dir $(STACK_DIR)

stack-status:
	$(BIN)/python -m flows.infra.stack status --dir $(STACK_DIR)

stack-rotate:
	$(BIN)/python -m flows.infra.stack rotate --dir $(STACK_DIR)
