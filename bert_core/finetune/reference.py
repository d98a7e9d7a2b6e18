"""The reference-checkpoint baseline: a released checkpoint fine-tuned with the same protocol as ours.

With ``finetune.reference.source`` set (a local Hugging Face BERT directory, e.g. Google's BERT-Tiny from
``python -m flows.checkpoints download``) and ``reference_baseline: true`` for a task, the task's grid of
learning rates and seeds is run once more from that checkpoint, with its own tokenizer; those trials are
recorded with ``init="reference"`` and never selected. The report then shows, per task, our pretrained
model, the reference checkpoint and random init side by side (:mod:`bert_core.evaluate.value`).

A configured checkpoint that is not on local disk is not an error (the default CPU run must work
offline): :func:`reference_status` says so, and the report prints that sentence instead of the column.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bert_core.finetune.params import FinetuneParams, TaskSettings
from bert_core.finetune.results import TrialResult
from bert_core.finetune.trial import trial_params
from bert_core.finetune.trials import Logged, TrialStore, trials_fingerprint

log = logging.getLogger(__name__)

REFERENCE_INIT = "reference"
#: The key under which the task's model info records the reference status (summary.json ``model``).
STATUS_KEY = "reference_checkpoint"
#: The key under which it records the report's name for the reference column (``finetune.reference.label``).
LABEL_KEY = "reference_label"


def reference_status(params: FinetuneParams) -> tuple[Path | None, str]:
    """The reference checkpoint directory (``None`` when not configured or absent) and a sentence saying so."""
    source = params.reference.source
    if not source:
        return None, "no reference checkpoint configured (finetune.reference.source is null)"
    path = Path(source).expanduser()
    if not (path / "config.json").is_file():
        return None, (
            f"reference checkpoint {source} not found locally (finetune.reference.source): download it with "
            "`python -m flows.checkpoints download` (BERT-Tiny), or point the key at a local BERT directory"
        )
    return path, f"reference checkpoint {source}, fine-tuned with the same grid, seeds and data"


def run_reference_trials(
    spec: Any,
    settings: TaskSettings,
    params: FinetuneParams,
    *,
    load_data: Callable[[Any], Any],
    run_trial: Callable[..., Any],
    open_trial: Callable[..., Any],
    info: dict[str, Any],
    trials_root: Path,
) -> list[TrialResult]:
    """Run the task's grid from the reference checkpoint; record its status in ``info[STATUS_KEY]``.

    Args:
        load_data: ``tokenizer -> TrialData`` (the same rows, encoded with the reference's tokenizer).
        run_trial: :func:`bert_core.finetune.trial.run_trial`.
        open_trial: The tracker's ``trial`` (a nested MLflow run per trial in the flow).
        info: The task's model info (written to ``summary.json``).
        trials_root: Where finished trials are kept for a rerun (:mod:`bert_core.finetune.trials`).
    """
    if not settings.reference_baseline:
        return []
    ref_dir, status = reference_status(params)
    info[STATUS_KEY] = status
    if ref_dir is None:
        log.warning("%s: %s", spec.name, status)
        return []
    info[LABEL_KEY] = params.reference.label or ref_dir.name
    from bert_core.finetune.inference import load_tokenizer
    from bert_core.hf import read_config
    from bert_core.released import check_checkpoint

    check_checkpoint(ref_dir, key="finetune.reference.source")
    data = load_data(load_tokenizer(ref_dir, read_config(ref_dir).vocab_size))
    features = [data.train.features, data.dev[spec.main_dev_split].features]
    fingerprint = trials_fingerprint(
        spec.name, settings, ref_dir, features, params.device, params.precision, grid="reference"
    )
    with TrialStore(trials_root, spec.name, fingerprint) as store:
        trials = []
        for lr in settings.learning_rates:
            for seed in settings.seeds:
                name = f"{spec.name}-{REFERENCE_INIT}-lr{lr:g}-seed{seed}"
                params_of_trial = trial_params(settings, REFERENCE_INIT, lr, seed)
                tags = {
                    "task": spec.name,
                    "init": REFERENCE_INIT,
                    "trial": name,
                    "reference_source": str(ref_dir),
                }
                kept = store.reuse(name, open_trial, params_of_trial, tags)
                if kept is not None:
                    result = kept.result
                else:
                    with open_trial(name, params_of_trial, tags) as recorder:
                        logged = Logged(recorder)
                        outcome, model = run_trial(
                            spec,
                            data,
                            settings,
                            ref_dir,
                            init="pretrained",
                            learning_rate=lr,
                            seed=seed,
                            device=params.device,
                            precision=params.precision,
                            recorder=logged,
                            checkpoint_dir=store.checkpoint_dir(name),
                            checkpoint_every_s=params.checkpoint_every_s,
                        )
                    del model
                    result = outcome.result
                    result.init = REFERENCE_INIT
                    store.keep(name, result, logged.calls)
                log.info(
                    "%s: %s = %.3f", name, spec.main_metric, result.dev.get(spec.main_metric, float("nan"))
                )
                trials.append(result)
    return trials
