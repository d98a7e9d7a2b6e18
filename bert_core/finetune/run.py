"""The ``finetune`` stage function: grid x seeds trials on one task, the best one kept (BERT §4, A.3).

:func:`finetune_task` loads the task's data, runs one trial per (init, learning rate, seed) with the shared
:class:`bert_core.training.Trainer` (AdamW, warmup + linear decay, clipping; the objective is a thin
:class:`FinetuneObjective`), selects the best pretrained trial on the dev main metric, and writes:

- ``model_out``: the selected model in Hugging Face format with its tokenizer;
- ``out_dir/summary.json``: every trial (metrics, learning curves), the selection and the model source;
- ``out_dir``: dev predictions of the selected model in the official formats, and for GLUE the test-set
  predictions in the leaderboard's submission format (``out_dir/submission/<Task>.tsv``).

Everything is written atomically at the end, so a failed run leaves the previous outputs untouched. One
trial: :mod:`bert_core.finetune.trial`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import tempfile
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bert_core.atomic import OutputSet, atomic_outputs, check_writable, write_json_atomic
from bert_core.config import preset_for
from bert_core.constants import repo_relative
from bert_core.finetune.inference import load_tokenizer, predict
from bert_core.finetune.params import FinetuneParams, TaskSettings
from bert_core.finetune.reference import run_reference_trials
from bert_core.finetune.results import FinetuneResult, TrialResult
from bert_core.finetune.trial import (
    SplitData,
    TrialData,
    TrialTracker,
    load_task_data,
    no_tracking,
    run_trial,
    trial_params,
)
from bert_core.finetune.trials import Logged, TrialStore, trials_fingerprint
from bert_core.kinds import SplitScore, get_kind, max_seq_length
from bert_core.kinds.task_json import serving_task
from bert_core.released import check_checkpoint
from bert_core.tasks import TaskSpec

log = logging.getLogger(__name__)


def model_info(source_dir: str | Path, **known: Any) -> dict[str, Any]:
    """Shape and provenance of the pretrained model (``known`` adds e.g. the registry version)."""
    from bert_core.hf import read_config

    config = read_config(source_dir)
    info = {
        "source": str(source_dir),
        "num_hidden_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "preset": preset_for(config.num_hidden_layers, config.hidden_size) or "custom",
    }
    info.update({k: v for k, v in known.items() if v is not None})
    return info


def trial_grid(settings: TaskSettings, init: str) -> list[tuple[str, float, int]]:
    """(init, learning rate, seed) of every trial: the main init, then the random-init baseline."""
    inits = [init] + (["random"] if settings.random_init_baseline and init != "random" else [])
    return [(i, lr, s) for i in inits for lr in settings.learning_rates for s in settings.seeds]


def finetune_task(
    task: str | TaskSpec,
    params: FinetuneParams,
    model_source: str | Path,
    out_dir: str | Path,
    *,
    model_out: str | Path | None = None,
    data_root: str | Path | None = None,
    tracker: TrialTracker | None = None,
    source_info: Mapping[str, Any] | None = None,
    on_data: Callable[[TrialData], None] | None = None,
    check_report_dir: str | Path | None = None,
    outputs: OutputSet | None = None,
    trials_root: str | Path | None = None,
) -> FinetuneResult:
    """Fine-tune ``task`` from the HF model in ``model_source`` and write its outputs.

    Args:
        task: Task name (``sst2``, ``squad_v1``, ``conll2003`` ...; an own task: ``params.task``), or the
            spec ``params.task`` gave (an own task's labels are then not read again).
        params: The stage params; ``params.for_task(task)`` gives the settings.
        model_source: Local Hugging Face BERT directory with tokenizer files (resolve MLflow URIs first,
            :func:`bert_core.tracking.resolve_model_source`).
        out_dir: Predictions, submission files and ``summary.json`` (replaced atomically).
        model_out: The selected model in HF format (default ``out_dir/model``; replaced atomically).
        data_root: Local data root (default ``BERT_DATA_ROOT``; unset = Hugging Face Hub).
        tracker: Opens a recorder per trial (nested MLflow runs in the flow).
        source_info: Provenance of the pretrained model to record (registry name/version, URI).
        on_data: Called with the loaded :class:`TrialData` (the flow logs the data-check reports).
        check_report_dir: Where the data checks' HTML reports go (one folder per suite), kept after the
            run so that a failed check's message points at a report that exists; default: a temporary
            directory (no lasting report).
        outputs: Stage ``out_dir`` and ``model_out`` in this :class:`~bert_core.atomic.OutputSet` (the
            flow adds its metrics and plots files, so that all are committed together); default: a set of
            their own, committed when this function returns.
        trials_root: Where finished trials are kept, so that a rerun after a crash trains only the rest
            (:mod:`bert_core.finetune.trials`); default: a temporary folder, gone with the run.

    Returns:
        The :class:`FinetuneResult` (also written as ``out_dir/summary.json``).
    """
    from bert_core.tasks.datasource import split_tags

    spec = params.task(task) if isinstance(task, str) else task
    settings = params.for_task(spec.name)
    source_dir = Path(model_source)
    out_dir, model_out = Path(out_dir), Path(model_out) if model_out is not None else Path(out_dir) / "model"
    info = model_info(source_dir, **dict(source_info or {}))
    max_len = max_seq_length(spec, settings)
    if max_len > info["max_position_embeddings"]:  # else: an index error only once a long enough batch comes
        raise ValueError(
            f"{spec.name}: max_seq_length={max_len} is longer than the model's position table "
            f"(max_position_embeddings={info['max_position_embeddings']} in {source_dir}/config.json); set "
            f"finetune.tasks.{spec.name}.max_seq_length to at most {info['max_position_embeddings']}"
        )
    check_writable(out_dir, model_out)  # fail fast, before hours of training
    check_checkpoint(source_dir)  # tokenizer files present, vocab sizes agree (released checkpoints)
    tokenizer = load_tokenizer(source_dir, info["vocab_size"])
    with (
        tempfile.TemporaryDirectory(prefix=f"finetune-{spec.name}-") as tmp_name,
        contextlib.ExitStack() as held,
    ):
        tmp = Path(tmp_name)
        reports = Path(check_report_dir) if check_report_dir is not None else tmp / "data_checks"
        data = load_task_data(
            spec,
            settings,
            tokenizer,
            data_root=data_root,
            data_checks=params.data_checks,
            check_report_dir=reports,
        )
        if on_data is not None:
            on_data(data)
        log.info(
            "%s: %d train features, dev %s",
            spec.name,
            len(data.train.features),
            {s: len(d.features) for s, d in data.dev.items()},
        )
        features = [data.train.features, data.dev[spec.main_dev_split].features]
        fingerprint = trials_fingerprint(
            spec.name,
            settings,
            source_dir,
            features,
            params.device,
            params.precision,
            checkpoint_sha=info.get("sha"),
        )
        store = held.enter_context(TrialStore(trials_root or tmp / "trials", spec.name, fingerprint))
        main = spec.main_metric
        train = partial(
            run_trial,
            spec,
            data,
            settings,
            source_dir,
            device=params.device,
            precision=params.precision,
            checkpoint_every_s=params.checkpoint_every_s,
        )
        trials: list[TrialResult] = []
        # Per init, its best trial so far: result, dev score (None: trained by an earlier run), weights (None:
        # an earlier run's trial whose weights were not kept).
        best: dict[str, tuple[TrialResult, SplitScore | None, Path | None]] = {}
        open_trial = tracker.trial if tracker is not None else no_tracking
        grid = trial_grid(settings, params.model.init)
        for number, (init, lr, seed) in enumerate(grid, 1):
            name = f"{spec.name}-{init}-lr{lr:g}-seed{seed}"
            log.info("trial %d/%d: %s", number, len(grid), name)
            params_of_trial = trial_params(settings, init, lr, seed)
            tags = {
                "task": spec.name,
                "init": init,
                "trial": name,
                "pretrained_source": info["source"],
                **split_tags(data.split_info),
            }
            provenance = ("model", "model_version", "uri", "sha")
            tags.update({f"pretrained_{k}": str(v) for k, v in info.items() if k in provenance})
            current = best.get(init)
            kept = store.reuse(name, open_trial, params_of_trial, tags)
            if kept is not None:
                result, score, weights = kept.result, None, kept.model_dir
                better = _better(result, current, main)
            else:
                with open_trial(name, params_of_trial, tags) as recorder:
                    logged = Logged(recorder)
                    outcome, model = train(
                        init=init,
                        learning_rate=lr,
                        seed=seed,
                        recorder=logged,
                        checkpoint_dir=store.checkpoint_dir(name),
                    )
                result, score = outcome.result, outcome.dev_score
                # weights first, then the record: the best recorded trial of an init has its weights
                better = _better(result, current, main)
                weights = store.keep(name, result, logged.calls, model if better else None)
                del model
            trials.append(result)
            log.info("%s: %s = %.3f", name, main, result.dev.get(main, math.nan))
            if better:
                if current is not None and current[2] not in (None, weights):
                    store.drop(current[2])  # after the better trial's record
                best[init] = (result, score, weights)
        trials += run_reference_trials(
            spec,
            settings,
            params,
            info=info,
            run_trial=run_trial,
            open_trial=open_trial,
            load_data=lambda tok: load_task_data(spec, settings, tok, data_root=data_root, data_checks=False),
            trials_root=store.dir.parent,
        )
        # trivial baselines: fitted on the same (capped) training rows, scored on the same evaluated rows
        split_baselines = {  # every evaluated split's; the main one's are the task's baselines
            split: get_kind(spec).baselines(spec, data.dev[split].rows, train_rows=data.train.rows)
            for split in spec.dev_splits
        }
        baselines = split_baselines.pop(spec.main_dev_split)
        log.info(
            "%s: trivial baselines: %s",
            spec.name,
            "; ".join(
                f"{n} " + ", ".join(f"{k}={v:.4g}" for k, v in m.items()) for n, m in baselines.items()
            ),
        )
        result = FinetuneResult(
            spec.name,
            spec.kind,
            spec.main_metric,
            info,
            trials,
            data_split=data.split_info,
            baselines=baselines,
            split_baselines={split: b for split, b in split_baselines.items() if b},
        )
        selected, dev_score, best_dir = best[result.selected.init]
        if best_dir is None:  # an earlier run kept its result, not its weights (another grid order)
            log.info("%s: trained again for its weights", selected.name)
            outcome, model = train(
                init=selected.init, learning_rate=selected.learning_rate, seed=selected.seed
            )
            best_dir, dev_score = tmp / "selected", outcome.dev_score
            model.save_pretrained(best_dir)
            del model
        with contextlib.ExitStack() as stack:
            if outputs is None:
                outputs = stack.enter_context(atomic_outputs([out_dir, model_out], dirs=[out_dir]))
            _write_outputs(
                spec,
                data,
                settings,
                params,
                result,
                dev_score,
                best_dir,
                tokenizer,
                out_dir,
                model_out,
                outputs,
            )
    return result


def _rank(value: Any) -> float:
    v = float(value) if value is not None else math.nan
    return -math.inf if math.isnan(v) else v


def _better(result: TrialResult, current: tuple[TrialResult, Any, Any] | None, main: str) -> bool:
    """Whether ``result`` beats the best trial of its init so far (the first of equals stays)."""
    return current is None or _rank(result.dev.get(main, math.nan)) > _rank(current[0].dev.get(main))


def _write_outputs(
    spec: TaskSpec,
    data: TrialData,
    settings: TaskSettings,
    params: FinetuneParams,
    result: FinetuneResult,
    dev_score: SplitScore | None,
    best_dir: Path,
    tokenizer: Any,
    out_dir: Path,
    model_out: Path,
    staged: OutputSet,
) -> None:
    """Predictions of the selected model (dev, other dev splits, test) + summary + model, staged in
    ``staged`` (committed together by its owner). ``dev_score``: the selected trial's last evaluation on the
    main dev split; ``None`` for a trial an earlier run trained, whose dev predictions are made again here."""
    kind = get_kind(spec)
    model = kind.model_class.from_pretrained(best_dir)
    device = torch.device("cuda" if params.device != "cpu" and torch.cuda.is_available() else "cpu")
    model.to(device)

    def scored(split: str, d: SplitData, what: str, null_threshold: float | None = None) -> SplitScore:
        outputs = predict(
            model,
            d.features,
            batch_size=settings.eval_batch_size,
            device=device,
            precision=params.precision,
            label=f"{spec.name} {split} {what}",
        )
        return kind.score(spec, d.rows, d.features, outputs, settings, null_threshold=null_threshold)

    main_split = spec.dev_splits[0]
    if dev_score is None:  # as the trial's own last evaluation made it (the null threshold tuned again)
        dev_score = scored(main_split, data.dev[main_split], "eval")
    threshold = dev_score.extra.get("null_threshold")
    tmp_out = staged[out_dir]
    paths = kind.write_predictions(spec, main_split, data.dev[main_split].rows, dev_score, tmp_out)
    details = {main_split: dev_score.details}

    def predicted(split: str, d: SplitData) -> SplitScore:
        """The selected model's score on one more split, its prediction files written."""
        score = scored(split, d, "predict", null_threshold=threshold)
        paths.update(kind.write_predictions(spec, split, d.rows, score, tmp_out))
        return score

    for split in spec.dev_splits[1:]:
        score = predicted(split, data.dev[split])
        result.selected.other_splits[split] = dict(score.metrics)
        details[split] = score.details
    for split, d in data.test.items():
        predicted(split, d)
    rel = {k: repo_relative(Path(out_dir) / Path(v).relative_to(tmp_out)) for k, v in paths.items()}
    result.outputs = {"model": repo_relative(model_out), **rel}
    summary = result.to_json()
    summary["details"] = details
    summary["data"] = {
        "train": {
            "rows": len(data.train.rows),
            "features": len(data.train.features),
            "source": data.train.source,
        },
        **{
            s: {"rows": len(d.rows), "features": len(d.features), "source": d.source}
            for s, d in data.dev.items()
        },
        **{s: {"rows": len(d.rows), "source": d.source} for s, d in data.test.items()},
    }
    summary["notes"] = data.notes
    write_json_atomic(tmp_out / "summary.json", summary)
    tmp_model = staged[model_out]
    shutil.copytree(best_dir, tmp_model, dirs_exist_ok=True)  # the stage stages the directory empty
    tokenizer.save_pretrained(str(tmp_model))
    # The serving task JSON beside the weights: the directory then serves as its registered version does.
    write_json_atomic(tmp_model / "task.json", serving_task(spec, settings, null_threshold=threshold))
