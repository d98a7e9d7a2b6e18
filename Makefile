# Single entry point for humans and CI. Every target creates .venv when it is missing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch==2.13.0: the local CPU wheel on the dev/CI machines, the CUDA build from PyPI on a GPU Linux
# machine. Another build: make TORCH_SPEC="torch==2.13.0" PIP_TORCH_ARGS="--index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
PIP_TORCH_ARGS ?=
export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DVC_NO_ANALYTICS := 1
export PYTHONUNBUFFERED := 1

.PHONY: venv test test-slow lint format bench clean

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_TORCH_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

test: venv
	$(PY) -m pytest -q

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
