"""Finished fine-tuning trials kept across a crash, so that a rerun of the stage trains only the rest.

A task's grid of (init, learning rate, seed) trials is long work: the paper's grid for one GLUE task on
BERT-Base is hours on a GPU, and a crash in its last trial must not cost the others.
:func:`bert_core.finetune.run.finetune_task` keeps each finished trial in a :class:`TrialStore` folder,
``<trials_root>/<task>-<fingerprint>/``:

- ``<trial>.json``: its :class:`~bert_core.finetune.results.TrialResult` and every metric its recorder
  logged (replayed into the rerun's MLflow trial run, tagged ``trial_reused``);
- ``model-<trial>/``: the weights of the best trial of its init so far. A better trial's weights replace them
  only after its own record is written, so the best finished trial always has its weights;
- ``checkpoints-<trial>/``: the running trial's newest checkpoint (every ``finetune.checkpoint_minutes`` of
  training, and when a signal stops it), from which a rerun continues that trial; removed once its record
  is written.

The fingerprint (:func:`trials_fingerprint`) covers what a trial's result depends on besides its own
learning rate and seed: the task settings (the grid's learning rates and seeds, the baselines and the test
predictions excepted, so that a grid that grows keeps its trials), the starting checkpoint's weights and
config, the training and dev features, the device and the precision. A rerun reuses every finished trial of
its grid with that fingerprint; anything else starts in a folder of its own. A run holds its folder under an
exclusive ``flock`` (a second run of the task with the same fingerprint fails at once, :class:`TrialsInUseError`).
A task's folders are removed once its outputs are committed (:func:`discard_trials`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import pickle
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bert_core.atomic import atomic_path, write_json_atomic
from bert_core.finetune.results import TrialResult
from bert_core.integrity import CorruptOutputError, verify_output
from bert_core.tracking.fingerprint import SHORT_HEX

log = logging.getLogger(__name__)

#: Task settings a trial's own result does not depend on (the grid, the baselines, the test predictions).
_NOT_IN_A_TRIAL = {
    "learning_rates",
    "seeds",
    "random_init_baseline",
    "reference_baseline",
    "predict_test",
    "test_limit",
}


def trials_fingerprint(
    task: str,
    settings: Any,
    source_dir: Path,
    features: list[Any],
    device: str,
    precision: str,
    grid: str = "main",
    checkpoint_sha: str | None = None,
) -> str:
    """What a trial's result depends on besides its init, learning rate and seed (see the module docstring);
    ``grid``: ``"main"``, or ``"reference"`` for the reference checkpoint's grid, a folder of its own even
    when the reference is the starting checkpoint itself. ``checkpoint_sha``: the checkpoint's
    :func:`bert_core.tracking.fingerprint.fingerprint`, when the caller has it (else its weights are read again)."""
    import xxhash

    from bert_core.tracking.fingerprint import fingerprint, json_fingerprint

    digest = xxhash.xxh3_128()

    class Hashed:  # pickle writes into the digest, in frames: no copy of the features in memory
        def write(self, data: bytes) -> int:
            digest.update(data)
            return len(data)

    for split in features:
        pickle.dump(split, Hashed(), protocol=5)
    return json_fingerprint(
        {
            "task": task,
            "grid": grid,
            "settings": settings.model_dump(mode="json", exclude=_NOT_IN_A_TRIAL),
            "checkpoint": checkpoint_sha or fingerprint(source_dir),
            "features": digest.hexdigest(),
            "device": device,
            "precision": precision,
        }
    )


class Logged:
    """A trial recorder that also keeps what it was given, to be replayed when the trial is reused."""

    def __init__(self, recorder: Any) -> None:
        self.recorder, self.calls = recorder, []

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.calls.append([dict(metrics), step])
        self.recorder.log_metrics(metrics, step=step)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.recorder.set_tags(tags)


@dataclasses.dataclass
class KeptTrial:
    """A trial an earlier run finished: its result, the metrics it logged, its weights when it has them."""

    result: TrialResult
    logged: list[list[Any]]
    model_dir: Path | None

    def replay(self, recorder: Any) -> None:
        for metrics, step in self.logged:
            recorder.log_metrics(metrics, step=step)


class TrialsInUseError(RuntimeError):
    """Another run of the same task holds the kept-trials folder."""


class TrialStore:
    """One task's finished trials under one fingerprint (see the module docstring); use it in a ``with``."""

    def __init__(self, root: str | Path, task: str, fingerprint: str) -> None:
        from filelock import FileLock

        self.dir = Path(root) / f"{task}-{fingerprint}"
        self._lock = FileLock(self.dir / ".lock", blocking=False)

    def __enter__(self) -> TrialStore:
        """Hold the folder (an exclusive lock): two runs of one task never share kept trials."""
        from filelock import Timeout

        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            raise TrialsInUseError(
                f"{self.dir}: another fine-tuning run of this task, with the same settings and checkpoint, is "
                "using these kept trials; wait for it to finish"
            ) from None
        for model in self.dir.glob("model-*"):  # weights saved just before a crash, without their record
            if not self._record(model.name.removeprefix("model-")).is_file():
                shutil.rmtree(model, ignore_errors=True)
        for checkpoints in self.dir.glob("checkpoints-*"):  # a finished trial's, its record just written
            if self._record(checkpoints.name.removeprefix("checkpoints-")).is_file():
                shutil.rmtree(checkpoints, ignore_errors=True)
        return self

    def __exit__(self, *_: Any) -> None:
        self._lock.release()

    def _record(self, name: str) -> Path:
        """The record of the finished trial ``name``: its result and logged metrics."""
        return self.dir / f"{name}.json"

    def model_dir(self, name: str) -> Path:
        return self.dir / f"model-{name}"

    def checkpoint_dir(self, name: str) -> Path:
        """Where the trial ``name`` writes the checkpoints a rerun continues it from."""
        return self.dir / f"checkpoints-{name}"

    def finished(self, name: str) -> KeptTrial | None:
        """The trial ``name`` when an earlier run finished it (``None`` when not, or its record is damaged)."""
        path = self._record(name)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            result = TrialResult(**data["result"])
            logged = [[dict(m), s] for m, s in data["logged"]]
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("%s is damaged (%s); the trial runs again", path, err)
            return None
        model = self.model_dir(name)
        if not (model / "config.json").is_file():
            return KeptTrial(result, logged, None)
        try:
            verify_output(model)  # the checksums recorded when the weights were written
        except CorruptOutputError as err:
            log.warning("%s; its result is reused, and the trial trains again if it is selected", err)
            shutil.rmtree(model, ignore_errors=True)
            return KeptTrial(result, logged, None)
        return KeptTrial(result, logged, model)

    def reuse(
        self, name: str, open_trial: Any, params: Mapping[str, Any], tags: Mapping[str, str]
    ) -> KeptTrial | None:
        """The trial ``name`` when an earlier run finished it, its logged metrics replayed into a new trial run
        (``open_trial``, tagged ``trial_reused``); ``None``: it has to be trained."""
        kept = self.finished(name)
        if kept is not None:
            log.info("%s: finished by an earlier run (%s)", name, self.dir)
            with open_trial(name, params, {**tags, "trial_reused": "true"}) as recorder:
                kept.replay(recorder)
        return kept

    def keep(self, name: str, result: TrialResult, logged: list[list[Any]], model: Any = None) -> Path | None:
        """Record a finished trial; with ``model`` (the new best of its init) its weights first. Returns the
        weights' directory (``None`` without ``model``)."""
        target = None
        if model is not None:
            target = self.model_dir(name)
            with atomic_path(target) as tmp:
                model.save_pretrained(tmp)
        write_json_atomic(self._record(name), {"result": dataclasses.asdict(result), "logged": logged})
        shutil.rmtree(self.checkpoint_dir(name), ignore_errors=True)
        return target

    def drop(self, weights: Path) -> None:
        """Remove a trial's weights (a better trial of its init has been recorded)."""
        shutil.rmtree(weights, ignore_errors=True)


def discard_trials(root: str | Path, task: str) -> None:
    """Remove every kept-trials folder of ``task`` under ``root`` (its outputs are committed)."""
    for folder in Path(root).glob(f"{task}-*"):
        if folder.is_dir() and re.fullmatch(rf"{re.escape(task)}-[0-9a-f]{{{SHORT_HEX}}}", folder.name):
            shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):  # the last task's: nothing left to keep
        Path(root).rmdir()
