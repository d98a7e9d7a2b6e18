"""Where tracking goes, and the SQLite store's life in a process: created whole, watched, required by readers.

:func:`tracking_uri` is ``MLFLOW_TRACKING_URI`` or the repository's SQLite file. A stage run creates the
repository's store whole or not at all (:func:`ensure_tracking_store`) and watches it (:func:`watch_store`):
a store removed or replaced mid-run is named at once (:func:`check_store_present`), and MLflow's pooled
connections to it are closed (:func:`forget_store_connections`). A command that only reads (comparing runs,
loading a registered model) requires the store to exist (:func:`require_store`) instead of letting MLflow
create an empty one.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from pathlib import Path

from bert_core.atomic import writer_gone
from bert_core.constants import REPO_ROOT


class TrackingUnavailable(RuntimeError):
    """The tracking server of ``MLFLOW_TRACKING_URI`` does not answer (or refuses this client), or a reader's
    SQLite store does not exist."""


class TrackingStoreRemoved(RuntimeError):
    """The SQLite tracking store was deleted or replaced while a stage was using it."""


def default_store_uri() -> str:
    """The repository's own SQLite store (used when ``MLFLOW_TRACKING_URI`` is not set)."""
    return f"sqlite:///{REPO_ROOT / 'mlflow.db'}"


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` or the repository's SQLite store (absolute, so the cwd does not matter)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or default_store_uri()


def sqlite_store_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


#: The identity (device, inode) of each SQLite store a stage run opened in this process.
_watched_stores: dict[Path, tuple[int, int]] = {}
_watched_lock = threading.Lock()


def watch_store(uri: str) -> None:
    """Remember the identity of a SQLite store so that its removal mid-run is recognised."""
    path = sqlite_store_path(uri)
    if path is None:
        return
    try:
        st = path.stat()
    except OSError:
        return
    with _watched_lock:
        _watched_stores[path] = (st.st_dev, st.st_ino)


def forget_store_connections(path: Path) -> None:
    """Close MLflow's pooled connections to a SQLite store, so the next use opens the file at ``path`` again.

    SQLite connections keep a removed file's inode open ("attempt to write a readonly database"); MLflow
    caches one engine per URI for the life of the process. Best effort: these are MLflow internals.
    """
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore

    for store_cls in (TrackingStore, RegistryStore):
        for uri, engine in list(getattr(store_cls, "_engine_map", {}).items()):
            if sqlite_store_path(uri) == path:
                with contextlib.suppress(Exception):
                    engine.dispose()
    with _watched_lock:
        _watched_stores.pop(path, None)


def check_store_present(uri: str) -> None:
    """Raise :class:`TrackingStoreRemoved` if the watched SQLite store of ``uri`` is gone or replaced."""
    path = sqlite_store_path(uri)
    if path is None:
        return
    with _watched_lock:
        identity = _watched_stores.get(path)
    if identity is None:
        return
    try:
        st = path.stat()
        if (st.st_dev, st.st_ino) == identity:
            return
        what = "replaced by another file"
    except FileNotFoundError:
        what = "removed"
    except OSError:
        return
    raise TrackingStoreRemoved(
        f"the MLflow store {path} was {what} while the stage ran; this run's tracking records are lost. "
        "Restore the file from a backup (or let the next run create a new store) and re-run the stage"
    )


def ensure_tracking_store(uri: str) -> None:
    """Create a new SQLite tracking store whole or not at all (other stores: nothing to do).

    MLflow creates its schema table by table, then migrates it; a stage killed during that first
    initialisation would leave a half-created database on which every later run fails ("table ... already
    exists"). The schema is built in a temporary file and linked into place only when complete; when
    another process got there first, its store is kept.
    """
    if (path := sqlite_store_path(uri)) is None:
        return
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a process killed while creating it
        pid = stale.name.rsplit(".tmp-", 1)[1].split("-", 1)[0]
        if pid.isdigit() and writer_gone(int(pid), stale):
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


def require_store(uri: str) -> None:
    """Refuse a ``sqlite:///`` store that does not exist, for a command that only reads it (MLflow would
    create an empty one there, and its folders: a mistyped URI would then read as "no runs").

    Raises:
        TrackingUnavailable: naming the path and what to do.
    """
    if (store := sqlite_store_path(uri)) is not None and not store.is_file():
        raise TrackingUnavailable(
            f"no MLflow tracking store at {store}: nothing has been tracked there yet (run the pipeline "
            "first, or point MLFLOW_TRACKING_URI at the store it wrote)"
        )
