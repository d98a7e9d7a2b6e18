"""The pipeline flow's logic with a scripted DVC: stage tasks, outcomes, artifacts, overrides, the lock."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from flows import _driver, _dvc, _inputs, overrides, pipeline, profiles


def _git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@e", "-c", "user.name=t", *args], cwd=root, check=True, capture_output=True
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A committed repo with pretrain/finetune params as the form fields expect (valid for their stages:
    the flow checks the overridden files before DVC runs), and two profiles."""
    (tmp_path / "params" / "profiles").mkdir(parents=True)
    (tmp_path / "params" / "pretrain.yaml").write_text(
        "pretrain:\n  model: {preset: tiny}\n  max_steps: 100\n  time_budget_minutes: null\n"
        "  phases: [{name: seq128, share: 1.0, micro_batch: 8, global_batch: 8, lr: 1.0e-4}]\n"
    )
    (tmp_path / "params" / "finetune.yaml").write_text(
        "finetune:\n  defaults: {learning_rates: [5.0e-5], seeds: [1]}\n  small_task_seeds: [1, 2]\n"
        "  tasks:\n    sst2: {train_limit: 100}\n    rte: {learning_rates: [1.0e-5], train_limit: 50}\n"
    )
    (tmp_path / "params" / "profiles" / "cpu-small.yaml").write_text("{}\n")
    (tmp_path / "params" / "profiles" / "tiny.yaml").write_text(
        "params/pretrain.yaml:\n  pretrain.max_steps: 5\nparams/finetune.yaml:\n  finetune.tasks.sst2.train_limit: 10\n"
    )
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "init")
    return tmp_path


# ------------------------------------------------------------------------------------ pure logic


@pytest.mark.parametrize(
    ("line", "kind", "stage"),
    [
        ("Running stage 'finetune@sst2':", "running", "finetune@sst2"),
        ("Stage 'vocab' didn't change, skipping", "skipped", "vocab"),
        ("Stage 'corpus' is cached - skipping run, checking out outputs", "skipped", "corpus"),
        ("ERROR: failed to reproduce 'pretrain': exit code 1", "failed", "pretrain"),
        ("> exec python -m flows.corpus", "line", None),
        ("Updating lock file 'dvc.lock'", "line", None),
    ],
)
def test_dvc_lines_are_classified(line, kind, stage):
    event = _dvc.parse_line(line)
    assert (event.kind, event.stage) == (kind, stage)


def test_form_fields_become_overrides(repo, monkeypatch):
    resolved = []
    real_resolve = _inputs.profiles.resolve
    monkeypatch.setattr(
        _inputs.profiles, "resolve", lambda *a, **k: resolved.append(a) or real_resolve(*a, **k)
    )
    fields = {
        "preset": "base",
        "pretrain_steps": None,
        "tasks": ["rte", "mrpc"],
        "learning_rates": [3e-5, 2e-5],
    }
    inputs = _inputs.run_inputs("tiny", fields, ["params/finetune.yaml:finetune.defaults.seeds=[7]"], repo)
    overrides = inputs.overrides
    assert inputs.targets == []  # the profile names none: the whole pipeline
    assert len(resolved) == 1  # the profile is resolved once, the form's task list included
    assert overrides["params/pretrain.yaml"] == {"pretrain.max_steps": 5, "pretrain.model.preset": "base"}
    fine = overrides["params/finetune.yaml"]
    # The chosen tasks keep the profile's settings, minus their own learning rates (the form's grid holds).
    assert fine["finetune.tasks"] == {"rte": {"train_limit": 50}, "mrpc": {}}
    assert fine["finetune.defaults.learning_rates"] == [3e-5, 2e-5]
    assert fine["finetune.defaults.seeds"] == [7]
    # tasks not chosen: the profile's task settings come through unchanged.
    only_tiny = _inputs.run_inputs("tiny", {}, [], repo).overrides
    assert only_tiny == {
        "params/pretrain.yaml": {"pretrain.max_steps": 5},
        "params/finetune.yaml": {"finetune.tasks.sst2.train_limit": 10},
    }
    assert _inputs.run_inputs(None, {}, [], repo) == _inputs.RunInputs({}, [])


def test_every_form_field_maps_to_a_real_params_key():
    """The form's keys exist in the repository's params files (once the stage's params file exists)."""
    missing_files = []
    for field, targets in _inputs.FORM_KEYS.items():
        assert field in pipeline.pipeline_flow.parameters.properties
        for file, key in targets:
            path = pipeline.REPO_ROOT / file
            if not path.is_file():
                missing_files.append(file)
                continue
            params = profiles.read_params_file(file, pipeline.REPO_ROOT)
            assert overrides.has_key(params, key), f"form field {field}: {file} has no key {key}"
    if missing_files:
        pytest.skip(f"params files not written yet: {sorted(set(missing_files))}")


def test_dvc_command():
    over = {"params/x.yaml": {"x.a": 1}}
    assert _inputs.dvc_command(
        as_experiment=True, exp_name="e1", overrides=over, targets=["vocab"], force=True
    ) == [
        "exp",
        "run",
        "--name",
        "e1",
        "-S",
        "params/x.yaml:x.a=1",
        "--force",
        "vocab",
    ]
    assert _inputs.dvc_command(
        as_experiment=False, exp_name=None, overrides=over, targets=[], force=False
    ) == ["repro"]


def test_stage_env(repo, monkeypatch, tmp_path):
    monkeypatch.setenv("BERT_DATA_ROOT", "relative/data")
    env = _inputs.stage_env("rid", None, repo)
    assert env["BERT_PIPELINE_RUN_ID"] == "rid"
    assert env["BERT_DATA_ROOT"] == str((repo / "relative/data").resolve())
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert "BERT_DATA_ROOT" not in _inputs.stage_env("rid", "hub", repo)
    assert _inputs.stage_env("rid", str(tmp_path), repo)["BERT_DATA_ROOT"] == str(tmp_path)
    with pytest.raises(ValueError, match="is not a directory"):
        _inputs.stage_env("rid", "/no/such/dir", repo)


class _FakeServer:
    """Stands in for Prefect's temporary server (``flows._prefect_api._temporary_server_class``)."""

    started: ClassVar[list[_FakeServer]] = []

    def __init__(self, port: int) -> None:
        self.api_url = f"http://127.0.0.1:{port}/api"
        self.running = False

    def start(self) -> None:
        self.running = True
        self.started.append(self)

    def stop(self) -> None:
        self.running = False


def test_one_prefect_api_for_the_pipeline_and_every_stage_it_runs(repo, monkeypatch, tmp_path):
    """The pipeline's command starts one temporary server and hands its URL to DVC's environment, so every
    stage command reports there (a stage given PREFECT_API_URL starts no server of its own)."""
    from flows import _prefect_api

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(_prefect_api, "_temporary_server_class", lambda: _FakeServer)
    monkeypatch.setattr(_prefect_api, "check_api", lambda url, **_: None)  # the fake does not answer
    _FakeServer.started.clear()
    with _prefect_api.prefect_api(home=tmp_path) as url:  # no `make serve` lock in this home
        assert _FakeServer.started and _FakeServer.started[0].api_url == url
        env = _inputs.stage_env("rid", None, repo)
        assert env["PREFECT_API_URL"] == url
        monkeypatch.setenv("PREFECT_API_URL", env["PREFECT_API_URL"])  # what a stage command sees
        with _prefect_api.prefect_api(home=tmp_path) as stage_url:
            assert stage_url == url
        monkeypatch.delenv("PREFECT_API_URL")
    assert len(_FakeServer.started) == 1 and not _FakeServer.started[0].running
    assert "PREFECT_API_URL" not in os.environ


def test_a_prefect_api_the_user_runs_is_reused_untouched(repo, monkeypatch, tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows import _prefect_api

    checked: list[str] = []
    user_url = "http://127.0.0.1:4200/api"
    monkeypatch.setenv("PREFECT_API_URL", user_url)  # as `make serve` users export it
    monkeypatch.setattr(_prefect_api, "_temporary_server_class", lambda: pytest.fail("server started"))
    monkeypatch.setattr(_prefect_api, "check_api", lambda url, **_: checked.append(url))
    # Prefect reads the environment when it is imported; in this process, its settings say the same.
    with (
        temporary_settings(updates={PREFECT_API_URL: user_url}),
        _prefect_api.prefect_api(home=tmp_path) as url,
    ):
        assert url == user_url == _inputs.stage_env("rid", None, repo)["PREFECT_API_URL"]
    assert checked == [user_url]
    assert os.environ["PREFECT_API_URL"] == user_url


HOLD = """
import sys, time
from flows._dvc import workspace_lock
with workspace_lock(sys.argv[1], holder="holder-one", timeout_s=5):
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    released = time.time()
print(f"released {released}", flush=True)
"""


def test_workspace_lock_queues_and_names_the_holder(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path), "3"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        with (
            pytest.raises(_dvc.WorkspaceBusy, match="holder-one"),
            _dvc.workspace_lock(tmp_path, holder="two", timeout_s=0.5, poll_s=0.1),
        ):
            pass
        waits: list[str] = []
        with _dvc.workspace_lock(tmp_path, holder="two", timeout_s=60, poll_s=0.1, on_wait=waits.append):
            acquired = time.time()
        released = float(proc.stdout.readline().split()[1])
        assert acquired >= released  # we got it only after the holder let go
        assert waits and "holder-one" in waits[0]
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    # A holder killed with SIGKILL releases the lock (flock dies with the process).
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path), "60"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    proc.kill()
    proc.wait()
    proc.stdout.close()
    with _dvc.workspace_lock(tmp_path, holder="three", timeout_s=10, poll_s=0.1):
        pass


# -------------------------------------------------------------------- the flow with a scripted DVC


class FakeDvc:
    """Plays back DVC output; callables in the script run at that point (e.g. to write metrics)."""

    def __init__(self, script: list, returncode: int) -> None:
        self.script, self.returncode, self.stopped = script, returncode, False

    def lines(self):
        for item in self.script:
            if callable(item):
                item()
            else:
                time.sleep(0.01)
                yield item

    def wait(self) -> int:
        return self.returncode

    def stop(self, on_line=None) -> None:
        self.stopped = True


@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def scripted(repo, monkeypatch):
    """Point the flow at ``repo`` and a fake DVC; returns the list of DVC argument lists it was started with."""
    calls: list[list[str]] = []
    infos = [
        _dvc.StageInfo("prepare", "python -m flows.x", metrics=("metrics/prepare.json",)),
        _dvc.StageInfo("finetune@sst2", "python -m flows.y", metrics=("metrics/ft.json",)),
        _dvc.StageInfo("evaluate", "python -m flows.z"),
    ]
    monkeypatch.setattr(pipeline, "REPO_ROOT", repo)
    monkeypatch.setattr(_dvc, "stage_infos", lambda root: infos)

    def install(script: list, returncode: int) -> None:
        def start(args, *, cwd, env):
            calls.append(args)
            assert env["BERT_PIPELINE_RUN_ID"] and cwd == repo
            return FakeDvc(script, returncode)

        monkeypatch.setattr(_driver, "start_dvc", start)

    scripted.install = install
    return install, calls


def _write(path: Path, text: str):
    return lambda: (path.parent.mkdir(parents=True, exist_ok=True), path.write_text(text))


def _task_states(flow_run_id, expected: dict[str, str]):
    """Task run states arrive through Prefect's event pipeline, a moment after the flow returns: poll."""
    import asyncio

    deadline = time.monotonic() + 60
    while True:
        tasks, artifacts = asyncio.run(_read_states(flow_run_id))
        if tasks == expected or time.monotonic() > deadline:
            return tasks, artifacts
        time.sleep(0.5)


async def _read_states(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
    )

    async with get_client() as client:
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
        arts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {r.name: r.state.name for r in runs}, {a.key: a.data for a in arts}


def test_flow_follows_stages(harness, scripted, repo):
    install, calls = scripted
    install(
        [
            "Reproducing experiment 'e1'",
            "Stage 'prepare' didn't change, skipping",
            "Running stage 'finetune@sst2':",
            "> python -m flows.y sst2",
            "epoch 1 loss 0.5",
            _write(repo / "metrics" / "ft.json", '{"dev": {"accuracy": 81.5}}'),
            "Updating lock file 'dvc.lock'",
            "Running stage 'evaluate':",
            "done",
        ],
        0,
    )
    _write(repo / "metrics" / "prepare.json", '{"docs": 3}')()
    state = pipeline.pipeline_flow(
        profile="tiny", preset="mini", experiment_name="e1", jobs=1, return_state=True
    )
    result = state.result()
    assert calls[0][:4] == ["exp", "run", "--name", "e1"]
    assert "params/pretrain.yaml:pretrain.model.preset=mini" in calls[0]
    assert {k: v["outcome"] for k, v in result["stages"].items()} == {
        "prepare": "cached",
        "finetune@sst2": "ran",
        "evaluate": "ran",
    }
    assert result["stages"]["finetune@sst2"]["metrics"] == {"dev": {"accuracy": 81.5}}
    assert result["pipeline_run_id"] == str(state.state_details.flow_run_id)
    expected = {"prepare": "Cached", "finetune@sst2": "Completed", "evaluate": "Completed"}
    tasks, artifacts = _task_states(state.state_details.flow_run_id, expected)
    assert tasks == expected
    assert "| dev.accuracy | 81.5 |" in re.sub(r" {2,}", " ", artifacts["pipeline-finetune-sst2"])
    assert (
        re.search(r"\| finetune@sst2 +\| ran ", artifacts["pipeline-summary"])
        and "dvc exp apply e1" in artifacts["pipeline-summary"]
    )
    assert (
        yaml.safe_load((repo / "params" / "pretrain.yaml").read_text())["pretrain"]["max_steps"] == 100
    )  # exp run's job


def test_flow_reports_the_failed_stage(harness, scripted, repo):
    install, calls = scripted
    install(
        [
            "Running stage 'prepare':",
            "Traceback ...",
            "ValueError: bad corpus",
            "ERROR: failed to reproduce 'prepare': exit 1",
        ],
        255,
    )
    state = pipeline.pipeline_flow(profile="tiny", as_experiment=False, jobs=1, return_state=True)
    assert state.is_failed()
    with pytest.raises(pipeline.PipelineFailed, match=r"(?s)stage 'prepare' failed .*ValueError: bad corpus"):
        state.result()
    assert calls[0] == ["repro"]
    # dvc repro mode writes the profile into the params files first.
    assert yaml.safe_load((repo / "params" / "pretrain.yaml").read_text())["pretrain"]["max_steps"] == 5
    tasks, artifacts = _task_states(state.state_details.flow_run_id, {"prepare": "Failed"})
    assert tasks == {"prepare": "Failed"}
    assert "FAILED" in artifacts["pipeline-summary"] and re.search(
        r"\| evaluate +\| not run ", artifacts["pipeline-summary"]
    )


def test_flow_rejects_bad_input_before_running_dvc(harness, scripted, repo):
    install, calls = scripted
    install([], 0)
    with pytest.raises(overrides.ProfileError, match=r"no key 'finetune\.nope'"):
        pipeline.pipeline_flow(extra_overrides=["params/finetune.yaml:finetune.nope=1"])
    with pytest.raises(ValueError, match="experiment_name"):
        pipeline.pipeline_flow(experiment_name="bad name")
    # a value the stage would refuse: refused here, before DVC could remove a stage's outputs, and never
    # written into the params file (repro mode writes the overrides there)
    before = (repo / "params" / "finetune.yaml").read_text()
    with pytest.raises(overrides.ProfileError, match=r"params/finetune\.yaml.*epochs"):
        pipeline.pipeline_flow(
            extra_overrides=["params/finetune.yaml:finetune.defaults.epochs=0"], as_experiment=False, jobs=1
        )
    assert (repo / "params" / "finetune.yaml").read_text() == before
    assert calls == []


def test_a_profile_with_targets_runs_only_those_from_a_local_checkpoint(harness, scripted, repo):
    """The released profile: `dvc repro evaluate` (its targets), the source as a local dir DVC tracks."""
    install, calls = scripted
    install(["Running stage 'finetune@sst2':", "Running stage 'evaluate':", "done"], 0)
    (repo / "params" / "finetune.yaml").write_text(
        "finetune:\n  model: {source: models/pretrained}\n  defaults: {learning_rates: [5.0e-5], seeds: [1]}\n"
        "  small_task_seeds: [1, 2]\n  tasks:\n    sst2: {train_limit: 100}\n"
    )
    (repo / "params" / "profiles" / "released.yaml").write_text(
        "targets: [evaluate]\nparams/finetune.yaml:\n  finetune.model.source: models/released/m\n"
    )
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "released")
    with pytest.raises(
        overrides.ProfileError, match=r"models/released/m' is not a Hugging Face model directory"
    ):
        pipeline.pipeline_flow(profile="released", as_experiment=False, jobs=1)
    assert calls == []  # refused before DVC started
    _write(repo / "models" / "released" / "m" / "config.json", "{}")()
    result = pipeline.pipeline_flow(profile="released", as_experiment=False, jobs=1)
    assert calls == [["repro", "evaluate"]]
    assert set(result["stages"]) == {"finetune@sst2", "evaluate"}
    source = yaml.safe_load((repo / "params" / "finetune.yaml").read_text())["finetune"]["model"]["source"]
    assert source == "models/released/m"


def test_the_command_refuses_a_bad_override_before_prefect_starts(repo, monkeypatch, capsys):
    """A value its stage would refuse, given on the command line: one line and exit 1, in a second, with no
    Prefect server started (none would have been needed) and the params files unchanged."""
    from flows import _prefect_api

    def no_server(*args, **kwargs):
        raise AssertionError("a Prefect API was settled for a run whose arguments are refused")

    monkeypatch.setattr(pipeline, "REPO_ROOT", repo)
    monkeypatch.setattr(_prefect_api, "prefect_api", no_server)
    before = (repo / "params" / "finetune.yaml").read_text()
    assert pipeline.main(["-S", "params/finetune.yaml:finetune.defaults.epochs=0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: params/finetune.yaml") and "epochs" in err and len(err.splitlines()) == 1
    assert pipeline.main(["--profile", "tiny", "-S", "params/finetune.yaml:finetune.nope=1"]) == 1
    assert "no key 'finetune.nope'" in capsys.readouterr().err
    assert pipeline.main(["--data-root", str(repo / "nowhere")]) == 1
    assert "nowhere is not a directory" in capsys.readouterr().err
    assert pipeline.main(["--experiment", "--name", "bad name!"]) == 1
    assert "experiment_name='bad name!'" in capsys.readouterr().err
    assert (repo / "params" / "finetune.yaml").read_text() == before


def test_an_experiment_name_without_an_experiment_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        pipeline.main(["--name", "myexp", "vocab"])
    assert (
        exit_.value.code == 2
        and "--name myexp: an experiment's name; add --experiment" in capsys.readouterr().err
    )


def test_a_failed_stage_is_reported_by_its_own_line_not_its_traceback():
    tail = [
        "Traceback (most recent call last):",
        '  File "flows/_stage.py", line 294, in stage',
        "TrackingUnavailable: the MLflow tracking server at http://127.0.0.1:9 does not answer",
        "corpus stage failed: TrackingUnavailable: the MLflow tracking server at http://127.0.0.1:9 does not answer",
        "ERROR: failed to reproduce 'corpus': failed to run: exec python -m flows.corpus, exited with 1",
    ]
    assert pipeline.last_words(tail) == "\n".join(tail[-2:])
    assert pipeline.last_words(tail[:3]) == "Last DVC output:\n" + "\n".join(tail[:3])  # no stage line: as is
