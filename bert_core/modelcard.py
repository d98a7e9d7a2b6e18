"""Model cards: the ``README.md`` of every exported model directory, in the Hugging Face model-card format.

A card is YAML front matter (``language``, ``license``, ``datasets``, ``metrics``, ``model-index`` with the
scores, ``base_model`` for fine-tuned models, ``pipeline_tag``, ``tags``) and a Markdown body with the
lineage a reviewer needs: git commit, the stage's params, the ``dvc.lock`` hashes of the stages that made
the model (or "not run under DVC"), the pipeline run id, the MLflow run, pretraining data statistics, and
dev scores next to the published scores of the same size (:mod:`bert_core.evaluate.references`).

Everything here renders from plain data: no Prefect, no DVC (``dvc.lock`` is read as YAML), no MLflow.
``huggingface_hub.ModelCard`` parses the result (tests/test_modelcard.py).

Two copies (docs/model-cards.md): the model directory a stage writes (a DVC output that a rerun must
reproduce byte for byte) gets a card *without* run ids (``run_ids=None``); the copy registered in MLflow gets
the same card *with* them (:func:`staged_with_card`), so the registry's artifact names its runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tabulate import tabulate

from bert_core.atomic import TEMP_MARKER, write_text_atomic
from bert_core.tracking.provenance import under_dvc

CARD_NAME = "README.md"
LICENSE = "apache-2.0"

#: Hugging Face ``pipeline_tag`` per task kind (multiple choice has no pipeline on the Hub: tag only).
PIPELINE_TAGS = {
    "classification": "text-classification",
    "regression": "text-classification",
    "span_qa": "question-answering",
    "token_classification": "token-classification",
    "multiple_choice": None,
}
#: ``model-index`` task type per kind (the Hub's task ids).
TASK_TYPES = {
    "classification": ("text-classification", "Text Classification"),
    "regression": ("text-classification", "Text Classification"),
    "span_qa": ("question-answering", "Question Answering"),
    "token_classification": ("token-classification", "Token Classification"),
    "multiple_choice": ("multiple-choice", "Multiple Choice"),
}


# ====================================================================== rendering
def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "n/a" if not math.isfinite(value) else f"{value:.2f}"
    return "n/a" if value is None else str(value)


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A Markdown (pipe) table; the cells are already formatted and stay as they are."""
    return tabulate(rows, header, tablefmt="pipe", disable_numparse=True)


def _yaml_block(data: Any) -> str:
    return "```yaml\n" + yaml.safe_dump(data, sort_keys=True, default_flow_style=False).rstrip() + "\n```"


def _front_matter(meta: Mapping[str, Any]) -> str:
    clean = {k: v for k, v in meta.items() if v not in (None, [], {})}
    return "---\n" + yaml.safe_dump(clean, sort_keys=False, allow_unicode=True) + "---\n"


def _lineage_section(
    *,
    git_commit: str,
    params: Mapping[str, Any] | None,
    params_name: str,
    lineage: Mapping[str, Any] | None,
    stage: str,
    run_ids: Mapping[str, str] | None,
    outside_source: str | None = None,
) -> list[str]:
    """``outside_source``: the checkpoint the model started from when no stage of the pipeline made it (a
    released model), so that no upstream stage's ``dvc.lock`` entry is shown as its lineage."""
    lines = ["## Lineage", ""]
    if run_ids is None:  # the commit (``-dirty`` in a changed work tree) would make the output differ too
        lines.append(
            "- git commit, pipeline run, MLflow run: recorded in the card of the registered version "
            "(this directory is a DVC output and stays identical across reruns)"
        )
    else:
        lines.append(f"- git commit: `{git_commit}`")
        for key, label in (
            ("pipeline_run_id", "pipeline run id"),
            ("mlflow_run_id", "MLflow run id"),
            ("mlflow_experiment", "MLflow experiment"),
            ("registered_model", "registered as"),
        ):
            if run_ids.get(key):
                lines.append(f"- {label}: `{run_ids[key]}`")
    lines.append("")
    if params is not None:
        lines += [f"### Params (`{params_name}`)", "", _yaml_block(dict(params)), ""]
    lines += ["### DVC", ""]
    dvc_stage = under_dvc()
    if lineage is not None and "error" in lineage:
        lines += [str(lineage["error"]), ""]
    elif lineage is None and not dvc_stage:
        lines += ["Not run under DVC (no `dvc.lock`): the params above are the whole recipe.", ""]
    else:
        lines.append(
            f"Run by `dvc repro` as stage `{dvc_stage}`." if dvc_stage else "Not run by `dvc repro` itself."
        )
        if outside_source is not None:
            lines.append(
                f"No stage of this pipeline made the model it started from (`{outside_source}`), so no "
                "upstream `dvc.lock` entry is its lineage."
            )
        elif lineage is None:
            lines.append("No `dvc.lock` yet (a first run): the upstream stages' entries are recorded by DVC.")
        else:
            lines.append(
                f"The upstream stages' `dvc.lock` entries follow; `{stage}`'s own entry is written by DVC once "
                "it completes (its inputs are these outputs and the params above)."
            )
        lines.append("")
        if lineage and outside_source is None:
            rows = [
                (name, f"`{path}`", kind[:-1], f"`{md5}`")
                for name, entry in lineage.items()
                for kind in ("deps", "outs")
                for path, md5 in entry[kind].items()
            ]
            lines += [_table(rows, ["stage", "path", "kind", "md5"]), ""]
    return lines


def pretrained_card(
    *,
    name: str,
    preset: str,
    config: Mapping[str, Any],
    metrics: Mapping[str, Any],
    data_stats: Mapping[str, Any],
    params: Mapping[str, Any] | None,
    git_commit: str,
    lineage: Mapping[str, Any] | None,
    datasets: Sequence[str] = (),
    run_ids: Mapping[str, str] | None = None,
) -> str:
    """The card of a pretrained model (``models/pretrained``, ``bert-pretrained``).

    Args:
        name: The registered model name.
        preset: Model size (``bert_core.config.PRESETS`` key or ``custom``).
        config: ``num_hidden_layers``, ``hidden_size`` ... of the model.
        metrics: The pretrain result's metrics (``heldout`` and ``steps`` are read).
        data_stats: The pretrain result's data statistics.
        params: The stage's params (as in ``params/pretrain.yaml``).
        git_commit: The code's commit.
        lineage: :func:`bert_core.tracking.provenance.dvc_lineage` (``None``: not run under DVC).
        datasets: Hub ids or names of the corpora.
        run_ids: ``pipeline_run_id``, ``mlflow_run_id`` ... (``None``: the deterministic DVC-output copy).
    """
    heldout, before = dict(metrics.get("heldout") or {}), metrics.get("heldout_before")
    nsp = bool((params or {}).get("nsp", True))  # pretrain.nsp: false is MLM alone
    objectives = "masked-LM and next-sentence prediction" if nsp else "masked-LM alone"
    held = [
        (k, _fmt(heldout[k]), *([_fmt(before.get(k))] if before else []), _fmt(heldout.get(f"baseline_{k}")))
        for k in ("mlm_acc", "mlm_ppl", "nsp_acc")
        if k in heldout
    ]
    before_col = ["the checkpoint it started from"] if before else []
    values = [(k, heldout.get(k)) for k in ("mlm_acc", "nsp_acc", "mlm_ppl") if heldout.get(k) is not None]
    meta = {
        "language": "en",
        "license": LICENSE,
        "library_name": "transformers",
        "pipeline_tag": "fill-mask",
        "tags": ["bert", "fill-mask", "pretraining", "mlm", *(["nsp"] if nsp else []), f"bert-{preset}"],
        "datasets": list(datasets),
        "metrics": ["accuracy", "perplexity"],
        "model-index": [
            {
                "name": name,
                "results": [
                    {
                        "task": {"type": "fill-mask", "name": "Masked Language Modeling"},
                        "dataset": {
                            "type": "held-out",
                            "name": "held-out pretraining instances",
                            "split": "heldout",
                        },
                        "metrics": [
                            {
                                "type": ("perplexity" if k.endswith("ppl") else "accuracy"),
                                "name": f"held-out {k}",
                                "value": round(float(v), 4),
                            }
                            for k, v in values
                        ],
                    }
                ],
            }
        ]
        if values
        else None,
    }
    arch = ", ".join(f"{k}={config[k]}" for k in sorted(config))
    body = [
        f"# {name}",
        "",
        f"BERT ({preset}; {arch}) pretrained with {objectives} by this pipeline's "
        "`pretrain` stage. Load it with `transformers.AutoModelForPreTraining.from_pretrained(<this dir>)`.",
        "",
        "## Held-out evaluation",
        "",
        _table(held, ["metric", "this model", *before_col, "most-frequent-token baseline"]),
        "",
        f"Steps: {metrics.get('steps', 'n/a')}.",
        "",
        "## Pretraining data",
        "",
        _yaml_block(json.loads(json.dumps(dict(data_stats), default=str))),
        "",
        *_lineage_section(
            git_commit=git_commit,
            params=params,
            params_name="params/pretrain.yaml",
            lineage=lineage,
            stage="pretrain",
            run_ids=run_ids,
        ),
    ]
    return _front_matter(meta) + "\n" + "\n".join(body).rstrip() + "\n"


def finetuned_card(
    *,
    name: str,
    task: str,
    kind: str,
    main_metric: str,
    dev_metrics: Mapping[str, float],
    dev_split: str,
    datasets: Sequence[str],
    hub_config: str | None,
    preset: str | None,
    published: Mapping[str, float] | None,
    published_model: str | None,
    published_split: str | None,
    base_model: str | None,
    params: Mapping[str, Any] | None,
    git_commit: str,
    lineage: Mapping[str, Any] | None,
    pretraining: Mapping[str, Any] | None = None,
    labels: Sequence[str] = (),
    run_ids: Mapping[str, str] | None = None,
    outside_source: str | None = None,
    best_baselines: Mapping[str, tuple[str, float]] | None = None,
    other_splits: Sequence[SplitScores] = (),
) -> str:
    """The card of a fine-tuned model (``models/finetuned/<task>``, ``bert-<task>``).

    Args:
        name: The registered model name (``bert-sst2``).
        task, kind, main_metric: The task, its kind (``bert_core.kinds``) and headline metric key.
        dev_metrics: Dev scores of the selected model, keyed without the ``dev.`` prefix (0-100 scale).
        dev_split: The dev split the scores are on.
        datasets: Hub ids of the task's data.
        hub_config: The Hub config of the data (``sst2``), for ``model-index``.
        preset: The model size (``None``: not a published size).
        published: Published scores of the same size for this task (metric key -> value), if any.
        published_model, published_split: What the published scores are of, and on which split.
        base_model: The pretrained model it was fine-tuned from (registry name/version or path).
        params: The task's fine-tuning settings.
        git_commit, lineage, run_ids: As :func:`pretrained_card`.
        pretraining: Provenance of the pretrained model (``pretrained_*`` info: source, version, shape).
        labels: Label names.
        best_baselines: The best trivial baseline on the same rows, per metric (metric -> (name, score)):
            shown beside the model's score, and a model not above it on the main metric is said to be so.
        other_splits: The further evaluated splits (MNLI's mismatched half, a labelled test set), each scored
            once by the selected model: a section and a ``model-index`` result each.
    """
    scores = {k: float(v) for k, v in dev_metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
    shown = [k for k in (main_metric, *sorted(scores)) if k in scores]
    shown = list(dict.fromkeys(k for k in shown if k in {main_metric, *(published or {})} or "_" not in k))
    task_type, task_name = TASK_TYPES.get(kind, ("text-classification", "Text Classification"))
    tag = PIPELINE_TAGS.get(kind)

    def result(split: str, prefix: str, values: list[tuple[str, float]]) -> dict[str, Any]:
        """One ``model-index`` result: the scores on ``split``, named ``<prefix> <metric>``."""
        dataset = {"type": datasets[0] if datasets else task, "name": task}
        dataset |= {"config": hub_config} if hub_config else {}
        return {
            "task": {"type": task_type, "name": task_name},
            "dataset": {**dataset, "split": split},
            "metrics": [
                {"type": _metric_type(k), "name": f"{prefix} {k}", "value": round(v, 4)} for k, v in values
            ],
        }

    meta = {
        "language": "en",
        "license": LICENSE,
        "library_name": "transformers",
        "base_model": base_model,
        "pipeline_tag": tag,
        "tags": ["bert", task, kind.replace("_", "-"), *([f"bert-{preset}"] if preset else [])],
        "datasets": list(datasets),
        "metrics": sorted({_metric_type(k) for k in shown}),
        "model-index": [
            {
                "name": name,
                "results": [
                    result(dev_split, "dev", [(k, scores[k]) for k in shown]),
                    *(
                        result(other.split, other.split, values)
                        for other in other_splits
                        if (values := other.shown(main_metric))
                    ),
                ],
            }
        ]
        if shown
        else None,
    }
    body = [
        f"# {name}",
        "",
        f"BERT{f' ({preset})' if preset else ''} fine-tuned on `{task}` ({kind.replace('_', ' ')}) by this "
        f"pipeline's `finetune` stage, from `{base_model or 'n/a'}`. Headline metric: `{main_metric}` "
        f"(logged to MLflow as `dev.main`).",
        "",
    ]
    if labels:
        body += [f"Labels: {', '.join(f'`{label}`' for label in labels)}.", ""]
    ref = f"published ({published_model}, {published_split})" if published else "published"
    best = {k: best_baselines[k] for k in shown if k in (best_baselines or {})}
    table = _scores_table([(k, scores[k]) for k in shown], main_metric, best, published or {}, ref)
    body += [f"## Dev scores ({dev_split})", "", table]
    if main_metric in best and not scores.get(main_metric, -math.inf) > best[main_metric][1]:
        body += [
            "",
            f"**Not above its best trivial baseline** (`{best[main_metric][0]}`) on `{main_metric}`.",
        ]
    if not published:
        body += ["", f"No published score for `{task}` at size `{preset or 'custom'}`."]
    elif published_split == "test":
        body += ["", "The published GLUE numbers are test-set scores; ours are dev scores."]
    for other in other_splits:
        body += ["", *other.section(main_metric, published_model)]
    body.append("")
    if pretraining:
        body += ["## Pretrained model", "", _yaml_block({k: str(v) for k, v in pretraining.items()}), ""]
    body += _lineage_section(
        git_commit=git_commit,
        params=params,
        params_name="params/finetune.yaml",
        lineage=lineage,
        stage=f"finetune@{task}",
        run_ids=run_ids,
        outside_source=outside_source,
    )
    return _front_matter(meta) + "\n" + "\n".join(body).rstrip() + "\n"


@dataclass(frozen=True)
class SplitScores:
    """A further evaluated split on a card: the selected model's scores there (0-100), the best trivial
    baseline per metric, and the published scores of the same size on it."""

    split: str
    scores: Mapping[str, float]
    best_baselines: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    published: Mapping[str, float] = field(default_factory=dict)

    def shown(self, main_metric: str) -> list[tuple[str, float]]:
        keys = [main_metric, *sorted(k for k in self.scores if k != main_metric and "_" not in k)]
        return [
            (k, float(self.scores[k])) for k in keys if k in self.scores and math.isfinite(self.scores[k])
        ]

    def section(self, main_metric: str, published_model: str | None) -> list[str]:
        ref = f"published ({published_model}, {self.split})" if self.published else "published"
        table = _scores_table(self.shown(main_metric), main_metric, self.best_baselines, self.published, ref)
        return [
            f"## Scores on {self.split}",
            "",
            "Scored once, by the model the main dev split selected: nothing was chosen on these rows.",
            "",
            table,
        ]


def _scores_table(
    values: list[tuple[str, float]],
    main_metric: str,
    best: Mapping[str, tuple[str, float]],
    published: Mapping[str, float],
    ref: str,
) -> str:
    """A card's scores table: each metric's score, the best trivial baseline (a column when any) and the
    published score (column ``ref``)."""
    rows = [
        (
            f"{k} (main)" if k == main_metric else k,
            _fmt(v),
            *([f"{_fmt(best[k][1])} ({best[k][0]})" if k in best else "n/a"] if best else []),
            _fmt(published.get(k)),
        )
        for k, v in values
    ]
    return _table(rows, ["metric", "this model", *(["best trivial baseline"] if best else []), ref])


def _metric_type(key: str) -> str:
    return {"matthews_corr": "matthews_correlation", "exact": "exact_match"}.get(key, key)


# ====================================================================== reading and writing
def parse_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """``(metadata, body)`` of a card: the YAML between the leading ``---`` lines (as the Hub reads it);
    ``ValueError`` without front matter or when its YAML is not a mapping."""
    if not text.startswith("---\n"):
        raise ValueError("a model card starts with '---' and its YAML metadata")
    end = text.find("\n---\n", 4)
    if end < 0:
        raise ValueError("the model card's YAML metadata has no closing '---'")
    meta = yaml.safe_load(text[4:end])
    if not isinstance(meta, dict):
        raise ValueError("the model card's YAML metadata is not a mapping")
    return meta, text[end + 5 :]


def write_card(model_dir: str | os.PathLike[str], text: str) -> Path:
    """Write ``README.md`` into ``model_dir`` atomically; return its path."""
    return write_text_atomic(Path(model_dir) / CARD_NAME, text)


@contextlib.contextmanager
def staged_with_card(model_dir: str | os.PathLike[str], text: str) -> Iterator[Path]:
    """A directory with ``model_dir``'s files (hard links, else copies) and ``README.md`` = ``text``.

    For registering a model with a card that names its runs while the model directory itself (a DVC
    output) keeps its deterministic card. The directory sits next to ``model_dir`` as a ``.<name>.tmp-*``
    temporary (removed at the end; a killed run's is removed by the next atomic write of ``model_dir``).
    The copy's checksum manifest (:mod:`bert_core.integrity`) records the new card, so a reader of the
    registered copy (a later fine-tuning from ``models:/...``) verifies it as written; the model directory's
    own manifest is untouched (the copy's marker is replaced, not written through the hard link).
    """
    from bert_core.atomic import _OWNER  # the owner tag lets atomic_path() clean a dead run's leftover
    from bert_core.integrity import refresh

    src = Path(model_dir)
    staged = Path(tempfile.mkdtemp(prefix=f".{src.name}{TEMP_MARKER}{_OWNER}-card-", dir=src.parent))
    try:
        for path in sorted(src.rglob("*")):
            target = staged / path.relative_to(src)
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            elif path.name != CARD_NAME or path.parent != src:
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(path, target)
                except OSError:
                    shutil.copy2(path, target)
        (staged / CARD_NAME).write_text(text, encoding="utf-8")
        refresh(staged / CARD_NAME)
        yield staged
    finally:
        shutil.rmtree(staged, ignore_errors=True)
