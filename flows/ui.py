"""``make ui``: the MLflow UI over the pipeline's tracking store, with links that open its runs tables.

Why links, and the saved view of the fine-tuning runs: docs/model-cards.md. Ctrl-C or SIGTERM stops the
UI server: ``ui interrupted: stopped by SIGINT; the MLflow UI server was stopped``, exit status 130 / 143
(``flows._cli.run_command``, as for every command). A server that never answers is stopped (exit 1); one
that exits by itself gives its own exit status.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from typing import NamedTuple

from flows._cli import run_command, signal_of
from flows._served import is_healthy, stop_process

#: How long the UI server may take to answer ``/health`` (seconds; its first start migrates the store).
START_TIMEOUT_S = 180.0
#: After a signal or the start timeout, how long the UI server may take to stop before it is killed (s).
STOP_TIMEOUT_S = 10.0


class Listed(NamedTuple):
    """A pipeline experiment and the saved runs-table view its link opens (``None``: MLflow's default)."""

    name: str
    experiment_id: str
    view: str | None = None


def pipeline_experiments(store: str) -> list[Listed]:
    """The store's experiments that the pipeline made (tagged model-training), by name; the fine-tuning
    experiment's saved view is written into it now (:func:`bert_core.tracking.ui.save_runs_view`)."""
    from mlflow import MlflowClient

    from bert_core.tracking import FINETUNE_EXPERIMENT
    from bert_core.tracking.run import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG
    from bert_core.tracking.ui import TASK_RUNS_VIEW, save_runs_view

    client = MlflowClient(tracking_uri=store)
    found = client.search_experiments(filter_string=f"tags.`{EXPERIMENT_KIND_TAG}` = '{EXPERIMENT_KIND}'")
    listed = []
    for experiment in sorted(found, key=lambda e: e.name):
        view = TASK_RUNS_VIEW if experiment.name == FINETUNE_EXPERIMENT else None
        saved = view.view_id if view is not None and save_runs_view(client, experiment, view) else None
        listed.append(Listed(experiment.name, experiment.experiment_id, saved))
    return listed


def links(ui_url: str, experiments: list[Listed]) -> list[str]:
    """The lines printed once the UI answers."""
    from bert_core.tracking.ui import experiment_url

    lines = [f"MLflow UI (Model-training view): {ui_url}/#/experiments?workflowType=machine_learning"]
    for name, experiment_id, view in experiments:
        lines.append(f"  {name}: {experiment_url(ui_url, experiment_id, view)}")
    if not experiments:
        lines.append("  (no pipeline runs in this store yet: `make pipeline` writes them)")
    return lines


def _lines(url: str, store: str) -> list[str]:
    try:
        return links(url, pipeline_experiments(store))
    except Exception as err:  # the links are a convenience: the UI runs without them
        return [f"MLflow UI: {url} (could not list the experiments: {type(err).__name__}: {err})"]


def main(argv: list[str] | None = None) -> int:
    from bert_core.tracking.run import tracking_uri

    parser = argparse.ArgumentParser(prog="python -m flows.ui", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--backend-store-uri", default=None, help="default: $MLFLOW_TRACKING_URI or ./mlflow.db"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=1, help="UI server processes (default 1: one user)")
    args = parser.parse_args(argv)
    store = args.backend_store_uri or tracking_uri()
    url = f"http://{args.host}:{args.port}"
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store, "--host", args.host]

    def body() -> int:
        proc = subprocess.Popen([*cmd, "--port", str(args.port), "--workers", str(args.workers)])
        try:
            # The experiments are listed while the server starts (importing MLflow takes seconds), in a
            # thread, so that a Ctrl-C is never held up by it.
            listed: list[list[str]] = []
            threading.Thread(target=lambda: listed.append(_lines(url, store)), daemon=True).start()
            deadline = time.monotonic() + START_TIMEOUT_S
            while proc.poll() is None and not (listed and is_healthy(url, timeout=5)):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"mlflow ui did not answer on {url} within {START_TIMEOUT_S:.0f} s")
                time.sleep(0.5)
            if proc.poll() is None:
                print("\n".join(listed[0]), flush=True)
            return proc.wait()
        except BaseException as err:  # a signal (Interrupted) or the start timeout: the server goes too
            stop_process(proc, STOP_TIMEOUT_S, signal_of(err) or signal.SIGTERM)
            raise

    return run_command(body, "ui", after_stop="; the MLflow UI server was stopped")


if __name__ == "__main__":
    sys.exit(main())
