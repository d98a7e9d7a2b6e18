"""A stand-in pipeline for orchestration tests: the real flows/ and bert_core/, a tiny dvc.yaml.

Its stages take a fraction of a second (plus an optional sleep, so two runs surely overlap), write real
outputs atomically, DVC metrics, one MLflow run each (tagged like the real stages) and, for the
``finetune@<task>`` stages, a run in the fine-tuning experiment. It exercises everything the pipeline
flow, the served deployments and the comparison command do, without training a model.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from bert_core.constants import REPO_ROOT

STAGE_MODULE = '''
"""Stand-in stage (tests only): python -m flows.standin <stage> [task]."""

import json
import os
import sys
import time

from prefect import flow

from bert_core.atomic import write_text_atomic
from bert_core.params import StrictModel, load_params
from bert_core.tracking import FINETUNE_EXPERIMENT
from flows._stage import stage as run_stage


class StandinParams(StrictModel):
    size: int = 3
    lr: float = 0.001
    tasks: list[str] = ["a", "b"]
    sleep: float = 0.0
    fail_stage: str = ""


@flow(name="standin")
def standin_flow(stage: str = "prepare", task: str = "") -> dict:
    params = load_params("params/standin.yaml", "standin", StandinParams)
    name = f"{stage}@{task}" if task else stage
    print(f"standin stage {name} starting", flush=True)
    time.sleep(params.sleep)
    if params.fail_stage == name:
        raise RuntimeError(f"stage {name} failed on purpose")
    exp = {"experiment": FINETUNE_EXPERIMENT, "tags": {"task": task, "pretrained_model_version": "standin/1"}}
    suffix = "-" + task if task else ""
    out, metrics_path = f"outputs/{stage}{suffix}.txt", f"metrics/{stage}{suffix}.json"
    with run_stage(stage, params, out, metrics_path=metrics_path, **(exp if task else {})) as s:
        value = params.size * params.lr
        write_text_atomic(s[out], json.dumps({"run": os.environ.get("BERT_PIPELINE_RUN_ID"), "value": value}))
        metrics = {"dev.accuracy": value + len(task) * 0.1} if task else {"value": value}
        s.done(metrics)
    print(f"standin stage {name} done", flush=True)
    return metrics


if __name__ == "__main__":
    standin_flow(*sys.argv[1:])
'''

DVC_YAML = """
stages:
  prepare:
    cmd: python -m flows.standin prepare
    deps: [flows/standin.py]
    params:
      - params/standin.yaml:
          - standin.size
          - standin.sleep
          - standin.fail_stage
    outs: [outputs/prepare.txt]
    metrics:
      - metrics/prepare.json:
          cache: false
  finetune:
    foreach: ${standin.tasks}
    do:
      cmd: python -m flows.standin finetune ${item}
      deps: [outputs/prepare.txt]
      params:
        - params/standin.yaml:
            - standin.lr
            - standin.fail_stage
      outs:
        - outputs/finetune-${item}.txt
      metrics:
        - metrics/finetune-${item}.json:
            cache: false
  evaluate:
    cmd: python -m flows.standin evaluate
    deps: [outputs/finetune-a.txt, outputs/finetune-b.txt]
    outs: [outputs/evaluate.txt]
    metrics:
      - metrics/evaluate.json:
          cache: false
vars:
  - params/standin.yaml:standin
"""

PARAMS = "standin:\n  size: 3\n  lr: 0.001\n  tasks: [a, b]\n  sleep: {sleep}\n  fail_stage: ''\n"

PROFILES = {
    "cpu-small.yaml": "# Stand-in default: the params files as committed.\n{}\n",
    "tiny.yaml": "# Stand-in tiny profile.\nparams/standin.yaml:\n  standin.size: 1\n",
    "big.yaml": "# Stand-in big profile.\nparams/standin.yaml:\n  standin.size: 100\n  standin.lr: 0.01\n",
}


def _run(cmd: list[str], cwd: Path) -> None:
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True, timeout=120)


def make_standin_repo(dest: Path, *, sleep: float = 0.0) -> Path:
    """Create a git + DVC repository at ``dest`` with the stand-in pipeline; return ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for pkg in ("bert_core", "flows"):
        shutil.copytree(REPO_ROOT / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "flows" / "standin.py").write_text(STAGE_MODULE)
    (dest / "params" / "profiles").mkdir(parents=True)
    (dest / "params" / "standin.yaml").write_text(PARAMS.format(sleep=sleep))
    for name, text in PROFILES.items():
        (dest / "params" / "profiles" / name).write_text(text)
    (dest / "dvc.yaml").write_text(DVC_YAML.lstrip())
    (dest / ".gitignore").write_text("__pycache__/\nmlflow.db\n.prefect/\n")
    _run(["git", "init", "-q"], dest)
    _run(["git", "config", "user.email", "test@example.com"], dest)
    _run(["git", "config", "user.name", "test"], dest)
    _run([sys.executable, "-m", "dvc", "init", "-q"], dest)
    _run([sys.executable, "-m", "dvc", "config", "core.autostage", "true"], dest)
    _run(["git", "add", "-A"], dest)
    _run(["git", "commit", "-q", "-m", "stand-in pipeline"], dest)
    return dest
