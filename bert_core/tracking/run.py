"""One MLflow run per stage run, and the retries that keep a briefly unreachable server from failing it.

A stage function opens its run with :func:`stage_run` and logs through the returned :class:`StageRun`
(every call retried with backoff; deterministic failures in the stage itself are never retried)::

    with stage_run("corpus", params) as run:
        stats = build_corpus(params, ...)
        run.log_metrics(stats.as_metrics())

Every run carries the standard tags (``stage``, ``git_commit``, ``pipeline_run_id``, ``dvc_experiment``,
``data_root``); an orchestrator adds its own through ``tags`` (``flows/_stage.py``: the Prefect flow-run id).
Tracking defaults to a SQLite file in the repository (``mlflow.db``); ``MLFLOW_TRACKING_URI`` overrides it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from bert_core.atomic import process_alive
from bert_core.constants import REPO_ROOT
from bert_core.params import flatten

#: The experiment of the pipeline's stage runs (corpus, vocab, pretrain_data, pretrain, evaluate).
PIPELINE_EXPERIMENT = "bert-pipeline"
#: The experiment of the fine-tuning runs (one parent run per task, one nested run per trial).
FINETUNE_EXPERIMENT = "bert-finetune"

log = logging.getLogger("bert_core.stage")
T = TypeVar("T")


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` or the repository's SQLite store (absolute, so the cwd does not matter)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{REPO_ROOT / 'mlflow.db'}"


def ensure_tracking_store(uri: str) -> None:
    """Create a new SQLite tracking store whole or not at all (other stores: nothing to do).

    MLflow creates its schema table by table, then migrates it; a stage killed during that first
    initialisation would leave a half-created database on which every later run fails ("table ... already
    exists"). The schema is built in a temporary file and linked into place only when complete; when
    another process got there first, its store is kept.
    """
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a process killed while creating it
        pid = stale.name.rsplit(".tmp-", 1)[1].split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            stale.unlink(missing_ok=True)
    if path.exists():
        return
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        store = SqlAlchemyStore(f"sqlite:///{tmp}", DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH)
        store.engine.dispose()
        try:
            os.link(tmp, path)  # fails if another process created the store meanwhile: keep theirs
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links
            if not path.exists():
                os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def git_commit() -> str:
    """The current git commit (with ``-dirty`` when the work tree has changes), or ``unknown``."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def pipeline_run_id() -> str:
    """Id shared by every stage run of one pipeline run (``BERT_PIPELINE_RUN_ID``; set by the pipeline flow)."""
    value = os.environ.get("BERT_PIPELINE_RUN_ID")
    if not value:
        value = f"adhoc-{uuid.uuid4().hex[:12]}"
        os.environ["BERT_PIPELINE_RUN_ID"] = value
    return value


def retry_tracking(fn: Callable[..., T], *, attempts: int = 6, first_delay: float = 0.5) -> Callable[..., T]:
    """Retry a tracking call with exponential backoff (0.5 s .. 16 s); re-raise after the last attempt."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        delay = first_delay
        for attempt in range(1, attempts + 1):
            try:
                return fn(*args, **kwargs)
            except Exception as err:  # any transport error is worth a retry here
                if attempt == attempts:
                    raise
                log.warning(
                    "tracking call %s failed (%s); retry %d/%d in %.1fs",
                    getattr(fn, "__name__", fn),
                    err,
                    attempt,
                    attempts - 1,
                    delay,
                )
                time.sleep(delay)
                delay = min(delay * 2, 16.0)
        raise AssertionError("unreachable")

    return wrapper


def numeric_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Flatten and keep the finite numbers (MLflow metrics must be floats)."""
    out = {}
    for k, v in flatten(metrics).items():
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, int | float) and math.isfinite(float(v)):
            out[k.replace("@", "_")] = float(v)
    return out


class StageRun:
    """Retrying facade over one active MLflow run."""

    def __init__(self, stage: str, run: Any) -> None:
        self.stage = stage
        self.run = run
        self.run_id: str = run.info.run_id

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        import mlflow

        values = numeric_metrics(metrics)
        if values:
            retry_tracking(mlflow.log_metrics)(values, step=step)

    def log_params(self, params: dict[str, Any]) -> None:
        import mlflow

        flat = {k: str(v)[:6000] for k, v in flatten(params).items()}
        items = list(flat.items())
        for i in range(0, len(items), 100):
            retry_tracking(mlflow.log_params)(dict(items[i : i + 100]))

    def set_tags(self, tags: dict[str, Any]) -> None:
        import mlflow

        retry_tracking(mlflow.set_tags)({k: str(v) for k, v in tags.items()})

    def log_artifact(self, path: str | os.PathLike[str], artifact_path: str | None = None) -> None:
        import mlflow

        path = Path(path)
        if path.is_dir():
            retry_tracking(mlflow.log_artifacts)(str(path), artifact_path=artifact_path)
        elif path.exists():
            retry_tracking(mlflow.log_artifact)(str(path), artifact_path=artifact_path)

    def log_check_report(self, report: Any) -> None:
        """Keep a data-check report (Data Docs HTML + summary) under ``data_checks/<suite>``."""
        self.log_metrics({f"checks.{report.suite}.failed": len(report.failed)})
        if getattr(report, "report_dir", None):
            self.log_artifact(report.report_dir, artifact_path=f"data_checks/{report.suite}")
        import mlflow

        retry_tracking(mlflow.log_dict)(report.summary(), f"data_checks/{report.suite}/summary.json")


@contextlib.contextmanager
def stage_run(
    stage: str,
    params: Any,
    *,
    experiment: str = PIPELINE_EXPERIMENT,
    run_name: str | None = None,
    tags: dict[str, Any] | None = None,
    nested: bool = False,
) -> Iterator[StageRun]:
    """Open one MLflow run for a stage run: params, standard tags; status FAILED if the block raises.

    ``tags`` are added to the standard ones (and win on a clash): the stage's own, an orchestrator's run id.
    """
    import mlflow

    ensure_tracking_store(tracking_uri())
    retry_tracking(mlflow.set_tracking_uri)(tracking_uri())
    tag_experiment_kind(retry_tracking(mlflow.set_experiment)(experiment))
    base_tags = {
        "stage": stage,
        "git_commit": git_commit(),
        "pipeline_run_id": pipeline_run_id(),
        "dvc_experiment": os.environ.get("DVC_EXP_NAME", ""),
        "data_root": "local" if os.environ.get("BERT_DATA_ROOT") else "hub",
    }
    run = retry_tracking(mlflow.start_run)(
        run_name=run_name or stage, nested=nested, tags={**base_tags, **(tags or {})}
    )
    handle = StageRun(stage, run)
    try:
        if params is not None:
            handle.log_params(params if isinstance(params, dict) else params.model_dump(mode="json"))
        yield handle
    except BaseException:
        with contextlib.suppress(Exception):
            mlflow.end_run(status="FAILED")
        raise
    else:
        retry_tracking(mlflow.end_run)(status="FINISHED")


# ====================================================================== what the MLflow UI shows
#: Experiment tag that picks the MLflow UI's view: without it MLflow 3 may open the GenAI (traces) view.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
#: The model-training view (runs table, metrics, datasets); the UI's ``CUSTOM_MODEL_DEVELOPMENT``.
EXPERIMENT_KIND = "custom_model_development"
#: The comparable headline dev metric of every fine-tuning run (the value of the task's main metric).
HEADLINE_METRIC = "dev.main"


def tag_experiment_kind(experiment: Any) -> None:
    """Tag ``experiment`` (an MLflow ``Experiment``) as a model-training experiment unless it already is.

    A kind someone chose in the UI is kept. A failure only costs the UI's default view: logged, never raised.
    """
    import mlflow

    try:
        if (getattr(experiment, "tags", None) or {}).get(EXPERIMENT_KIND_TAG):
            return
        retry_tracking(mlflow.MlflowClient().set_experiment_tag, attempts=3)(
            experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND
        )
    except Exception as err:  # the UI's default view only
        log.warning(
            "could not tag experiment %s as %s: %s", getattr(experiment, "name", "?"), EXPERIMENT_KIND, err
        )


def rows_digest(rows: Any) -> str:
    """Short sha256 over rows (dicts, JSON with sorted keys): identifies the exact data a stage read."""
    import hashlib
    import json

    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, default=str).encode())
        digest.update(b"\n")
    return digest.hexdigest()[:16]


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
    import json

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
    (context ``evaluation``). ``data`` is a :class:`bert_core.finetune.run.TaskData`."""
    splits = [("train", data.train, "training"), *((s, d, "evaluation") for s, d in data.dev.items())]
    for split, part, context in splits:
        log_dataset(f"{task}-{split}", source=part.source, digest=rows_digest(part.rows), rows=len(part.rows),
                    context=context, tags={"task": task, "split": split})  # fmt: skip


def log_pretrain_data(data_dir: str | os.PathLike[str], phases: list[str]) -> None:
    """The pretraining instances of each phase as dataset inputs; the digest is that of the phase's
    ``train/index.json`` (which lists every shard with its hash), the row count its instances."""
    import hashlib
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
            log_dataset(f"pretrain-{phase}-{split}", source=str(index.parent), rows=int(rows or 0),
                        digest=hashlib.sha256(raw).hexdigest()[:16], context=context,
                        tags={"phase": phase, "split": split})  # fmt: skip


def log_headline_metric(key: str, metrics: dict[str, Any]) -> float | None:
    """Log ``dev.main`` = ``metrics["dev.<key>"]`` (``key``: the task's main metric,
    :func:`bert_core.metrics.main_metric`) and the tag ``main_metric`` = ``key``, so one column compares
    every task's runs. Returns the value (``None`` when the run has no such metric)."""
    import mlflow

    value = metrics.get(f"dev.{key}")
    retry_tracking(mlflow.set_tags)({"main_metric": key})
    if value is None or not math.isfinite(float(value)):
        return None
    retry_tracking(mlflow.log_metrics)({HEADLINE_METRIC: float(value)})
    return float(value)


def experiment_url(ui_url: str, experiment_id: str) -> str:
    """The MLflow UI link that opens an experiment on its runs table.

    MLflow 3.17's UI picks the experiment view from its global GenAI / Model-training switch (the
    ``workflowType`` URL parameter, else the browser's last choice, GenAI by default), not from the
    experiment's ``mlflow.experimentKind`` tag; this link sets the switch (docs/model-cards.md).
    """
    from urllib.parse import quote

    order = quote(f"metrics.`{HEADLINE_METRIC}`", safe="")
    return (
        f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
        f"&orderByKey={order}&orderByAsc=false"
    )


def log_corpus_data(corpus_dir: str | os.PathLike[str], splits: tuple[str, ...] = ("train",)) -> None:
    """The ``corpus`` stage's output as dataset inputs of a later stage (vocab): one per split, the digest
    that of the corpus's ``manifest.json`` (shard list, params hash, statistics), rows its documents."""
    import hashlib
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
        log_dataset(f"corpus-{split}", source=str(Path(corpus_dir)), digest=hashlib.sha256(raw).hexdigest()[:16],
                    rows=int(docs or 0), context="training", tags={"split": split, "unit": "documents"})  # fmt: skip
