"""bert_core.tracking: the one registration path of the pretrain and finetune stages; the stage run's tags.

Every test runs against its own SQLite MLflow store (the autouse fixture in conftest.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlflow import MlflowClient

from bert_core.tracking import register
from bert_core.tracking import run as tracking_run

#: The two alias policies: pretrain's (always move ``newest``), finetune's (``champion`` on a better score).
POLICIES = {
    "pretrain": {"alias": "newest"},
    "finetune": {"alias": "champion", "metric_key": "dev.accuracy", "value": 50.0},
}


def _run_id() -> str:
    import mlflow

    mlflow.set_experiment("test")
    with mlflow.start_run() as run:
        return run.info.run_id


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The backoff delays of retried tracking calls (recorded, not slept)."""
    delays: list[float] = []
    monkeypatch.setattr(tracking_run.time, "sleep", delays.append)
    return delays


@pytest.mark.parametrize("stage", sorted(POLICIES))
def test_a_registered_model_created_concurrently_is_used(stage, model, sleeps, monkeypatch):
    """Another run creates the registered model between this run's search and its create."""
    real_search = MlflowClient.search_registered_models

    def search_then_lose_the_race(self, *args, **kwargs):
        found = real_search(self, *args, **kwargs)
        if not found:
            MlflowClient().create_registered_model("bert-x", description="created by the other run")
        return found  # still empty: this run goes on to create it as well

    monkeypatch.setattr(MlflowClient, "search_registered_models", search_then_lose_the_race)
    reg = register(model, name="bert-x", run_id=_run_id(), description="mine", **POLICIES[stage])
    assert (reg.version, reg.alias_moved) == ("1", True)
    client = MlflowClient()
    assert client.get_registered_model("bert-x").description == "created by the other run"
    assert str(client.get_model_version_by_alias("bert-x", POLICIES[stage]["alias"]).version) == "1"
    assert sleeps == []  # "already exists" is an answer, not a failure worth retrying


@pytest.mark.parametrize("stage", sorted(POLICIES))
def test_registry_calls_are_retried(stage, model, sleeps, monkeypatch):
    real_create = MlflowClient.create_model_version
    failures = iter([ConnectionError("tracking server unreachable")])

    def flaky_create(self, *args, **kwargs):
        for err in failures:
            raise err
        return real_create(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "create_model_version", flaky_create)
    reg = register(model, name="bert-x", run_id=_run_id(), **POLICIES[stage])
    assert sleeps == [0.5] and (reg.version, reg.alias_moved) == ("1", True)
    assert len(MlflowClient().search_model_versions("name = 'bert-x'")) == 1


def test_pretrain_policy_always_moves_the_alias(model):
    client = MlflowClient()
    tags = {"stage": "pretrain", "steps": 10}
    for expected in ("1", "2"):
        run_id = _run_id()
        reg = register(
            model,
            name="bert-pretrained",
            run_id=run_id,
            alias="newest",
            description="pretrained",
            tags=tags,
            version_description=f"run {expected}",
        )
        assert reg.as_record() == {
            "registered_model": "bert-pretrained",
            "version": int(expected),
            "alias": "newest",
        }
        version = client.get_model_version_by_alias("bert-pretrained", "newest")
        assert str(version.version) == expected and version.run_id == run_id
        assert (
            version.tags == {"stage": "pretrain", "steps": "10"} and version.description == f"run {expected}"
        )
        assert {a.path for a in client.list_artifacts(run_id, "model")} == {"model/config.json"}
    assert client.get_registered_model("bert-pretrained").description == "pretrained"


def test_the_library_stage_run_never_imports_prefect(tmp_path):
    code = (
        "import sys\n"
        "from bert_core.tracking import stage_run\n"
        "with stage_run('unit', {'a': 1}) as run:\n"
        "    run.log_metrics({'x': 1})\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('prefect', 'dvc')], 'prefect or dvc imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_stage_runner_tags_the_prefect_flow_run(monkeypatch, tmp_path):
    import mlflow
    from prefect.runtime import flow_run

    from flows._stage import stage

    def run_id(**tags) -> str:
        with stage("unit", None, metrics_path=tmp_path / "m.json", tags=tags) as s:
            s.done({})
        return s.run.run_id

    monkeypatch.setattr(flow_run, "id", "flow-run-123", raising=False)
    tags = mlflow.get_run(run_id(extra="1")).data.tags
    assert tags["prefect_flow_run_id"] == "flow-run-123" and tags["extra"] == "1" and tags["stage"] == "unit"
    monkeypatch.setattr(flow_run, "id", None)
    assert "prefect_flow_run_id" not in mlflow.get_run(run_id()).data.tags


@pytest.mark.parametrize("stage", sorted(POLICIES))
def test_a_withdrawn_registration_leaves_the_registry_as_it_was(stage, model):
    """A stage that fails to commit its outs after registering takes the version back."""
    client = MlflowClient()
    alias = POLICIES[stage]["alias"]
    first = register(model, name="bert-x", run_id=_run_id(), **POLICIES[stage])
    policy = {**POLICIES[stage], **({"value": 60.0} if "value" in POLICIES[stage] else {})}
    second = register(model, name="bert-x", run_id=_run_id(), **policy)
    assert (second.version, second.alias_moved, second.previous_version) == ("2", True, "1")
    second.withdraw()
    assert [str(v.version) for v in client.search_model_versions("name = 'bert-x'")] == ["1"]
    assert str(client.get_model_version_by_alias("bert-x", alias).version) == first.version
    first.withdraw()  # the alias pointed nowhere before the first version: it is removed
    assert client.search_model_versions("name = 'bert-x'") == []
    assert client.get_registered_model("bert-x").aliases == {}


def test_the_stage_withdraws_its_registrations_when_its_block_fails(model, tmp_path):
    from flows._stage import stage

    out = tmp_path / "stage-out"
    with (
        pytest.raises(OSError, match="disk full"),
        stage("demo", {}, out, metrics_path=tmp_path / "m.json") as s,
    ):
        s.registered(register(model, name="bert-pretrained", run_id=s.run.run_id, alias="newest"))
        raise OSError("disk full while committing")
    assert MlflowClient().search_model_versions("name = 'bert-pretrained'") == []
    assert not out.exists()
    with stage("demo", {}, out, metrics_path=tmp_path / "m.json") as s:
        s[out].mkdir()
        s.registered(register(model, name="bert-pretrained", run_id=s.run.run_id, alias="newest"))
        s.done({"steps": 1})
    assert len(MlflowClient().search_model_versions("name = 'bert-pretrained'")) == 1
    assert out.is_dir() and (tmp_path / "m.json").read_text().strip().startswith("{")
