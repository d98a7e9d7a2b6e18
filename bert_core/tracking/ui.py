"""What the MLflow UI shows of a stage run: dataset inputs (the Dataset column and lineage), the one comparable
headline metric of every fine-tuning run, and a link that opens an experiment on its runs table in a saved
view (one row per task run, trials collapsed under it, ``dev.main`` shown).

Everything here is best effort: a failure is logged, never raised (it only costs the UI a column).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_core.constants import REPO_ROOT
from bert_core.tracking.fingerprint import SHORT_HEX, json_fingerprint, short_hash
from bert_core.tracking.run import retry_tracking

log = logging.getLogger("bert_core.stage")

#: The comparable headline dev metric of every fine-tuning run (the value of the task's main metric).
HEADLINE_METRIC = "dev.main"
#: The same metric on a labelled test set (CoNLL-2003's, an own task's), scored once by the selected model.
TEST_HEADLINE_METRIC = "test.main"


def rows_digest(rows: Any) -> str:
    """Short sha256 over rows (dicts, JSON with sorted keys): identifies the exact data a stage read."""
    import json

    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, default=str).encode())
        digest.update(b"\n")
    return digest.hexdigest()[:SHORT_HEX]


def _dataset_source(source: str) -> Any:
    from mlflow.data.http_dataset_source import HTTPDatasetSource

    if source.startswith("hf://"):  # bert_core.tasks.base.hub_source: hf://<path>[/<config>]:<split>
        return HTTPDatasetSource(
            f"https://huggingface.co/datasets/{source.removeprefix('hf://').split(':')[0]}"
        )
    if source.startswith(("http://", "https://")):
        return HTTPDatasetSource(source)
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source

    with warnings.catch_warnings():  # "can be interpreted in multiple ways": both are the local file source
        warnings.simplefilter("ignore", UserWarning)
        return resolve_dataset_source(str(Path(source).resolve()) if source else str(REPO_ROOT))


def log_dataset(
    name: str, *, source: str, digest: str, rows: int, context: str, tags: dict[str, Any] | None = None
) -> bool:
    """Log a dataset input of the active run (metadata only: the data itself is never uploaded).

    It shows in the runs table's Dataset column (``name`` (``digest``), ``context``) and in the run's
    lineage; ``tags`` (task, split ...) and the row count go with it. Failures are logged, never raised
    (the run's metrics matter more than its Dataset column). Returns whether it was logged.
    """

    import mlflow

    try:
        from mlflow.data.meta_dataset import MetaDataset

        class _Dataset(MetaDataset):
            @property
            def profile(self) -> dict[str, int]:
                return {"num_rows": int(rows)}

            def to_dict(self) -> dict[str, str]:
                return {**super().to_dict(), "profile": json.dumps(self.profile)}

        dataset = _Dataset(_dataset_source(source), name=name, digest=digest)
        input_tags = {
            "rows": str(int(rows)),
            "source": str(source)[:500],
            **{k: str(v) for k, v in (tags or {}).items()},
        }
        retry_tracking(mlflow.log_input, attempts=3)(dataset, context=context, tags=input_tags)
        return True
    except Exception as err:
        log.warning("could not log dataset %s (%s) as an MLflow input: %s", name, context, err)
        return False


def log_task_data(task: str, data: Any) -> None:
    """The fine-tuning data of ``task`` as dataset inputs: ``train`` (context ``training``), each dev split
    (context ``evaluation``). ``data`` is a :class:`bert_core.finetune.trial.TrialData`."""
    splits = [("train", data.train, "training"), *((s, d, "evaluation") for s, d in data.dev.items())]
    for split, part, context in splits:
        log_dataset(
            f"{task}-{split}",
            source=part.source,
            digest=rows_digest(part.rows),
            rows=len(part.rows),
            context=context,
            tags={"task": task, "split": split},
        )


def log_pretrain_data(data_dir: str | os.PathLike[str], phases: list[str]) -> None:
    """The pretraining instances of each phase as dataset inputs; the digest is that of the phase's
    ``train/index.json`` (which lists every shard with its hash), the row count its instances."""
    import json

    for phase in phases:
        for split, context in (("train", "training"), ("heldout", "evaluation")):
            index = Path(data_dir) / phase / split / "index.json"
            try:
                raw = index.read_bytes()
                info = json.loads(raw)
            except (OSError, ValueError) as err:
                log.warning("no dataset input for %s: %s", index, err)
                continue
            rows = info.get("num_instances", info.get("instances", 0)) if isinstance(info, dict) else 0
            log_dataset(
                f"pretrain-{phase}-{split}",
                source=str(index.parent),
                rows=int(rows or 0),
                digest=short_hash(raw),
                context=context,
                tags={"phase": phase, "split": split},
            )


def log_headline_metric(key: str, metrics: dict[str, Any]) -> float | None:
    """Log ``dev.main`` = ``metrics["dev.<key>"]`` (``key``: the task's main metric,
    :attr:`bert_core.tasks.TaskSpec.main_metric`) and the tag ``main_metric`` = ``key``, so one column compares
    every task's runs; ``test.main`` likewise where a labelled test set was scored. Returns the dev value
    (``None`` when the run has no such metric)."""
    import mlflow

    retry_tracking(mlflow.set_tags)({"main_metric": key})
    found = {
        name: float(value)
        for name, value in (
            (HEADLINE_METRIC, metrics.get(f"dev.{key}")),
            (TEST_HEADLINE_METRIC, metrics.get(f"test.{key}")),
        )
        if value is not None and math.isfinite(float(value))
    }
    if found:
        retry_tracking(mlflow.log_metrics)(found)
    return found.get(HEADLINE_METRIC)


# ====================================================================== the runs table's saved view
#: Experiment tags under this prefix are MLflow's saved views of the runs table (MLflow 3.15+): the value is
#: ``{"name", "createdAt", "updatedAt", "state"}`` (JSON; times in ms; ``state`` the view as a JSON string),
#: the part after the prefix is the view's id, and ``?viewStateShareKey=<id>`` in the page's URL opens it.
SAVED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
#: The runs table's start-time sort key. MLflow nests child runs under their parent (collapsed, with an
#: expander) only while the table is sorted by start time and unfiltered; any other sort lists every run flat.
START_TIME_ORDER = "attributes.start_time"


@dataclass(frozen=True)
class RunsView:
    """A saved view of an experiment's runs table.

    Attributes:
        view_id: The id in the tag name and the URL (letters, digits, ``-``).
        name: What the UI's *Views* menu calls it.
        columns: The columns shown besides *Run Name* and *Created* (pinned by MLflow), left to right, as
            MLflow keys them: ``metrics.`<key>```, ``params.`<key>```, ``tags.`<key>```,
            ``attributes.`Dataset``` / ``Models`` / ``Source`` ...
    """

    view_id: str
    name: str
    columns: tuple[str, ...]

    def state(self) -> dict[str, Any]:
        """The view as MLflow's runs page reads it: sorted newest first by start time (so that trials stay
        collapsed under their task run), unfiltered, these columns in this order. What it leaves out
        (time range, lifecycle filter, charts ...) takes the UI's defaults."""
        return {
            "searchFilter": "",
            "orderByKey": START_TIME_ORDER,
            "orderByAsc": False,
            "selectedColumns": list(self.columns),
            "columnOrder": list(self.columns),
        }


#: The fine-tuning experiment's view: one row per task run, its trials collapsed under it, the headline
#: metric first (then which metric it is, the data and the logged model). The Source column (always the
#: same entry point) is left out so that ``dev.main`` shows on an ordinary screen without scrolling.
TASK_RUNS_VIEW = RunsView(
    view_id="bert-task-runs",
    name=f"Task runs ({HEADLINE_METRIC})",
    columns=(
        f"metrics.`{HEADLINE_METRIC}`",
        f"metrics.`{TEST_HEADLINE_METRIC}`",
        "tags.`main_metric`",
        "attributes.`Dataset`",
        "attributes.`Models`",
    ),
)


def save_runs_view(client: Any, experiment: Any, view: RunsView = TASK_RUNS_VIEW) -> bool:
    """Save ``view`` in ``experiment`` (an MLflow ``Experiment``) as a saved view of its runs table.

    The tag is written only when its name or state differ from what the experiment holds (its first save
    time is kept), so a view edited in the UI under the same id is reset to the pipeline's, and a view a
    user saved under another name is never touched. A failure (a read-only tracking server, say) is logged,
    never raised: it only costs the link its columns. Returns whether the experiment holds the view.
    """
    import time

    key = SAVED_VIEW_TAG_PREFIX + view.view_id
    state = json.dumps(view.state(), sort_keys=True)
    now = int(time.time() * 1000)
    created = now
    try:
        old = json.loads((getattr(experiment, "tags", None) or {}).get(key) or "null")
        if isinstance(old, dict):
            if old.get("name") == view.name and old.get("state") == state:
                return True
            created = int(old.get("createdAt") or now)
    except (TypeError, ValueError):
        pass  # not a saved view of ours: replaced
    value = json.dumps({"name": view.name, "createdAt": created, "updatedAt": now, "state": state})
    try:
        retry_tracking(client.set_experiment_tag, attempts=3)(experiment.experiment_id, key, value)
        return True
    except Exception as err:
        log.warning(
            "could not save the runs-table view %s in experiment %s: %s",
            view.view_id,
            getattr(experiment, "name", "?"),
            err,
        )
        return False


def experiment_url(ui_url: str, experiment_id: str, view: str | None = None) -> str:
    """The MLflow UI link that opens an experiment on its runs table, in saved view ``view`` (an id, see
    :func:`save_runs_view`) if given, else sorted by start time (MLflow's default, which nests the trials
    under their task run).

    MLflow 3.17's UI picks the experiment view from its global GenAI / Model-training switch (the
    ``workflowType`` URL parameter, else the browser's last choice, GenAI by default), not from the
    experiment's ``mlflow.experimentKind`` tag; this link sets the switch (docs/model-cards.md). The link
    carries no sort or filter parameter: MLflow ignores a saved view when the URL has one.
    """
    from urllib.parse import quote

    url = f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
    return f"{url}&viewStateShareKey={quote(view, safe='')}" if view else url


def log_corpus_data(corpus_dir: str | os.PathLike[str], splits: tuple[str, ...] = ("train",)) -> None:
    """The ``corpus`` stage's output as dataset inputs of a later stage (vocab): one per split, the digest
    that of the corpus's ``manifest.json`` (shard list, params hash, statistics), rows its documents."""
    import json

    manifest = Path(corpus_dir) / "manifest.json"
    try:
        raw = manifest.read_bytes()
        info = json.loads(raw)
    except (OSError, ValueError) as err:
        log.warning("no dataset input for %s: %s", manifest, err)
        return
    for split in splits:
        docs = ((info.get("splits") or {}).get(split) or {}).get("documents", 0)
        log_dataset(
            f"corpus-{split}",
            source=str(Path(corpus_dir)),
            digest=short_hash(raw),
            rows=int(docs or 0),
            context="training",
            tags={"split": split, "unit": "documents"},
        )


def log_corpus_sources(params: Any, stats: Any, data_root: str | os.PathLike[str] | None) -> None:
    """The ``corpus`` stage's raw sources as its dataset inputs (context ``source``): one per source it read
    (``local_sources`` under ``data_root``, else the Hub ``sources``), rows the documents it kept from it.

    The digest covers the source's spec and what was taken from it (documents, bytes), so a changed file
    set or cap shows as a new dataset version in the UI.
    """
    sources = params.active_sources(data_root)
    for src in sources:
        taken = (getattr(stats, "per_source", None) or {}).get(src.name, {})
        if src.kind == "hf":
            where = f"hf://{src.path}" + (f"/{src.config}" if getattr(src, "config", None) else "")
            where += f":{src.split}" if getattr(src, "split", None) else ""
        else:
            where = str(Path(data_root) / src.path) if data_root is not None else str(src.path)
        log_dataset(
            f"corpus-{src.name}",
            source=where,
            rows=int(taken.get("documents", 0)),
            digest=json_fingerprint({"spec": src.model_dump(mode="json"), "taken": taken}),
            context="source",
            tags={"stage": "corpus", "kind": src.kind, "bytes": int(taken.get("bytes", 0))},
        )
