"""``make ui``: the MLflow UI over the pipeline's tracking store, with links that open its runs tables.

Why links, and the saved view of the fine-tuning runs: docs/model-cards.md. Ctrl-C or SIGTERM stops the
UI; the exit status is the UI server's (130 / 143 after a signal).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from typing import Any, NamedTuple

from flows._served import is_healthy

#: How long the UI server may take to answer ``/health`` (seconds; its first start migrates the store).
START_TIMEOUT_S = 180.0
#: After Ctrl-C / SIGTERM, how long the UI server may take to shut down before it is killed (seconds).
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


def _wait(proc: subprocess.Popen[bytes], stopped: list[int]) -> int:
    """The server's exit status; once a signal was forwarded, it is killed if still up after a grace period."""
    while True:
        try:
            return proc.wait(timeout=STOP_TIMEOUT_S if stopped else 1.0)
        except subprocess.TimeoutExpired:
            if stopped:
                proc.kill()
                return proc.wait()


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
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store, "--host", args.host]
    proc = subprocess.Popen([*cmd, "--port", str(args.port), "--workers", str(args.workers)])
    stopped: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        stopped.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    # The experiments are listed while the server starts (importing MLflow takes seconds), in a thread, so
    # that a Ctrl-C is never held up by it.
    listed: list[list[str]] = []
    url = f"http://{args.host}:{args.port}"
    threading.Thread(target=lambda: listed.append(_lines(url, store)), daemon=True).start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not stopped and proc.poll() is None and not (listed and is_healthy(url, timeout=5)):
            if time.monotonic() > deadline:
                print(
                    f"ui: mlflow ui did not answer on {url} within {START_TIMEOUT_S:.0f} s", file=sys.stderr
                )
                proc.terminate()
                break
            time.sleep(0.5)
        if not stopped and proc.poll() is None:
            print("\n".join(listed[0]), flush=True)
        code = _wait(proc, stopped)
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
    if stopped:
        return 128 + stopped[0]
    return code


if __name__ == "__main__":
    sys.exit(main())
