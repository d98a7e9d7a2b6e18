"""One way to register a model, used by every stage that produces one (pretrain, finetune).

:func:`register` logs the model directory as an artifact of the stage's run (as an MLflow Model, a
``pyfunc`` that wraps ``bert_core``, when given the task JSON: :mod:`bert_core.serving`), creates the registered model
when it is missing (tolerating another run creating it at the same moment), creates a new version with
its tags and description, and moves an alias to it: always (pretrain's ``newest``), or only when the new
version beats the one the alias points to on a dev metric (finetune's ``champion``). Every registry call
is retried with backoff (:func:`bert_core.tracking.run.retry_tracking`).

Moving the alias is a compare-and-set: two runs of one task that register at the same moment (two pool
workers, parallel experiments) must not both read the old champion, both win, and leave the alias on the
worse version. :func:`alias_lock` serialises the read-compare-set-verify of one registered model:

- a SQLite store (the default): a :class:`filelock.FileLock` next to the database file, one per registered
  model (``.<store>.locks/``). It holds across processes and across hosts that share the file, on a
  filesystem whose ``flock`` reaches every host (local disks, NFSv4; not every network filesystem, where
  SQLite itself is unsafe for concurrent writers anyway);
- a tracking server (``http(s)``) or any other store: MLflow's API has no compare-and-set, so the lock is a
  file in the local temporary directory (it serialises the runs of one host), and every writer re-reads the
  alias after setting it and goes round again when another writer's set landed in between (up to
  :data:`VERIFY_ROUNDS`). Across hosts that narrows the window without closing it: a worse run that read the
  old champion before a better run's set, and sets its own after the better run's read-back, still wins.
  Register the runs of one task from one host, or check the alias afterwards (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_core.tracking.run import retry_tracking, sqlite_store_path, tracking_uri

log = logging.getLogger(__name__)

#: How long a registration waits for another run's alias move on the same registered model.
ALIAS_LOCK_TIMEOUT_S = 120.0
#: Rounds of set-then-verify when another writer's set lands in between (tracking servers).
VERIFY_ROUNDS = 5
#: Version tag naming the rows a version was scored on (:func:`register`'s ``eval_set``).
EVAL_SET_TAG = "eval_set"
#: Its value for the whole official dev split.
WHOLE_DEV = "the whole official dev split"


class AliasLockTimeout(RuntimeError):
    """Another run held a registered model's alias lock for longer than :data:`ALIAS_LOCK_TIMEOUT_S`."""


def alias_lock_path(name: str, uri: str | None = None) -> Path:
    """The lock file that serialises alias moves of registered model ``name`` in the store ``uri``.

    Next to a SQLite store (``<dir>/.<store>.locks/<model>-<hash>.lock``), so that every process and host
    that writes that file shares it; for other stores in the local temporary directory, keyed by store
    and model.
    """
    uri = uri or tracking_uri()
    digest = hashlib.sha256(f"{uri}\0{name}".encode()).hexdigest()[:16]
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64]
    store = sqlite_store_path(uri)
    folder = store.parent / f".{store.name}.locks" if store is not None else Path(tempfile.gettempdir())
    if store is None:
        stem = f"bert-registry-{stem}"
    return folder / f"{stem}-{digest}.lock"


@contextlib.contextmanager
def alias_lock(name: str, *, timeout_s: float | None = None) -> Iterator[None]:
    """Hold the alias lock of registered model ``name`` (see the module docstring for what it covers).

    Raises:
        AliasLockTimeout: another run held it for ``timeout_s`` (default :data:`ALIAS_LOCK_TIMEOUT_S`).
    """
    from filelock import FileLock, Timeout

    path = alias_lock_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    timeout = ALIAS_LOCK_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        with FileLock(str(path), timeout=timeout):
            yield
    except Timeout:
        raise AliasLockTimeout(
            f"registered model {name!r}: another run has held its alias lock {path} for {timeout:.0f} s; "
            f"if no other run is registering {name!r}, that process is stuck: stop it and run again"
        ) from None


@dataclass
class Registration:
    """Outcome of :func:`register`: the new version and whether the alias moved to it."""

    name: str
    version: str
    alias: str
    alias_moved: bool
    value: float | None = None
    previous_version: str | None = None
    previous_value: float | None = None

    def as_tags(self) -> dict[str, str]:
        """Run tags naming the version and the alias move (the fine-tuning run's)."""
        return {
            "registered_model": self.name,
            "registered_version": self.version,
            f"alias_{self.alias}_moved": str(self.alias_moved).lower(),
            f"alias_{self.alias}_version": self.version if self.alias_moved else str(self.previous_version),
        }

    def withdraw(self) -> None:
        """Take this registration back: the alias returns to the version it pointed to before (or is
        removed) and the new version is deleted. For a stage that registers before committing its outputs
        and then fails to commit: the registry must not name a model the workspace does not have."""
        from mlflow import MlflowClient

        client = MlflowClient()
        if self.alias_moved:
            with alias_lock(self.name):  # only while it still points here: a later, better run's move stays
                if _alias_target(client, self.name, self.alias) == self.version:
                    if self.previous_version is not None:
                        retry_tracking(client.set_registered_model_alias)(
                            self.name, self.alias, self.previous_version
                        )
                    else:
                        retry_tracking(client.delete_registered_model_alias)(self.name, self.alias)
        retry_tracking(client.delete_model_version)(self.name, self.version)
        log.warning(
            "withdrew %s version %s (alias %s back on %s)",
            self.name,
            self.version,
            self.alias,
            self.previous_version or "nothing",
        )

    def as_record(self) -> dict[str, Any]:
        """``{"registered_model", "version", "alias"}`` (the pretrain stage's metrics entry)."""
        return {"registered_model": self.name, "version": int(self.version), "alias": self.alias}


def _float(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return -math.inf
    return v if math.isfinite(v) else -math.inf


def _ensure_registered_model(client: Any, name: str, description: str | None) -> None:
    """Create registered model ``name`` unless it exists; a concurrent create by another run is fine."""
    from mlflow.exceptions import MlflowException

    if retry_tracking(client.search_registered_models)(filter_string=f"name = '{name}'"):
        return

    def create() -> None:
        try:
            client.create_registered_model(name, description=description)
        except MlflowException as err:  # created meanwhile by a concurrent run: not worth a retry
            if getattr(err, "error_code", "") != "RESOURCE_ALREADY_EXISTS" and (
                "already exists" not in str(err).lower()
            ):
                raise

    retry_tracking(create)()


def register(
    model_dir: str | Path,
    *,
    name: str,
    run_id: str,
    alias: str,
    description: str | None = None,
    tags: Mapping[str, Any] | None = None,
    version_description: str | None = None,
    metric_key: str | None = None,
    value: float | None = None,
    artifact_path: str = "model",
    save_model: Callable[[Path, Path], Any] | None = None,
    eval_set: str | None = None,
) -> Registration:
    """Log ``model_dir`` to run ``run_id``, register it as a new version of ``name`` and move ``alias``.

    Args:
        model_dir: The model directory (Hugging Face format), logged as the run's ``artifact_path``.
        name: The registered model; created (with ``description``) when missing.
        run_id: The stage's MLflow run.
        alias: The alias to move to the new version.
        description: Of the registered model, when this call creates it.
        tags: Tags of the new version (values are stored as strings).
        version_description: Of the new version.
        metric_key, value: Without them the alias always moves. With them the version also gets the tags
            ``selection_metric`` = ``metric_key`` and ``metric_key`` = ``value``, and the alias moves only when
            ``value`` is strictly greater than the ``metric_key`` tag of the version the alias points to
            now (or when the alias points nowhere / that version has no such tag; NaN never wins).
        eval_set: With ``metric_key``: the rows the score comes from (empty: the whole official dev split),
            kept as the version's :data:`EVAL_SET_TAG`. Scores are compared only on the same rows: a version
            scored on other rows leaves the alias where it is (a score on 4 dev rows never displaces one on
            the whole dev split), except that one scored on the whole official dev split displaces one that
            was not.
        save_model: ``save_model(model_dir, dest)`` writes the MLflow Model of ``model_dir`` to ``dest``
            (:func:`bert_core.serving.mlflow_model`: a ``pyfunc`` with signature and input example that
            holds ``model_dir`` as ``artifacts/hf_model``); that directory is then what is logged, so the
            version loads with ``mlflow.pyfunc.load_model("models:/<name>@<alias>")``. Without it the
            directory's files are logged as they are (not an MLflow Model). The stages always pass it;
            it is a parameter so that this module does not import the model code (the stages' DVC deps).

    Returns:
        The new version and whether the alias moved.
    """
    from mlflow import MlflowClient

    client = MlflowClient()
    if save_model is None:
        retry_tracking(client.log_artifacts)(run_id, str(model_dir), artifact_path=artifact_path)
    else:
        with tempfile.TemporaryDirectory(prefix="mlflow-model-") as tmp:
            save_model(Path(model_dir), Path(tmp) / "model")
            retry_tracking(client.log_artifacts)(
                run_id, str(Path(tmp) / "model"), artifact_path=artifact_path
            )
    _ensure_registered_model(client, name, description)
    version_tags = {str(k): str(v) for k, v in (tags or {}).items()}
    if metric_key is not None:
        version_tags.update({"selection_metric": metric_key, metric_key: repr(float(value))})
        if eval_set is not None:
            eval_set = version_tags[EVAL_SET_TAG] = eval_set or WHOLE_DEV
    mv = retry_tracking(client.create_model_version)(
        name,
        source=f"runs:/{run_id}/{artifact_path}",
        run_id=run_id,
        tags=version_tags,
        description=version_description,
    )
    if metric_key is None:
        with alias_lock(name):
            previous = _alias_target(client, name, alias)
            retry_tracking(client.set_registered_model_alias)(name, alias, mv.version)
        log.info("registered %s version %s (alias %s)", name, mv.version, alias)
        return Registration(name, str(mv.version), alias, True, previous_version=previous)

    moved, previous_version, previous_value = _move_if_better(
        client, name, alias, str(mv.version), metric_key, _float(value), eval_set
    )
    log.info(
        "registered %s version %s (%s=%.4g); alias %s %s",
        name,
        mv.version,
        metric_key,
        value,
        alias,
        "moved" if moved else f"stays on version {previous_version} ({previous_value:.4g})",
    )
    return Registration(
        name,
        str(mv.version),
        alias,
        moved,
        float(value),
        previous_version,
        None if previous_value is None or not math.isfinite(previous_value) else previous_value,
    )


def _alias_target(client: Any, name: str, alias: str) -> str | None:
    """The version ``alias`` of ``name`` points to now (None: nowhere), read from the store."""
    current = retry_tracking(client.get_registered_model)(name).aliases.get(alias)
    return None if current is None else str(current)


def _beats(
    value: float, eval_set: str | None, current: str, tags: Mapping[str, str], metric_key: str
) -> bool:
    """Whether a score ``value`` on ``eval_set`` beats version ``current`` (its ``tags``), as :func:`register`
    says; a move refused because the rows differ is logged with both."""
    current_value = _float(tags.get(metric_key))
    current_set = tags.get(EVAL_SET_TAG)
    if eval_set is None or current_set is None or current_set == eval_set:
        return value > (current_value if current_value is not None else -math.inf)
    if eval_set == WHOLE_DEV:
        return True
    log.info(
        "not compared with version %s: it was scored on %s, this version on %s; the alias stays (set it by "
        "hand to serve this one)",
        current,
        current_set,
        eval_set,
    )
    return False


def _move_if_better(
    client: Any,
    name: str,
    alias: str,
    version: str,
    metric_key: str,
    value: float,
    eval_set: str | None = None,
) -> tuple[bool, str | None, float | None]:
    """Compare-and-set ``alias`` to ``version`` when ``value`` on ``eval_set`` beats the alias's version on
    ``metric_key`` (:func:`_beats`).

    Under :func:`alias_lock`: read the alias and its version's score, compare, set, and read the alias again.
    When the read-back shows another writer's set (possible only where the lock does not reach that writer:
    a tracking server used from several hosts), the comparison is made again against that version.

    Returns:
        Whether the alias moved to ``version``, and the version and score it pointed to before.
    """
    replaced: tuple[str | None, float | None] = (None, None)  # what this run's last set displaced
    with alias_lock(name):
        for _ in range(VERIFY_ROUNDS):
            current = _alias_target(client, name, alias)
            if current == version:  # set by an earlier round, displaced and set back by another writer
                return True, *replaced
            current_value, moved = None, current is None
            if current is not None:
                tags = retry_tracking(client.get_model_version)(name, current).tags or {}
                current_value = _float(tags.get(metric_key))
                moved = _beats(value, eval_set, current, tags, metric_key)
            if moved:
                replaced = (current, current_value)
                retry_tracking(client.set_registered_model_alias)(name, alias, version)
            if _alias_target(client, name, alias) == (version if moved else current):
                return moved, current, current_value
            log.warning("alias %s of %s changed while this run set it; comparing again", alias, name)
    raise RuntimeError(
        f"registered model {name!r}: alias {alias!r} kept changing under concurrent writers in {VERIFY_ROUNDS} "
        f"rounds; read it with `mlflow.MlflowClient().get_model_version_by_alias({name!r}, {alias!r})`"
    )
