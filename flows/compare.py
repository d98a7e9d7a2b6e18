"""Compare two pipeline runs or two pretrained models task by task, from MLflow's fine-tuning experiment.

The forms of a side and how reruns count: docs/model-cards.md ("Comparing runs").
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import functools
import io
import json
import math
import re
import sys
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

from bert_core.tracking import (
    FINETUNE_EXPERIMENT,
    TrackingUnavailable,
    check_tracking_server,
    tracking_uri,
)

#: The selected model's scores: every dev split's, and a labelled test set's (not test.baseline.*).
DEFAULT_METRICS = ("dev*", "test.[!b]*")
_LATEST_RE = re.compile(r"^latest(?:~(\d+))?$")
_MODEL_RE = re.compile(r"^(?:models:/)?(?P<name>[^/@\s]+)(?:/(?P<version>\d+)|@(?P<alias>[A-Za-z0-9_-]+))$")


class CompareError(ValueError):
    """A side matched nothing (or several things); the message lists what exists."""


@dataclass
class Side:
    """One side of the comparison: what it resolved to, its run per task."""

    label: str
    runs: dict[str, Any] = field(default_factory=dict)  # task -> mlflow Run


def _client() -> Any:
    from mlflow.tracking import MlflowClient

    uri = tracking_uri()
    # seconds, not MLflow's minutes of retries; and no empty store made at a mistyped path
    check_tracking_server(uri, reading=True)
    return MlflowClient(tracking_uri=uri)


def finetune_runs(client: Any, experiment: str = FINETUNE_EXPERIMENT) -> tuple[str | None, list[Any]]:
    """(experiment id, every run of the fine-tuning experiment that has a ``task`` tag), newest first."""
    from mlflow.utils import get_results_from_paginated_fn

    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None, []

    def page(size: int, token: str | None) -> Any:
        newest = ["attributes.start_time DESC"]
        return client.search_runs([exp.experiment_id], max_results=size, order_by=newest, page_token=token)

    runs = get_results_from_paginated_fn(page, 1000)
    return exp.experiment_id, [r for r in runs if r.data.tags.get("task")]


def pipeline_run_ids(runs: list[Any]) -> list[str]:
    """Distinct ``pipeline_run_id`` tags of the runs that fine-tuned something (finished, with dev
    scores), most recent run first: a failed run is no side for ``latest``."""
    done = [
        r for r in runs if r.info.status == "FINISHED" and any(k.startswith("dev.") for k in r.data.metrics)
    ]
    return list(
        dict.fromkeys(r.data.tags["pipeline_run_id"] for r in done if r.data.tags.get("pipeline_run_id"))
    )


def _model_matches(tags: dict[str, str], name: str, version: str) -> bool:
    value = tags.get("pretrained_model_version", "")
    if value in (f"{name}/{version}", f"models:/{name}/{version}"):
        return True
    return value == version and tags.get("pretrained_model", name) == name


def select(client: Any, spec: str, runs: list[Any]) -> Side:
    """Resolve ``spec`` (a pipeline run id or unique prefix, ``latest[~N]``, or a model version) to its runs,
    else :class:`CompareError` listing the known pipeline runs."""
    ids = pipeline_run_ids(runs)
    known = ", ".join(i[:12] for i in ids[:10]) or "none"

    def pipeline_run(run_id: str) -> Side:
        matched = [r for r in runs if r.data.tags.get("pipeline_run_id") == run_id]
        return _side(f"pipeline run {run_id}", matched)

    if m := _LATEST_RE.match(spec):
        back = int(m.group(1) or 0)
        if back >= len(ids):
            raise CompareError(
                f"'{spec}': only {len(ids)} pipeline run(s) fine-tuned anything (known: {known})"
            )
        return pipeline_run(ids[back])
    if (m := _MODEL_RE.match(spec)) and (m.group("version") or m.group("alias")):
        name, version = m.group("name"), m.group("version")
        if m.group("alias"):
            try:
                version = str(client.get_model_version_by_alias(name, m.group("alias")).version)
            except Exception as err:
                raise CompareError(f"'{spec}': no registered model version with that alias ({err})") from None
        matched = [r for r in runs if _model_matches(r.data.tags, name, str(version))]
        if not matched:
            raise CompareError(f"'{spec}': no fine-tuning run started from model {name} version {version}")
        return _side(f"model {name}/{version}", matched)
    prefixed = [i for i in ids if i.startswith(spec)]
    if spec in ids or len(prefixed) == 1:
        return pipeline_run(spec if spec in ids else prefixed[0])
    if len(prefixed) > 1:
        raise CompareError(f"'{spec}' is ambiguous: {', '.join(prefixed)}")
    raise CompareError(f"'{spec}' matches no pipeline run or model version (recent pipeline runs: {known})")


def _side(label: str, runs: list[Any]) -> Side:
    """Keep one run per task: top-level (not a nested trial), finished if possible, newest."""

    def rank(run: Any) -> tuple[int, int, int]:
        top = "mlflow.parentRunId" not in run.data.tags
        return (int(top), int(run.info.status == "FINISHED"), run.info.start_time or 0)

    side = Side(label)
    for run in sorted(runs, key=rank, reverse=True):
        side.runs.setdefault(run.data.tags["task"], run)
    return side


def comparison_rows(a: Side, b: Side, patterns: tuple[str, ...] = DEFAULT_METRICS) -> list[dict[str, Any]]:
    """One row per (task, metric) present on either side: ``task, metric, a, b, delta``."""
    rows = []
    for task in sorted(set(a.runs) | set(b.runs)):
        ma = a.runs[task].data.metrics if task in a.runs else {}
        mb = b.runs[task].data.metrics if task in b.runs else {}
        keys = sorted(k for k in set(ma) | set(mb) if any(fnmatch.fnmatchcase(k, p) for p in patterns))
        for key in keys:
            va, vb = ma.get(key), mb.get(key)
            delta = vb - va if va is not None and vb is not None else None
            rows.append({"task": task, "metric": key, "a": va, "b": vb, "delta": delta})
    return rows


#: Tags that say what a fine-tuning run started from; compared beside its params.
SOURCE_TAGS = ("pretrained_model_version", "pretrained_model")


def setting_changes(a: Side, b: Side) -> list[dict[str, Any]]:
    """One row per (task, setting) that differs between the sides, for the tasks both ran: the run's params
    and what it started from (:data:`SOURCE_TAGS`). A metric delta reads only beside what changed."""

    def settings(run: Any) -> dict[str, str]:
        return {**run.data.params, **{k: run.data.tags[k] for k in SOURCE_TAGS if k in run.data.tags}}

    rows = []
    for task in sorted(set(a.runs) & set(b.runs)):
        sa, sb = settings(a.runs[task]), settings(b.runs[task])
        for key in sorted(k for k in set(sa) | set(sb) if sa.get(k) != sb.get(k)):
            rows.append({"task": task, "setting": key, "a": sa.get(key), "b": sb.get(key)})
    return rows


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.4g}" if signed else f"{value:.4g}"


def render(
    rows: list[dict[str, Any]], a: Side, b: Side, fmt: str = "text", changes: Sequence[dict[str, Any]] = ()
) -> str:
    """The metrics table as aligned text, Markdown, CSV or JSON; ``changes`` (the settings that differ,
    :func:`setting_changes`) before it, except in CSV (one table)."""
    if fmt == "json":
        return json.dumps({"a": a.label, "b": b.label, "changes": list(changes), "rows": rows}, indent=2)
    header = ["task", "metric", "A", "B", "B - A"]
    body = [[r["task"], r["metric"], _fmt(r["a"]), _fmt(r["b"]), _fmt(r["delta"], signed=True)] for r in rows]
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["task", "metric", "a", "b", "delta"])
        writer.writerows([[r["task"], r["metric"], r["a"], r["b"], r["delta"]] for r in rows])
        return buf.getvalue().rstrip("\n")
    # disable_numparse: the cells are already formatted (``+3.5``, ``-``) and stay as they are.
    table = functools.partial(
        tabulate, body, header, colalign=("left", "left", "right", "right", "right"), disable_numparse=True
    )
    style = "pipe" if fmt == "markdown" else "simple"
    sides = f"A = {a.label}, B = {b.label}" if fmt == "markdown" else f"A = {a.label}\nB = {b.label}"
    differ = [[c["task"], c["setting"], c["a"] or "-", c["b"] or "-"] for c in changes]
    if differ:
        settings = tabulate(differ, ["task", "setting", "A", "B"], tablefmt=style, disable_numparse=True)
        sides += f"\n\nSettings that differ (tasks both sides ran):\n\n{settings}"
    else:
        sides += "\n\nSettings that differ (tasks both sides ran): none"
    return f"{sides}\n\n" + table(tablefmt=style)


def ui_link(experiment_id: str, a: Side, b: Side, base: str = "http://127.0.0.1:5000") -> str:
    """The MLflow UI page that shows both sides' runs side by side."""
    run_ids = [r.info.run_id for side in (a, b) for r in side.runs.values()]
    query = urllib.parse.urlencode(
        {"runs": json.dumps(list(dict.fromkeys(run_ids))), "experiments": json.dumps([experiment_id])}
    )
    return f"{base}/#/compare-runs?{query}"


def compare(spec_a: str, spec_b: str, patterns: tuple[str, ...] = DEFAULT_METRICS, fmt: str = "text") -> str:
    """Resolve both sides in the fine-tuning experiment and render their per-task comparison."""
    client = _client()
    exp_id, runs = finetune_runs(client)
    if exp_id is None or not runs:
        raise CompareError(
            f"no fine-tuning runs in MLflow experiment '{FINETUNE_EXPERIMENT}' at {tracking_uri()} "
            "(run the pipeline first, or set MLFLOW_TRACKING_URI to the store it wrote)"
        )
    a, b = select(client, spec_a, runs), select(client, spec_b, runs)
    text = render(comparison_rows(a, b, patterns), a, b, fmt, setting_changes(a, b))
    if fmt in ("text", "markdown"):
        text += f"\n\nSide by side in the MLflow UI (make ui): {ui_link(exp_id, a, b)}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "a", help="pipeline run id (or prefix), latest[~N], or model name/version | name@alias"
    )
    parser.add_argument("b", help="the other side, same forms")
    parser.add_argument(
        "--metric",
        action="append",
        default=None,
        help="glob of metric keys to show (default: dev* and test.[!b]*, a labelled test set's); repeatable",
    )
    parser.add_argument("--format", choices=("text", "markdown", "csv", "json"), default="text")
    args = parser.parse_args(argv)
    try:
        print(compare(args.a, args.b, tuple(args.metric or DEFAULT_METRICS), args.format))
    except (CompareError, TrackingUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
