"""The shared stage infrastructure: atomic outputs, typed params, data checks, the MLflow stage run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import great_expectations as gx
import pandas as pd
import pytest
from pydantic import Field

from bert_core.atomic import atomic_path, clean_stale_temps, write_json_atomic
from bert_core.checks import Check, DataCheckError, validate
from bert_core.params import ParamsError, StrictModel, load_params
from bert_core.sources import data_root


class _P(StrictModel):
    lr: float = Field(1e-4, gt=0)
    steps: int = 10


def test_atomic_dir_replaced_only_on_success(tmp_path):
    final = tmp_path / "out"
    with atomic_path(final, is_dir=True) as tmp:
        (tmp / "a.txt").write_text("v1")
    assert (final / "a.txt").read_text() == "v1"
    with pytest.raises(RuntimeError), atomic_path(final, is_dir=True) as tmp:
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("crash")
    assert (final / "a.txt").read_text() == "v1"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_file_survives_sigkill(tmp_path):
    final = tmp_path / "f.json"
    write_json_atomic(final, {"v": 1})
    code = (
        "import os, signal; from bert_core.atomic import atomic_path\n"
        f"with atomic_path({str(final)!r}) as t:\n"
        "    open(t, 'w').write('{\"v\": 2, \"half')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=os.getcwd())
    assert proc.returncode == -9
    assert json.loads(final.read_text()) == {"v": 1}
    assert len(clean_stale_temps(tmp_path)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_a_temporary_goes_once_its_writer_is_gone_killed_unreaped_or_its_number_reused(tmp_path, monkeypatch):
    """A killed writer may not be reaped yet, or its number may belong to another process by the time its
    output is written again: a zombie, or a process started after the temporary last changed, is not its
    writer; one that started before may be, and its temporary stays, as does an ``old-`` sibling whose
    number lives."""
    import time

    import psutil

    from bert_core import atomic

    host, slack = atomic._OWNER.rsplit("_", 1)[0], atomic._START_SLACK_S
    live = tmp_path / f".out.tmp-{host}_{os.getpid()}-abc"
    old = tmp_path / f".out.tmp-old-{host}_{os.getpid()}"
    for path in (live, old):
        path.mkdir()
    assert not atomic.writer_gone(os.getpid(), live)  # this process, started before the temporary
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not atomic.writer_gone(sleeper.pid, live)  # started within the slack: may be the writer
        monkeypatch.setattr(atomic, "_START_SLACK_S", -time.time())  # as if it started long after
        assert atomic.writer_gone(sleeper.pid, live)
        assert not atomic.writer_gone(sleeper.pid, old)  # a renamed output is judged by the number alone
        monkeypatch.setattr(atomic, "_START_SLACK_S", slack)
        sleeper.kill()  # and not reaped yet
        deadline = time.monotonic() + 10
        while psutil.Process(sleeper.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert atomic.writer_gone(sleeper.pid, live)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert atomic.writer_gone(sleeper.pid, live)  # no such process
    dead = tmp_path / f".out.tmp-{host}_{sleeper.pid}-def"
    dead.mkdir()
    with atomic_path(tmp_path / "out", is_dir=True) as tmp:  # the next write of the output
        (tmp / "a").write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", live.name, old.name])


def test_params_errors_name_file_key_and_value(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("train:\n  lr: -1\n  stepz: 3\n")
    with pytest.raises(ParamsError) as err:
        load_params(f, "train", _P)
    msg = str(err.value)
    assert str(f) in msg and "'train.lr' = -1" in msg and "greater than 0" in msg
    assert "unknown key 'train.stepz'" in msg
    f.write_text("train: [1, 2\n")  # one line, where the problem and its context are (not PyYAML's picture)
    with pytest.raises(ParamsError) as err:
        load_params(f, "train", _P)
    assert str(err.value).endswith(
        "p.yaml:2:1: not valid YAML: while parsing a flow sequence (from 1:8): expected ',' or ']', but got "
        "'<stream end>'"
    )
    with pytest.raises(ParamsError, match="a directory, not a params file"):
        load_params(f.parent, "train", _P)
    f.write_text("other: {}\n")
    with pytest.raises(ParamsError, match="missing top-level section 'train'"):
        load_params(f, "train", _P)
    f.write_text("train: {lr: 0.1}\n")
    assert load_params(f, "train", _P) == _P(lr=0.1, steps=10)


def test_data_root(monkeypatch, tmp_path):
    monkeypatch.delenv("BERT_DATA_ROOT", raising=False)
    assert data_root() is None
    monkeypatch.setenv("BERT_DATA_ROOT", str(tmp_path))
    assert data_root() == tmp_path.resolve()
    monkeypatch.setenv("BERT_DATA_ROOT", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="BERT_DATA_ROOT"):
        data_root()


def test_checks_report_and_critical_failure(tmp_path):
    df = pd.DataFrame({"a": [1, 2, 3, None]})
    report = validate(
        df,
        "demo",
        [
            Check(gx.expectations.ExpectColumnValuesToNotBeNull(column="a")),
            Check(
                gx.expectations.ExpectColumnValuesToBeBetween(column="a", min_value=0, max_value=2),
                critical=False,
            ),
        ],
        report_dir=tmp_path / "report",
    )
    assert not report.success and len(report.failed) == 2 and len(report.failed_critical) == 1
    assert (tmp_path / "report" / "index.html").exists()
    with pytest.raises(DataCheckError, match="expect_column_values_to_not_be_null"):
        report.raise_for_critical()
    ok = validate(df.dropna(), "demo", [Check(gx.expectations.ExpectColumnValuesToNotBeNull(column="a"))])
    ok.raise_for_critical()


def test_stage_run_logs_to_mlflow(tmp_path):
    import mlflow

    from flows._stage import stage

    with stage("unit", _P(), metrics_path=tmp_path / "m.json", tags={"extra": "1"}) as s:
        s.done({"a": 1, "nested": {"b": 2.5}, "text": "x"})
    got = mlflow.get_run(s.run.run_id)
    assert got.info.status == "FINISHED"
    assert got.data.metrics == {"a": 1.0, "nested.b": 2.5}
    assert got.data.params["lr"] == "0.0001"
    assert got.data.tags["stage"] == "unit" and got.data.tags["extra"] == "1"
    assert json.loads((tmp_path / "m.json").read_text())["nested"]["b"] == 2.5
    with pytest.raises(ValueError), stage("unit", None, metrics_path=tmp_path / "m.json") as failed:
        raise ValueError("boom")
    assert mlflow.get_run(failed.run.run_id).info.status == "FAILED"


def test_a_path_is_named_relative_to_the_repository_only_when_inside_it(tmp_path, monkeypatch):
    from bert_core.constants import REPO_ROOT, repo_relative

    assert repo_relative(REPO_ROOT / "models" / "finetuned" / "sst2") == "models/finetuned/sst2"
    monkeypatch.chdir(REPO_ROOT / "flows")
    assert repo_relative("../results/finetune") == "results/finetune"  # relative to the working directory
    assert repo_relative(tmp_path / "out") == str(tmp_path / "out")  # elsewhere: as given
    link = tmp_path / "checkout"
    link.symlink_to(REPO_ROOT)
    assert repo_relative(link / "metrics" / "vocab.json") == "metrics/vocab.json"
