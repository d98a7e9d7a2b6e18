"""A fine-tuning run that crashed mid-grid: the rerun trains only the unfinished trials, reuses the others
(their results, their logged metrics, the best one's weights) and writes what an uninterrupted run writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest
import test_finetune_run as base
import torch

from bert_core.finetune import run as run_module
from bert_core.finetune.trials import TrialsInUseError, TrialStore, discard_trials, trials_fingerprint
from bert_core.training import TrainingInterrupted
from bert_core.training.window import CLOCK_METRICS

# the tiny model, the data root and one thread, as the fine-tuning tests have them
tiny_model, data_root, _one_thread, _params = base.tiny_model, base.data_root, base._one_thread, base._params


class _Recorder:
    """Keeps what a trial logs; ``at_step(step)`` runs on each call (to stop the trial there)."""

    def __init__(self, at_step=lambda step: None, tags=None) -> None:
        self.logged, self.at_step, self.tags = [], at_step, {} if tags is None else tags

    def log_metrics(self, metrics, step=None):
        self.logged.append((dict(metrics), step))
        if step is not None:
            self.at_step(step)

    def set_tags(self, tags):
        self.tags.update(tags)


def _crash_at(at: int):
    """A ``_Recorder`` hook that raises :class:`Crash` when step ``at`` is logged."""

    def crash(step):
        if step == at:
            raise Crash("killed")

    return crash


class Tracker:
    """Records each trial's name, tags and logged metrics, as the MLflow tracker would log them."""

    def __init__(self, crash_at: tuple[str, int] | None = None) -> None:
        self.trials: dict[str, dict] = {}
        self.crash_at = crash_at  # (trial, step): raise Crash when that trial logs that step

    @contextlib.contextmanager
    def trial(self, name, params, tags):
        crashing = self.crash_at is not None and self.crash_at[0] == name
        recorder = _Recorder(_crash_at(self.crash_at[1]) if crashing else lambda step: None, dict(tags))
        self.trials[name] = {"tags": recorder.tags, "logged": recorder.logged}
        yield recorder


class Crash(RuntimeError):
    pass


def _grid_params(**settings):
    params = _params(learning_rates=[1e-3, 1e-4], random_init_baseline=True, predict_test=False, **settings)
    return params.model_copy(update={"small_task_seeds": [1, 2]})  # rte: 2 lrs x 2 seeds x 2 inits


def _finetune(tiny_model, data_root, out: Path, trials_root: Path | None, tracker=None, params=None):
    return run_module.finetune_task(
        "rte",
        params or _grid_params(),
        tiny_model,
        out / "results",
        model_out=out / "model",
        data_root=data_root,
        tracker=tracker,
        trials_root=trials_root,
    )


def _counting(monkeypatch, crash_at: int | None = None) -> list[str]:
    """Count the trials trained; raise :class:`Crash` when trial ``crash_at`` (1-based) starts."""
    real, trained = run_module.run_trial, []

    def run_trial(spec, data, settings, source_dir, **kwargs):
        if crash_at is not None and len(trained) + 1 == crash_at:
            raise Crash("killed")
        trained.append(f"{kwargs['init']}-lr{kwargs['learning_rate']:g}-seed{kwargs['seed']}")
        return real(spec, data, settings, source_dir, **kwargs)

    monkeypatch.setattr(run_module, "run_trial", run_trial)
    return trained


def _whole_and_crashed(tiny_model, data_root, tmp_path: Path, monkeypatch) -> Path:
    """An uninterrupted run into ``whole/``, and one into ``out/`` that crashed when trial 6 of 8 started;
    returns the latter's kept-trials root."""
    _finetune(tiny_model, data_root, tmp_path / "whole", None)
    trials_root = tmp_path / "trials"
    with monkeypatch.context() as m:
        _counting(m, crash_at=6)
        with pytest.raises(Crash):
            _finetune(tiny_model, data_root, tmp_path / "out", trials_root)
    return trials_root


def test_a_rerun_after_a_crash_trains_only_the_unfinished_trials_and_writes_the_same(
    tiny_model, data_root, tmp_path, monkeypatch
):
    whole_tracker = Tracker()
    whole = _finetune(tiny_model, data_root, tmp_path / "whole", None, whole_tracker)
    assert len(whole.trials) == 8

    trials_root, crashed_tracker = tmp_path / "trials", Tracker()
    with monkeypatch.context() as m:
        first = _counting(m, crash_at=6)
        with pytest.raises(Crash):
            _finetune(tiny_model, data_root, tmp_path / "out", trials_root, crashed_tracker)
    assert len(first) == 5
    (store,) = trials_root.iterdir()
    assert len(list(store.glob("*.json"))) == 5
    # the best of each init so far keeps its weights (pretrained: 4 trials done, random: 1)
    assert len(list(store.glob("model-*"))) == 2

    tracker = Tracker()
    with monkeypatch.context() as m:
        second = _counting(m)
        resumed = _finetune(tiny_model, data_root, tmp_path / "out", trials_root, tracker)
    assert second == ["random-lr0.001-seed2", "random-lr0.0001-seed1", "random-lr0.0001-seed2"]
    assert [t.dev for t in resumed.trials] == [t.dev for t in whole.trials]
    assert resumed.selected.name == whole.selected.name
    assert list(tracker.trials) == list(whole_tracker.trials)
    for name, record in tracker.trials.items():
        if name.split("-", 1)[1] in second:
            assert "trial_reused" not in record["tags"]
        else:  # the metrics the crashed run logged, logged again unchanged (timings included)
            assert record["tags"]["trial_reused"] == "true"
            assert record["logged"] == crashed_tracker.trials[name]["logged"], name
    for rel in ("model/model.safetensors", "results/dev_predictions.tsv"):
        assert (tmp_path / "out" / rel).read_bytes() == (tmp_path / "whole" / rel).read_bytes(), rel
    summary = json.loads((tmp_path / "out" / "results" / "summary.json").read_text())
    assert (
        summary["details"]
        == json.loads((tmp_path / "whole" / "results" / "summary.json").read_text())["details"]
    )


def test_what_a_trial_depends_on_is_in_the_fingerprint_and_the_grid_is_not(tiny_model, tmp_path):
    params = _grid_params()
    settings = params.for_task("rte")
    features = [[{"input_ids": [101, 7, 102]}], [{"input_ids": [101, 8, 102]}]]

    def fp(settings=settings, features=features, device="cpu", precision="fp32"):
        return trials_fingerprint("rte", settings, tiny_model, features, device, precision)

    base = fp()
    grown = settings.model_copy(update={"learning_rates": [1e-3, 1e-4, 5e-5], "seeds": [1, 2, 3]})
    assert fp(grown) == base
    assert fp(settings.model_copy(update={"epochs": 2.0})) != base
    assert fp(features=[features[0], [{"input_ids": [101, 9, 102]}]]) != base
    assert fp(precision="bf16") != base


def test_weights_saved_without_their_record_are_removed(tmp_path):
    name = "rte-pretrained-lr0.001-seed1"
    with TrialStore(tmp_path, "rte", "0123456789abcdef") as store:
        store.model_dir(name).mkdir()
        (store.model_dir(name) / "config.json").write_text("{}")
    with TrialStore(tmp_path, "rte", "0123456789abcdef") as store:
        assert store.finished(name) is None
        assert not store.model_dir(name).exists()


def test_a_damaged_record_makes_its_trial_train_again(tmp_path, caplog):
    with TrialStore(tmp_path, "rte", "0123456789abcdef") as store:
        (store.dir / "rte-pretrained-lr0.001-seed1.json").write_text('{"result": {"init"')
        assert store.finished("rte-pretrained-lr0.001-seed1") is None
    assert "is damaged" in caplog.text


def test_two_runs_of_a_task_never_share_its_kept_trials(tmp_path):
    with TrialStore(tmp_path, "rte", "0123456789abcdef"):
        with pytest.raises(TrialsInUseError, match="another fine-tuning run of this task"):
            TrialStore(tmp_path, "rte", "0123456789abcdef").__enter__()
        with TrialStore(tmp_path, "rte", "fedcba9876543210"):  # other settings: a folder of their own
            pass
    with TrialStore(tmp_path, "rte", "0123456789abcdef"):  # released with the first
        pass


def test_discarding_a_tasks_trials_leaves_other_tasks_alone(tmp_path):
    for name in (
        "mnli-0123456789abcdef",
        "mnli-fedcba9876543210",
        "mnli_mm-0123456789abcdef",
        "rte-0123456789abcdef",
    ):
        (tmp_path / name).mkdir()
    discard_trials(tmp_path, "mnli")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnli_mm-0123456789abcdef", "rte-0123456789abcdef"]
    discard_trials(tmp_path / "missing", "rte")  # nothing kept: nothing to do
    discard_trials(tmp_path, "mnli_mm")
    discard_trials(tmp_path, "rte")
    assert not tmp_path.exists()  # the root goes with the last task's folder


def test_a_selected_trial_whose_weights_were_not_kept_is_trained_again(
    tiny_model, data_root, tmp_path, monkeypatch, caplog
):
    """The weights of the best trial are gone (kept by no earlier run in this grid order, or removed): its
    result is reused for the selection, and it is trained once more, alone, for the model written."""
    import logging
    import shutil

    trials_root = _whole_and_crashed(tiny_model, data_root, tmp_path, monkeypatch)
    (store,) = trials_root.iterdir()
    for weights in store.glob("model-*"):
        shutil.rmtree(weights)
    with monkeypatch.context() as m, caplog.at_level(logging.INFO, "bert_core.finetune.run"):
        trained = _counting(m)
        resumed = _finetune(tiny_model, data_root, tmp_path / "out", trials_root)
    assert trained[:3] == ["random-lr0.001-seed2", "random-lr0.0001-seed1", "random-lr0.0001-seed2"]
    assert trained[3:] == [resumed.selected.name]
    assert "trained again for its weights" in caplog.text
    for rel in ("model/model.safetensors", "results/dev_predictions.tsv"):
        assert (tmp_path / "out" / rel).read_bytes() == (tmp_path / "whole" / rel).read_bytes(), rel


def test_the_reference_checkpoints_finished_trials_are_reused_too(
    tiny_model, data_root, tmp_path, monkeypatch
):
    """The reference column's grid (a released checkpoint fine-tuned beside ours) keeps its trials as well."""
    params = _params(learning_rates=[1e-3, 1e-4], reference_baseline=True, predict_test=False)
    from bert_core.finetune.params import ReferenceSource

    params = params.model_copy(update={"reference": ReferenceSource(source=str(tiny_model))})

    def finetune(out: str):
        return run_module.finetune_task(
            "sst2", params, tiny_model, tmp_path / out, data_root=data_root, trials_root=tmp_path / "trials"
        )

    with monkeypatch.context() as m:
        _counting(m, crash_at=4)  # 2 of ours, the first of the reference's, then a crash
        with pytest.raises(Crash):
            finetune("out")
    with monkeypatch.context() as m:
        trained = _counting(m)
        result = finetune("out")
    assert trained == ["pretrained-lr0.0001-seed1"]  # the reference's second trial (its init: "pretrained")
    assert [t.init for t in result.trials] == ["pretrained", "pretrained", "reference", "reference"]
    assert not list((tmp_path / "trials").glob("sst2-*/model-*reference*"))  # no weights kept for those


def test_kept_weights_damaged_on_disk_are_not_used_and_their_trial_trains_again(
    tiny_model, data_root, tmp_path, monkeypatch, caplog
):
    import logging

    trials_root = _whole_and_crashed(tiny_model, data_root, tmp_path, monkeypatch)
    for weights in trials_root.glob("*/model-rte-pretrained-*/model.safetensors"):
        data = bytearray(weights.read_bytes())
        data[-1] ^= 1  # one flipped bit in the last tensor
        weights.write_bytes(bytes(data))
    with monkeypatch.context() as m, caplog.at_level(logging.INFO, "bert_core.finetune"):
        trained = _counting(m)
        resumed = _finetune(tiny_model, data_root, tmp_path / "out", trials_root)
    assert "is damaged" in caplog.text
    assert trained[3:] == [resumed.selected.name]  # trained again, not loaded from the damaged file
    model = "model/model.safetensors"
    assert (tmp_path / "out" / model).read_bytes() == (tmp_path / "whole" / model).read_bytes()


# ------------------------------------------------------------------ one trial, stopped and continued
_TIMINGS = CLOCK_METRICS | {"examples_per_second", "seconds"}  # and the trial's own timings


def _untimed(logged):
    """The logged metrics without the clock's figures, which differ between any two runs."""
    return [({k: v for k, v in m.items() if k.split(".", 1)[1] not in _TIMINGS}, step) for m, step in logged]


def _trial_setup(tiny_model, data_root, **settings):
    from bert_core.finetune.inference import load_tokenizer
    from bert_core.finetune.trial import load_task_data
    from bert_core.tasks import get_task

    spec = get_task("rte")
    task_settings = _params(epochs=3, **settings).for_task("rte")  # 3 steps an epoch: 9 in all
    data = load_task_data(
        spec, task_settings, load_tokenizer(tiny_model, 30522), data_root=data_root, data_checks=False
    )
    return spec, data, task_settings


def _trial(tiny_model, setup, recorder, checkpoint_dir=None, every_s=None):
    from bert_core.finetune.trial import run_trial

    spec, data, settings = setup
    return run_trial(
        spec,
        data,
        settings,
        tiny_model,
        init="pretrained",
        learning_rate=1e-3,
        seed=1,
        device="cpu",
        recorder=recorder,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every_s=every_s,
    )


def _same_trial(resumed, whole) -> None:
    (outcome, model), (whole_outcome, whole_model) = resumed, whole
    for (name, value), expected in zip(
        model.state_dict().items(), whole_model.state_dict().values(), strict=True
    ):
        assert torch.equal(value, expected), name
    assert outcome.result.dev == whole_outcome.result.dev
    assert outcome.result.steps == whole_outcome.result.steps == 9
    assert outcome.result.evals == whole_outcome.result.evals
    assert [h["loss"] for h in outcome.result.history] == [h["loss"] for h in whole_outcome.result.history]


@pytest.mark.parametrize("group_by_length", [True, False])
def test_a_trial_stopped_by_a_signal_continues_from_its_checkpoint_and_ends_as_an_uninterrupted_one(
    tiny_model, data_root, tmp_path, group_by_length
):
    setup = _trial_setup(tiny_model, data_root, group_by_length=group_by_length)
    whole_recorder = _Recorder()
    whole = _trial(tiny_model, setup, whole_recorder)

    checkpoints = tmp_path / "checkpoints"
    stop = lambda step: os.kill(os.getpid(), signal.SIGTERM) if step == 4 else None  # noqa: E731
    with pytest.raises(TrainingInterrupted) as stopped:
        _trial(tiny_model, setup, _Recorder(stop), checkpoints)
    assert 4 <= stopped.value.step < 9  # in the second epoch: the order of a later epoch is resumed too
    assert stopped.value.checkpoint is not None and stopped.value.checkpoint.is_dir()

    recorder = _Recorder()
    resumed = _trial(tiny_model, setup, recorder, checkpoints)
    _same_trial(resumed, whole)
    # the new tracking run gets the whole curve: the steps before the stop again, then the rest
    assert _untimed(recorder.logged) == _untimed(whole_recorder.logged)
    assert recorder.tags == {"trial_resumed_from_step": str(stopped.value.step)} and whole_recorder.tags == {}


def test_a_trial_stopped_during_its_final_evaluation_is_not_trained_again(
    tiny_model, data_root, tmp_path, caplog
):
    """No final checkpoint is written for a trial (its result is kept by the stage), except when a stop
    signal lands during the final evaluation: the rerun then only evaluates the trained model again."""
    setup = _trial_setup(tiny_model, data_root)
    whole_recorder = _Recorder()
    whole = _trial(tiny_model, setup, whole_recorder)

    def stop_at_the_final_evaluation(step):
        if step == 9 and "dev.accuracy" in recorder.logged[-1][0]:
            os.kill(os.getpid(), signal.SIGTERM)

    checkpoints, recorder = tmp_path / "checkpoints", _Recorder()
    recorder.at_step = stop_at_the_final_evaluation
    with pytest.raises(TrainingInterrupted) as stopped:
        _trial(tiny_model, setup, recorder, checkpoints)
    assert stopped.value.step == 9 and stopped.value.checkpoint.name == "step-00000009"

    again = _Recorder()
    with caplog.at_level("INFO", logger="bert_core.training"):
        resumed = _trial(tiny_model, setup, again, checkpoints)
    assert "step-00000009 (step 9," in caplog.text  # resumed complete: nothing left to train
    assert again.tags == {"trial_resumed_from_step": "9"}
    _same_trial(resumed, whole)
    assert _untimed(again.logged) == _untimed(whole_recorder.logged)


def test_a_trial_that_crashed_continues_from_its_last_periodic_checkpoint(tiny_model, data_root, tmp_path):
    setup = _trial_setup(tiny_model, data_root)
    whole = _trial(tiny_model, setup, _Recorder())

    checkpoints = tmp_path / "checkpoints"
    with pytest.raises(Crash):  # no checkpoint at the crash itself: the periodic ones are what is left
        _trial(tiny_model, setup, _Recorder(_crash_at(7)), checkpoints, every_s=1e-9)
    assert [p.name for p in checkpoints.iterdir() if p.name.startswith("step-")] == ["step-00000006"]
    _same_trial(_trial(tiny_model, setup, _Recorder(), checkpoints, every_s=1e-9), whole)


def test_a_grid_that_crashed_inside_a_trial_continues_that_trial_from_its_checkpoint(
    tiny_model, data_root, tmp_path, monkeypatch
):
    # 3 steps an epoch, a checkpoint after every step
    params = _grid_params(epochs=3).model_copy(update={"checkpoint_minutes": 1e-9})

    def finetune(out, trials_root, tracker):
        return _finetune(tiny_model, data_root, out, trials_root, tracker, params)

    whole_tracker = Tracker()
    whole = finetune(tmp_path / "whole", None, whole_tracker)
    trials_root, trial = tmp_path / "trials", "rte-pretrained-lr0.0001-seed1"
    with pytest.raises(Crash):
        finetune(tmp_path / "out", trials_root, Tracker(crash_at=(trial, 5)))
    (store,) = trials_root.iterdir()
    assert sorted(p.name for p in store.glob("checkpoints-*")) == [f"checkpoints-{trial}"]

    tracker = Tracker()
    with monkeypatch.context() as m:
        trained = _counting(m)
        resumed = finetune(tmp_path / "out", trials_root, tracker)
    assert trained[0] == "pretrained-lr0.0001-seed1"  # the crashed trial first, from its step-4 checkpoint
    assert [t.dev for t in resumed.trials] == [t.dev for t in whole.trials]
    assert _untimed(tracker.trials[trial]["logged"]) == _untimed(whole_tracker.trials[trial]["logged"])
    assert tracker.trials[trial]["tags"]["trial_resumed_from_step"] == "4"
    assert sum("trial_resumed_from_step" in t["tags"] for t in tracker.trials.values()) == 1
    for rel in ("model/model.safetensors", "results/dev_predictions.tsv"):
        assert (tmp_path / "out" / rel).read_bytes() == (tmp_path / "whole" / rel).read_bytes(), rel
    assert not list(store.glob("checkpoints-*"))  # removed with each trial's record


def test_a_trial_checkpoint_damaged_in_place_is_dropped_and_the_trial_trains_from_its_start(
    tiny_model, data_root, tmp_path, caplog
):
    setup = _trial_setup(tiny_model, data_root)
    whole = _trial(tiny_model, setup, _Recorder())

    checkpoints = tmp_path / "checkpoints"
    with pytest.raises(Crash):
        _trial(tiny_model, setup, _Recorder(_crash_at(5)), checkpoints, every_s=1e-9)
    weights = checkpoints / "step-00000004" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))

    recorder = _Recorder()
    _same_trial(_trial(tiny_model, setup, recorder, checkpoints, every_s=1e-9), whole)
    assert "the trial trains from its start" in caplog.text and "resumed from" not in caplog.text
    assert recorder.tags == {}  # trained from its start: not tagged as resumed
    assert [step for _, step in recorder.logged].count(1) == 1  # nothing replayed: one curve, from step 1
