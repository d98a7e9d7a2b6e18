"""The champion alias as a compare-and-set (``bert_core.tracking.registry``): the lock and the verify rounds.

The race itself (processes registering at the same moment against one store) is in
``tests/faults/test_registry_race.py``; these are the cheap parts, with a fake registry client.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from bert_core.tracking import registry


def test_the_lock_of_a_sqlite_store_lies_next_to_it_and_others_in_the_temp_dir(tmp_path):
    path = registry.alias_lock_path("bert-sst2", f"sqlite:///{tmp_path}/mlflow.db")
    assert path.parent == tmp_path / ".mlflow.db.locks" and path.name.startswith("bert-sst2-")
    other = registry.alias_lock_path("bert-sst2", "http://127.0.0.1:5000")
    assert other.name.startswith("bert-registry-bert-sst2-") and other.parent != tmp_path / ".mlflow.db.locks"
    assert registry.alias_lock_path("bert-mnli", f"sqlite:///{tmp_path}/mlflow.db") != path


def test_a_held_lock_makes_the_other_run_wait_and_then_fail_naming_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with registry.alias_lock("bert-sst2"):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(10)
        with (
            pytest.raises(registry.AliasLockTimeout, match=r"'bert-sst2'.*alias lock .*mlflow\.db\.locks"),
            registry.alias_lock("bert-sst2", timeout_s=0.2),
        ):
            pass
        with registry.alias_lock("bert-mnli", timeout_s=0.2):  # another model: not blocked
            pass
    finally:
        release.set()
        thread.join()
    with registry.alias_lock("bert-sst2", timeout_s=0.2):
        pass


class _Registry:
    """Just enough of ``MlflowClient`` for the alias: versions with a score, one alias, a meddling writer."""

    def __init__(self, scores: dict[str, float], alias: str | None, meddle: list[str]) -> None:
        self.scores, self.alias, self.meddle, self.sets = scores, alias, meddle, []

    def get_registered_model(self, name):
        return SimpleNamespace(aliases={} if self.alias is None else {"champion": self.alias})

    def get_model_version(self, name, version):
        return SimpleNamespace(tags={"dev.score": repr(self.scores[version])})

    def set_registered_model_alias(self, name, alias, version):
        self.sets.append(version)
        self.alias = version
        if self.meddle:  # another host's writer, which no lock reached, sets its version right after
            self.alias = self.meddle.pop(0)


@pytest.fixture(autouse=True)
def _store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")


def test_a_better_version_set_in_between_wins_and_this_run_reports_no_move():
    client = _Registry({"1": 50.0, "2": 60.0, "3": 90.0}, alias="1", meddle=["3"])
    moved, previous, value = registry._move_if_better(client, "m", "champion", "2", "dev.score", 60.0)
    assert (moved, previous, value) == (False, "3", 90.0) and client.alias == "3" and client.sets == ["2"]


def test_a_worse_version_set_in_between_is_replaced_again():
    client = _Registry({"1": 50.0, "2": 60.0, "3": 55.0}, alias="1", meddle=["3"])
    moved, previous, value = registry._move_if_better(client, "m", "champion", "2", "dev.score", 60.0)
    assert (moved, previous, value) == (True, "3", 55.0) and client.alias == "2" and client.sets == ["2", "2"]


def test_an_alias_that_never_settles_is_an_error_naming_it():
    client = _Registry({"1": 50.0, "2": 60.0, "3": 55.0}, alias="1", meddle=["3"] * 10)
    with pytest.raises(RuntimeError, match="alias 'champion' kept changing"):
        registry._move_if_better(client, "m", "champion", "2", "dev.score", 60.0)


def test_no_alias_yet_and_no_meddling():
    client = _Registry({"1": 50.0}, alias=None, meddle=[])
    assert registry._move_if_better(client, "m", "champion", "1", "dev.score", 50.0) == (True, None, None)


def test_withdrawing_puts_the_alias_back_only_while_it_points_at_the_withdrawn_version(tmp_path):
    import mlflow
    from mlflow import MlflowClient

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    mlflow.set_experiment("withdraw")

    def reg(value: float) -> registry.Registration:
        with mlflow.start_run() as run:
            pass
        return registry.register(
            model, name="m", run_id=run.info.run_id, alias="champion", metric_key="dev.score", value=value
        )

    client = MlflowClient()
    first, second = reg(50.0), reg(60.0)
    first.withdraw()  # a better run moved the alias meanwhile: its move stays
    assert str(client.get_model_version_by_alias("m", "champion").version) == second.version
    third = reg(70.0)
    third.withdraw()  # still on the withdrawn version: back to the one before
    assert str(client.get_model_version_by_alias("m", "champion").version) == second.version
    assert {str(v.version) for v in client.search_model_versions("name = 'm'")} == {second.version}
