"""The ``evaluate`` stage refuses summaries that do not belong where they lie, through its real entry point.

Another task's ``summary.json`` copied into ``results/finetune/rte/`` used to give exit 0, RTE silently
missing from the report and a GLUE average over 4 tasks instead of 5. Now ``python -m flows.evaluate``
exits 1 with one line naming the file, the task it holds and the stage to re-run, and writes nothing (no
metrics, no report). The library-level cases (kind, main metric, provenance, bounded messages) are in
``tests/test_evaluate.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from bert_core.finetune.results import FinetuneResult, TrialResult
from bert_core.tasks import get_task

from .conftest import PY, REPO_ROOT, run_cmd, stage_env

pytestmark = pytest.mark.faults

TASKS = ("cola", "mrpc", "rte", "sst2", "stsb")
MODEL = {
    "source": "models/pretrained",
    "uri": "models/pretrained",
    "sha": "0123456789abcdef",
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "preset": "tiny",
}


def _summary(task: str) -> dict:
    spec = get_task(task)
    dev = {spec.main_metric: 60.0 + TASKS.index(task)}
    trial = TrialResult(
        "pretrained",
        1e-4,
        1,
        dev,
        evals=[{"step": 1, "epoch": 1.0, **dev}],
        history=[{"step": 1, "epoch": 1.0, "loss": 0.5, "learning_rate": 1e-4}],
    )
    return FinetuneResult(task, spec.kind, spec.main_metric, dict(MODEL), [trial]).to_json()


@pytest.fixture
def case(tmp_path: Path, prefect_api: str):
    """Five summaries, the params that point evaluate at them, an empty working directory, the env."""
    results = tmp_path / "results" / "finetune"
    for task in TASKS:
        (results / task).mkdir(parents=True)
        (results / task / "summary.json").write_text(json.dumps(_summary(task)))
    work = tmp_path / "work"
    work.mkdir()
    evaluate = tmp_path / "evaluate.yaml"
    evaluate.write_text(
        yaml.safe_dump({"evaluate": {"results_dir": str(results), "report_dir": str(work / "reports")}})
    )
    finetune = yaml.safe_load((REPO_ROOT / "params" / "finetune.yaml").read_text())
    finetune["finetune"]["tasks"] = {t: {} for t in TASKS}
    finetune_file = tmp_path / "finetune.yaml"
    finetune_file.write_text(yaml.safe_dump(finetune, sort_keys=False))
    # PYTHONPATH: this checkout's code, not whichever one the venv's editable install points at
    env = stage_env(prefect_api, f"sqlite:///{tmp_path}/mlflow.db", PYTHONPATH=str(REPO_ROOT))
    args = [
        PY,
        "-m",
        "flows.evaluate",
        "--params",
        str(evaluate),
        "--finetune-params",
        str(finetune_file),
        "--metrics",
        "metrics.json",
    ]
    return results, work, env, args


def _refused(res, rte: Path) -> None:
    assert res.returncode == 1, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    line = [ln for ln in res.stderr.splitlines() if "evaluate stage failed" in ln]
    assert line, res.stderr[-3000:]
    assert f"{rte} is the summary of task 'mrpc', not 'rte'" in line[-1]
    assert "re-run `dvc repro finetune@rte`" in line[-1] and len(line[-1]) < 2000


def _snapshot(work: Path) -> dict[str, bytes]:
    return {str(p.relative_to(work)): p.read_bytes() for p in sorted(work.rglob("*")) if p.is_file()}


def test_another_tasks_summary_in_rte_is_refused_by_name_and_nothing_is_written(case):
    results, work, env, args = case
    rte = results / "rte" / "summary.json"
    good = rte.read_bytes()
    rte.write_bytes((results / "mrpc" / "summary.json").read_bytes())

    _refused(run_cmd(args, cwd=work, env=env, timeout=300), rte)
    assert not list(work.iterdir()), f"left behind: {sorted(p.name for p in work.iterdir())}"

    # the named stage re-run (here: its summary put back): the same command reports all 5 tasks
    rte.write_bytes(good)
    res = run_cmd(args, cwd=work, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rte.accuracy" in json.loads((work / "metrics.json").read_text())  # the headline
    metrics = json.loads((work / "details" / "metrics.json").read_text())  # every statistic
    assert metrics["tasks"] == 5 and metrics["glue.tasks"] == 5 and "rte.accuracy" in metrics
    assert "| rte | accuracy |" in re.sub(r" {2,}", " ", (work / "reports" / "evaluate.md").read_text())

    # a later mismatch leaves that report and its metrics exactly as they were
    before = _snapshot(work)
    rte.write_bytes((results / "mrpc" / "summary.json").read_bytes())
    _refused(run_cmd(args, cwd=work, env=env, timeout=300), rte)
    assert _snapshot(work) == before
