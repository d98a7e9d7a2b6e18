"""The whole pipeline as one Prefect flow over DVC: ``bert-pipeline``.

The flow runs ``dvc exp run`` (default; ``dvc repro`` with ``as_experiment=False``) in the repository, so
DVC's caching decides what reruns and every UI-triggered run is a DVC experiment (params recorded,
``dvc exp apply <name>`` restores it). It follows DVC's output and shows each stage as a Prefect task run
named after the stage, with the stage's log lines, its state (``Completed``, ``Cached`` when DVC skipped it,
``Failed``) and its metrics (the stage's ``metrics:`` files) as a Markdown artifact; a summary artifact
lists every stage.

Params come from a named profile (``params/profiles/<name>.yaml``, see :mod:`flows.profiles`), the typed
form fields below (preset, tasks, steps, learning rates, seeds, time budget) and free ``-S`` overrides,
in that order. Every stage's MLflow run is tagged with ``pipeline_run_id`` (the Prefect flow run id), so
``python -m flows.compare`` and the MLflow UI find one pipeline run's runs together.

Concurrency: runs of one workspace queue behind a file lock (``.dvc/tmp/bert-pipeline.lock``); ``make
serve`` also serves with ``limit=1``. Nothing here is retried: a stage that fails once fails again with the
same inputs (tracking calls inside stages are retried where they are made).

Command line (what ``make pipeline`` runs)::

    python -m flows.pipeline                          # dvc repro, params as they are
    python -m flows.pipeline --profile gpu-base       # apply a profile, then dvc repro
    python -m flows.pipeline --experiment -S params/finetune.yaml:finetune.defaults.seeds=[1,2]

From the command line the flow reports to the Prefect server of ``make serve`` when one serves this
repository (so the run shows in its UI), else to a temporary local server.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import re
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

# Telemetry off and Prefect's start-up timeout are set by flows/__init__.py, before Prefect is imported.
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed
from pydantic import Field

from flows import TELEMETRY_OFF, _dvc, profiles
from flows._stage import REPO_ROOT, markdown_table, tracking_uri

FLOW_NAME = "bert-pipeline"
_PROFILE_NAMES = tuple(profiles.list_profiles(REPO_ROOT))
ProfileName = Literal[_PROFILE_NAMES] if _PROFILE_NAMES else str  # type: ignore[valid-type]
Preset = Literal["tiny", "mini", "small", "medium", "base", "large"]

try:
    from bert_core.tasks import TASKS as _TASKS

    TaskName = Literal[tuple(_TASKS)]  # type: ignore[valid-type]
except ImportError:  # pragma: no cover - the task registry is part of the package
    TaskName = str  # type: ignore[misc,assignment]

FORM_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    "preset": (("params/pretrain.yaml", "pretrain.model.preset"),),
    "pretrain_steps": (("params/pretrain.yaml", "pretrain.max_steps"),),
    "time_budget_minutes": (("params/pretrain.yaml", "pretrain.time_budget_minutes"),),
    "tasks": (("params/finetune.yaml", "finetune.tasks"),),
    "learning_rates": (("params/finetune.yaml", "finetune.defaults.learning_rates"),),
    "seeds": (
        ("params/finetune.yaml", "finetune.defaults.seeds"),
        ("params/finetune.yaml", "finetune.small_task_seeds"),
    ),
}
"""Form field -> the params keys it sets (checked against ``params/`` by the tests)."""
TASKS_KEY = ("params/finetune.yaml", "finetune.tasks")
"""``finetune.tasks`` maps each task to run to its own overrides (DVC's ``foreach`` makes one stage each)."""
PER_TASK_FIELDS = ("learning_rates", "seeds")
"""Form fields that also clear a task's own setting of the same name, so the form value holds for all."""

_EXP_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class PipelineFailed(RuntimeError):
    """DVC exited non-zero; the message names the failed stage and DVC's last lines."""


def _slug(text: str) -> str:
    return re.sub(r"-+", "-", "".join(c if c.isalnum() else "-" for c in text.lower())).strip("-")


# ------------------------------------------------------------------------------------ per-stage tasks


_END = object()


class StageFeed:
    """The log lines of one running stage, handed from the flow (reading DVC) to the stage's task."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self.outcome: str | None = None

    def put(self, line: str) -> None:
        self._queue.put(line)

    def close(self, outcome: str) -> None:
        self.outcome = outcome
        self._queue.put(_END)

    def __iter__(self) -> Iterator[str]:
        while (item := self._queue.get()) is not _END:
            yield item


def read_stage_metrics(root: Path, files: tuple[str, ...]) -> dict[str, Any]:
    """The stage's DVC metrics files merged into one mapping (file stem as prefix when several)."""
    import json

    import yaml

    out: dict[str, Any] = {}
    for rel in files:
        path = root / rel
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (ValueError, OSError):
            continue
        if isinstance(data, dict):
            out.update(data if len(files) == 1 else {Path(rel).stem: data})
    return out


def _artifact(key: str, markdown: str, description: str) -> None:
    """A Markdown artifact in the Prefect UI: a convenience, so a failure to create one is only logged."""
    try:
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(key=key, markdown=markdown, description=description)
    except Exception as err:
        get_run_logger().warning("could not create the Prefect artifact %s: %s", key, err)


@task(name="dvc-stage", task_run_name="{stage}", cache_policy=NO_CACHE, retries=0)
def follow_stage(stage: str, feed: StageFeed, root: str, metrics_files: tuple[str, ...]) -> Any:
    """One DVC stage as seen from the pipeline: its log lines, then its outcome and metrics."""
    logger = get_run_logger()
    for line in feed:
        logger.info(line)
    metrics = read_stage_metrics(Path(root), metrics_files)
    if metrics:
        _artifact(
            f"pipeline-{_slug(stage)}", markdown_table(metrics, f"{stage} metrics"), f"Metrics of {stage}"
        )
    result = {"stage": stage, "outcome": feed.outcome, "metrics": metrics}
    if feed.outcome == "failed":
        raise PipelineFailed(f"stage '{stage}' failed; its log above shows why")
    if feed.outcome == "cached":
        return Completed(name="Cached", message="unchanged since the last run: DVC skipped it", data=result)
    return result


# ----------------------------------------------------------------------------------------- the driver


@dataclass
class StageReport:
    stage: str
    outcome: str  # ran | cached | failed | not run
    seconds: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)


def start_dvc(args: list[str], *, cwd: Path, env: dict[str, str]) -> _dvc.DvcRun:
    """Start DVC (tests replace this with a scripted fake)."""
    return _dvc.DvcProcess(args, cwd=cwd, env=env)


def drive(args: list[str], *, root: Path, env: dict[str, str]) -> tuple[int, list[StageReport], list[str]]:
    """Run DVC, follow its stage announcements and hand each stage's lines to a ``follow_stage`` task.

    Returns:
        DVC's exit code, one report per stage DVC mentioned (in order), and DVC's last 40 lines.
    """
    logger = get_run_logger()
    infos: dict[str, _dvc.StageInfo] | None = None
    reports: list[StageReport] = []
    futures: list[Any] = []
    tail: list[str] = []
    current: tuple[StageReport, StageFeed, float] | None = None

    def metrics_files(stage: str) -> tuple[str, ...]:
        nonlocal infos
        if infos is None or stage not in infos:
            try:
                infos = {i.name: i for i in _dvc.stage_infos(root)}
            except Exception as err:  # the summary still works without metrics
                logger.warning("could not read the stage list from dvc.yaml: %s", err)
                infos = {}
        info = infos.get(stage)
        return info.metrics if info else ()

    def finish(outcome: str) -> None:
        nonlocal current
        if current is not None:
            report, feed, started = current
            report.outcome, report.seconds = outcome, time.monotonic() - started
            feed.close(outcome)
            current = None

    def submit(stage: str, feed: StageFeed) -> None:
        futures.append(follow_stage.submit(stage, feed, str(root), metrics_files(stage)))

    proc = start_dvc(args, cwd=root, env=env)
    try:
        for line in proc.lines():
            tail = [*tail[-39:], line]
            event = _dvc.parse_line(line)
            if event.kind == "running":
                finish("ran")
                report, feed = StageReport(event.stage or "?", "running"), StageFeed()
                reports.append(report)
                current = (report, feed, time.monotonic())
                submit(report.stage, feed)
                feed.put(line)
            elif event.kind == "skipped":
                finish("ran")
                feed = StageFeed()
                reports.append(StageReport(event.stage or "?", "cached"))
                submit(event.stage or "?", feed)
                feed.close("cached")
            elif event.kind == "failed" and current is not None and current[0].stage == event.stage:
                current[1].put(line)
                finish("failed")
            elif current is not None:
                current[1].put(line)
            else:
                logger.info(line)
        returncode = proc.wait()
    finally:
        proc.stop()
        finish("ran" if proc.wait() == 0 else "failed")
    for future in futures:
        future.wait()
    for report in reports:
        if report.outcome in ("ran", "cached"):
            report.metrics = read_stage_metrics(root, metrics_files(report.stage))
    return returncode, reports, tail


def summary_markdown(
    run_id: str, exp_name: str | None, command: list[str], reports: list[StageReport], ok: bool
) -> str:
    lines = [f"## Pipeline run `{run_id}`: {'completed' if ok else 'FAILED'}", ""]
    if exp_name:
        lines += [f"DVC experiment **`{exp_name}`**: restore it with `dvc exp apply {exp_name}`.", ""]
    lines += [f"Command: `{' '.join(command)}`", "", "| stage | outcome | seconds |", "|---|---|---|"]
    lines += [f"| {r.stage} | {r.outcome} | {r.seconds:.1f} |" for r in reports]
    lines += [
        "",
        f"MLflow: every stage run is tagged `pipeline_run_id={run_id}`; compare two runs with "
        f"`python -m flows.compare {run_id} <other run id>`.",
    ]
    return "\n".join(lines)


def _current_api_url() -> str | None:
    """The Prefect API this process reports to (also the temporary one), so stage flows report there too."""
    with contextlib.suppress(Exception):
        from prefect.settings import PREFECT_API_URL

        if url := PREFECT_API_URL.value():
            return url
        module = sys.modules.get("prefect.server.api.server")  # loaded iff a temporary server was started
        if module is not None:
            server = module.SubprocessASGIServer()
            if server.server_process is not None and server.server_process.poll() is None:
                return server.api_url
    return None


def stage_env(run_id: str, data_root: str | None, root: Path) -> dict[str, str]:
    """Environment of the DVC process and the stage commands it runs."""
    env = dict(os.environ)
    env["BERT_PIPELINE_RUN_ID"] = run_id
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python` = this venv
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MLFLOW_TRACKING_URI", tracking_uri())
    for key, value in TELEMETRY_OFF.items():
        env.setdefault(key, value)
    if api := _current_api_url():
        env["PREFECT_API_URL"] = api
    if data_root is not None:
        if data_root.strip().lower() == "hub":
            env.pop("BERT_DATA_ROOT", None)
        else:
            path = (root / Path(data_root).expanduser()).resolve()
            if not path.is_dir():
                raise ValueError(
                    f"data_root={data_root!r}: {path} is not a directory. Give a data root laid out like "
                    "shared/data, 'hub' for the Hugging Face Hub, or leave it empty to keep BERT_DATA_ROOT."
                )
            env["BERT_DATA_ROOT"] = str(path)
    elif env.get("BERT_DATA_ROOT"):
        env["BERT_DATA_ROOT"] = str((root / env["BERT_DATA_ROOT"]).resolve())
    return env


def form_overrides(fields: dict[str, Any], base: profiles.Overrides, root: Path) -> profiles.Overrides:
    """The params overrides of the form fields that were set (``None`` keeps the profile's value).

    Args:
        fields: Form field name -> value.
        base: The profile's overrides; ``tasks`` keeps each chosen task's settings from it.
        root: Repository root.
    """
    out: profiles.Overrides = {}
    for name, value in fields.items():
        if value is None or name == "tasks":
            continue
        for file, key in FORM_KEYS[name]:
            out.setdefault(file, {})[key] = list(value) if isinstance(value, tuple | list) else value
    cleared = [f for f in PER_TASK_FIELDS if fields.get(f) is not None]
    if fields.get("tasks") is None and not cleared:
        return out
    file, key = TASKS_KEY
    current = profiles.get_dotted(profiles.effective_params(file, base, root), key)
    current = current if isinstance(current, dict) else {}
    chosen = fields.get("tasks")
    names = list(dict.fromkeys(chosen)) if chosen is not None else list(current)
    tasks = {t: {k: v for k, v in (current.get(t) or {}).items() if k not in cleared} for t in names}
    if tasks != current:
        out.setdefault(file, {})[key] = tasks
    return out


def build_overrides(
    profile: str | None, fields: dict[str, Any], extra: list[str], root: Path
) -> profiles.Overrides:
    """Profile, then form fields, then free ``-S`` overrides; only what differs from the workspace."""
    base = profiles.resolve(profile, None, root, only_changes=False) if profile else {}
    layer = profiles.merge(form_overrides(fields, base, root), profiles.parse_set_args(extra))
    return profiles.resolve(profile, layer, root)


def dvc_command(
    *,
    as_experiment: bool,
    exp_name: str | None,
    overrides: profiles.Overrides,
    targets: list[str],
    force: bool,
) -> list[str]:
    """The DVC arguments (after ``dvc``) for this run."""
    if as_experiment:
        args = ["exp", "run", "--name", exp_name or "", *profiles.set_args(overrides)]
    else:
        args = ["repro"]
    if force:
        args.append("--force")
    return args + list(targets)


@flow(name=FLOW_NAME, log_prints=True, retries=0, validate_parameters=True)
def pipeline_flow(
    profile: ProfileName | None = profiles.DEFAULT_PROFILE,  # type: ignore[valid-type]
    preset: Preset | None = None,
    tasks: list[TaskName] | None = None,  # type: ignore[valid-type]
    pretrain_steps: Annotated[int, Field(ge=1)] | None = None,
    learning_rates: list[Annotated[float, Field(gt=0)]] | None = None,
    seeds: list[int] | None = None,
    time_budget_minutes: Annotated[float, Field(gt=0)] | None = None,
    data_root: str | None = None,
    extra_overrides: list[str] | None = None,
    targets: list[str] | None = None,
    as_experiment: bool = True,
    experiment_name: str | None = None,
    force: bool = False,
    lock_timeout_minutes: Annotated[float, Field(ge=0)] = 24 * 60,
) -> dict[str, Any]:
    """Run the BERT pipeline through DVC: corpus, vocab, pretraining data, pretraining, fine-tuning, evaluation.

    Args:
        profile: Named params profile (params/profiles/); empty keeps the workspace params as they are.
        preset: Model size preset for pretraining (overrides the profile).
        tasks: Fine-tuning tasks to run (overrides the profile), e.g. ["sst2", "mrpc"].
        pretrain_steps: Pretraining optimiser steps (overrides the profile).
        learning_rates: Fine-tuning learning-rate grid, e.g. [5e-5, 3e-5, 2e-5].
        seeds: Fine-tuning seeds, e.g. [1, 2, 3].
        time_budget_minutes: Wall-clock budget for pretraining; it stops and saves when reached.
        data_root: Local data root laid out like shared/data (offline); "hub" for the Hugging Face Hub;
            empty keeps the server's BERT_DATA_ROOT.
        extra_overrides: More params overrides as DVC -S arguments, e.g. params/vocab.yaml:vocab.vocab_size=8000.
        targets: Run only these DVC stages (and whatever they need), e.g. ["vocab"]; empty runs all.
        as_experiment: Record the run as a DVC experiment (dvc exp run); off runs dvc repro and writes the
            overrides into the params files.
        experiment_name: Name of the DVC experiment (default: the flow run's name and id).
        force: Rerun stages even when DVC finds them unchanged.
        lock_timeout_minutes: How long to wait for another pipeline run on this workspace to finish.

    Returns:
        pipeline_run_id, dvc_experiment, command, overrides and each stage's outcome and metrics.
    """
    from prefect.runtime import flow_run

    logger = get_run_logger()
    root = REPO_ROOT
    run_id = str(flow_run.id or uuid.uuid4())
    exp_name = None
    if as_experiment:
        exp_name = experiment_name or f"{flow_run.name or 'run'}-{run_id[:6]}"
        if not _EXP_NAME_RE.match(exp_name):
            raise ValueError(
                f"experiment_name={exp_name!r}: use letters, digits, '.', '_' and '-' (a git ref name)"
            )
    fields = {
        "preset": preset,
        "tasks": tasks,
        "pretrain_steps": pretrain_steps,
        "learning_rates": learning_rates,
        "seeds": seeds,
        "time_budget_minutes": time_budget_minutes,
    }
    env = stage_env(run_id, data_root, root)

    holder = f"pipeline run {run_id} ({exp_name or 'dvc repro'})"
    with _dvc.workspace_lock(
        root,
        holder=holder,
        timeout_s=lock_timeout_minutes * 60,
        on_wait=lambda who: logger.info("waiting for the workspace: %s is running", who),
    ):
        overrides = build_overrides(profile, fields, list(extra_overrides or []), root)
        logger.info("pipeline run %s, profile %s, overrides %s", run_id, profile or "(workspace)", overrides)
        if not as_experiment and overrides:
            for path in profiles.apply(overrides, root):
                logger.info("wrote overrides into %s", path.relative_to(root))
        args = dvc_command(
            as_experiment=as_experiment,
            exp_name=exp_name,
            overrides=overrides,
            targets=list(targets or []),
            force=force,
        )
        logger.info("running: dvc %s", " ".join(args))
        returncode, reports, tail = drive(args, root=root, env=env)

    ok = returncode == 0
    if not ok and not targets:
        with contextlib.suppress(Exception):  # the summary lists what never ran, when dvc.yaml is readable
            seen = {r.stage for r in reports}
            reports += [StageReport(i.name, "not run") for i in _dvc.stage_infos(root) if i.name not in seen]
    summary = summary_markdown(run_id, exp_name if ok else None, ["dvc", *args], reports, ok)
    _artifact("pipeline-summary", summary, f"Pipeline run {run_id}")
    if not ok:
        failed = [r.stage for r in reports if r.outcome == "failed"]
        where = f"stage '{failed[0]}' failed" if failed else "DVC failed before running a stage"
        raise PipelineFailed(
            f"{where} (dvc exit code {returncode}). Last DVC output:\n" + "\n".join(tail[-15:])
        )
    return {
        "pipeline_run_id": run_id,
        "dvc_experiment": exp_name,
        "command": ["dvc", *args],
        "overrides": overrides,
        "stages": {r.stage: {"outcome": r.outcome, "metrics": r.metrics} for r in reports},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="DVC stages to run (default: all)")
    parser.add_argument("--profile", choices=_PROFILE_NAMES, help="apply a named profile first")
    parser.add_argument("--experiment", action="store_true", help="run as a DVC experiment (dvc exp run)")
    parser.add_argument("--name", help="DVC experiment name (with --experiment)")
    parser.add_argument(
        "-S", "--set-param", dest="sets", action="append", default=[], metavar="FILE:KEY=VALUE"
    )
    parser.add_argument("--data-root", help="local data root (offline), or 'hub'; default: $BERT_DATA_ROOT")
    parser.add_argument("--force", action="store_true", help="rerun stages even if unchanged")
    args = parser.parse_args(argv)
    settings: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if not os.environ.get("PREFECT_API_URL"):
        from flows._served import served_api_url

        home = Path(os.environ.get("PREFECT_HOME") or REPO_ROOT / ".prefect")
        if url := served_api_url(home):
            from prefect.settings import PREFECT_API_URL, temporary_settings

            print(f"reporting to the Prefect server of `make serve` at {url}", file=sys.stderr)
            settings = temporary_settings(updates={PREFECT_API_URL: url})
    try:
        with settings:
            result = pipeline_flow(
                profile=args.profile,
                extra_overrides=args.sets,
                targets=args.targets,
                as_experiment=args.experiment,
                experiment_name=args.name,
                data_root=args.data_root,
                force=args.force,
            )
    except (PipelineFailed, profiles.ProfileError, _dvc.WorkspaceBusy, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for stage, info in result["stages"].items():
        print(f"{stage:28s} {info['outcome']}")
    print(f"pipeline_run_id={result['pipeline_run_id']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
