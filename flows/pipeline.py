"""The whole pipeline as one Prefect flow over DVC: ``bert-pipeline``.

It runs ``dvc repro`` (or ``dvc exp run``) and shows each stage as a Prefect task run with its log lines,
state (``Completed``, ``Cached``, ``Failed``) and metrics; with ``jobs`` > 1 the stages whose inputs are
ready run at once, each its own ``dvc repro --single-item`` on its own GPUs or share of the cores. Params
come from a profile, the form fields and ``-S`` overrides, in that order; every stage's MLflow run is tagged
with ``pipeline_run_id``. Behaviour under failures and signals: docs/reliability.md.

    python -m flows.pipeline                          # dvc repro, params as they are
    python -m flows.pipeline --profile gpu-base       # apply a profile, then dvc repro
    python -m flows.pipeline --experiment -S params/finetune.yaml:finetune.defaults.seeds=[1,2]

:mod:`flows._inputs` maps the form to overrides, :mod:`flows._driver` follows DVC as task runs,
:mod:`flows._dvc` is the DVC plumbing, :mod:`flows._prefect_api` the one Prefect API every stage reports to.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, Literal

# Telemetry off and Prefect's start-up timeout are set by flows/__init__.py, before Prefect is imported.
from prefect import flow, get_run_logger
from pydantic import Field

from bert_core.constants import REPO_ROOT
from flows import _dvc, _fanout, profiles
from flows._driver import PipelineFailed, StageReport, drive, fan_out, summary_markdown
from flows._inputs import FORM_KEYS, data_root_dir, dvc_command, resolve_overrides, run_inputs, stage_env
from flows._stage import markdown_artifact
from flows.overrides import ProfileError

FLOW_NAME = "bert-pipeline"
_PROFILE_NAMES = tuple(profiles.list_profiles(REPO_ROOT))
ProfileName = Literal[_PROFILE_NAMES] if _PROFILE_NAMES else str  # type: ignore[valid-type]
Preset = Literal["tiny", "mini", "small", "medium", "base", "large"]


def _task_names() -> tuple[str, ...]:
    """The form's tasks: the paper's, and the own tasks ``params/finetune.yaml`` declares (when it is valid:
    else the stage names the problem)."""
    from bert_core.finetune.params import FinetuneParams
    from bert_core.params import load_params
    from bert_core.tasks import TASKS

    try:
        own = load_params(REPO_ROOT / "params" / "finetune.yaml", "finetune", FinetuneParams).own_tasks()
    except (OSError, ValueError):
        own = {}
    return (*TASKS, *own)


TaskName = Literal[_task_names()]  # type: ignore[valid-type]


_EXP_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


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
    jobs: Annotated[int, Field(ge=1)] | None = None,
    fail_fast: bool = False,
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
        as_experiment: Record the run as a DVC experiment; off runs dvc repro and writes the overrides into
            the params files.
        experiment_name: Name of the DVC experiment (default: the flow run's name and id).
        force: Rerun stages even when DVC finds them unchanged.
        jobs: Stages at once (independent ones: the fine-tuning tasks), each on its own GPUs or share of
            the cores; empty: one per GPU, else 2 on a CPU. More than the GPUs makes stages share them.
        fail_fast: When a stage fails, start no more stages (the running ones finish).
        lock_timeout_minutes: How long to wait for another pipeline run on this workspace to finish.

    Returns:
        pipeline_run_id, dvc_experiment, command, overrides, jobs and each stage's outcome and metrics.
    """
    given = SimpleNamespace(**locals())  # the parameters, by name, for the steps below
    from prefect.runtime import flow_run

    run_id = str(flow_run.id or uuid.uuid4())
    exp_name = _experiment_name(experiment_name, flow_run.name, run_id) if as_experiment else None
    return _run(run_id, exp_name, given)


def _run(run_id: str, exp_name: str | None, given: SimpleNamespace) -> dict[str, Any]:
    """The pipeline run: the workspace lock, the params, DVC (one process, or a stage each), the summary."""
    logger, root = get_run_logger(), REPO_ROOT
    fields = {name: getattr(given, name) for name in FORM_KEYS}
    env = stage_env(run_id, given.data_root, root)
    with _dvc.workspace_lock(
        root,
        holder=f"pipeline run {run_id} ({exp_name or 'dvc repro'})",
        timeout_s=given.lock_timeout_minutes * 60,
        on_wait=lambda who: logger.info("waiting for the workspace: %s is running", who),
    ):
        sets = list(given.extra_overrides or [])
        inputs = run_inputs(given.profile, fields, sets, root, targets=given.targets, log=logger.info)
        overrides, targets = inputs.overrides, inputs.targets  # targets: e.g. released runs evaluate only
        logger.info(
            "pipeline run %s, profile %s, overrides %s", run_id, given.profile or "(workspace)", overrides
        )
        jobs, slots = _shares(given.jobs, logger)
        if (jobs > 1 or exp_name is None) and overrides:  # dvc exp run writes them itself
            for path in profiles.apply(overrides, root):
                logger.info("wrote overrides into %s", path.relative_to(root))
        if jobs == 1:
            args = dvc_command(
                as_experiment=exp_name is not None,
                exp_name=exp_name,
                overrides=overrides,
                targets=targets,
                force=given.force,
            )
            logger.info("running: dvc %s", " ".join(args))
            returncode, reports, tail = drive(args, root=root, env=env)
        else:
            args, (returncode, reports, tail) = _fan_out(jobs, slots, exp_name, targets, env, given)
    _report(run_id, exp_name, args, returncode, reports, tail, root, all_stages=not targets)
    return {
        "pipeline_run_id": run_id,
        "dvc_experiment": exp_name,
        "command": ["dvc", *args],
        "overrides": overrides,
        "jobs": jobs,
        "stages": {r.stage: {"outcome": r.outcome, "metrics": r.metrics} for r in reports},
    }


def _shares(jobs: int | None, logger: Any) -> tuple[int, list[dict[str, str]]]:
    """How many stages at once (``jobs``, else the machine's default) and each slot's environment."""
    if jobs == 1:
        return 1, []
    gpus, cores = _fanout.visible_gpus(), _fanout.cpu_cores()
    jobs = jobs or _fanout.default_jobs(gpus, cores)
    if gpus and jobs > len(gpus):
        logger.warning("jobs=%d on %d GPU(s): stages share GPUs, as asked", jobs, len(gpus))
    slots = _fanout.slot_envs(jobs, gpus, cores, share_gpus=True)
    logger.info(
        "up to %d stages at once, on %s",
        jobs,
        "; ".join(" ".join(f"{k}={v}" for k, v in e.items()) for e in slots),
    )
    return jobs, slots


def _fan_out(
    jobs: int,
    slots: list[dict[str, str]],
    exp_name: str | None,
    targets: list[str],
    env: dict[str, str],
    given: SimpleNamespace,
) -> tuple[list[str], tuple[int, list[StageReport], list[str]]]:
    """The stages ``jobs`` at once, each its own ``dvc repro --single-item``; then ``dvc exp save`` for an
    experiment (the params overrides are in the workspace's files, as ``dvc exp run`` leaves them)."""
    from dvc.exceptions import DvcException

    infos = _dvc.stage_infos(REPO_ROOT)
    needs = _fanout.closure({i.name: i.needs for i in infos}, targets)
    if exp_name is not None:  # what dvc exp run tells its stages; their MLflow runs' dvc_experiment tag
        env = {**env, "DVC_EXP_NAME": exp_name}
    # A stage DVC always runs (the inputs records) goes first: dvc status only then sees what it changed
    always = [i.name for i in infos if i.always_changed and i.name in needs and not needs[i.name]]
    first: tuple[int, list[StageReport], list[str]] = (0, [], [])
    if always:
        first = fan_out(
            dict.fromkeys(always, ()), jobs=1, root=REPO_ROOT, env=env, slots=slots, force=given.force
        )
        if first[0]:
            return ["--wait-for-lock", "repro", "--single-item", *always], first
        needs = {s: tuple(n for n in deps if n not in always) for s, deps in needs.items() if s not in always}
    try:
        unchanged = set() if given.force else set(needs) - _dvc.changed_stages(REPO_ROOT)
    except DvcException as err:  # e.g. a dvc command beside the run holds the lock: DVC decides each stage
        get_run_logger().info("dvc status: %s; every stage goes to DVC", err)
        unchanged = set()
    outcome = fan_out(
        needs,
        jobs=jobs,
        root=REPO_ROOT,
        env=env,
        slots=slots,
        unchanged=unchanged,
        force=given.force,
        fail_fast=given.fail_fast,
    )
    outcome = (outcome[0], first[1] + outcome[1], outcome[2])
    if exp_name is not None and outcome[0] == 0:
        # The outputs kept in git go into the experiment as `dvc exp run` commits them (new ones are untracked).
        # The stages that ran are named: without targets `exp save` commits every stage, and fails on the
        # outputs of a stage the run left out that never ran here ("output 'data/vocab' does not exist").
        kept = [p for i in infos for p in i.git_outs if (REPO_ROOT / p).exists()]
        include = [arg for p in kept for arg in ("--include-untracked", p)]
        args = ["exp", "save", "--name", exp_name, *include, *always, *needs]
        saved = drive(args, root=REPO_ROOT, env=env)
        outcome = (saved[0], outcome[1], saved[2]) if saved[0] else outcome
    return ["--wait-for-lock", "repro", "--single-item", f"<stage> ({jobs} at once)"], outcome


def _experiment_name(given: str | None, flow_run_name: str | None, run_id: str) -> str:
    """The DVC experiment's name: the given one, else the flow run's name and id (a valid git ref name)."""
    name = given or f"{flow_run_name or 'run'}-{run_id[:6]}"
    if not _EXP_NAME_RE.match(name):
        raise ValueError(f"experiment_name={name!r}: use letters, digits, '.', '_' and '-' (a git ref name)")
    return name


def _report(
    run_id: str,
    exp_name: str | None,
    args: list[str],
    returncode: int,
    reports: list[StageReport],
    tail: list[str],
    root: Path,
    *,
    all_stages: bool,
) -> None:
    """The run's summary as a Prefect artifact (listing what never ran); :class:`PipelineFailed` naming the
    failed stage when DVC failed."""
    ok = returncode == 0
    if not ok and all_stages:
        with contextlib.suppress(Exception):  # the summary lists what never ran, when dvc.yaml is readable
            seen = {r.stage for r in reports}
            reports += [StageReport(i.name, "not run") for i in _dvc.stage_infos(root) if i.name not in seen]
    summary = summary_markdown(run_id, exp_name if ok else None, ["dvc", *args], reports, ok)
    markdown_artifact("pipeline-summary", summary, f"Pipeline run {run_id}")
    if not ok:
        failed = [r.stage for r in reports if r.outcome == "failed"]
        refused = ", ".join(f"'{r.stage}'" for r in reports if r.outcome == "not started")
        names = ", ".join(f"'{stage}'" for stage in failed)
        where = (
            f"stage{'s' * (len(failed) > 1)} {names} failed"
            if failed
            else f"DVC failed before running a stage{f' ({refused})' if refused else ''}"
        )
        raise PipelineFailed(f"{where} (dvc exit code {returncode}). {last_words(tail)}")


#: The one line a stage command ends with when it fails (:func:`flows._cli.run_command`).
_STAGE_SAID = re.compile(r"^\S+ stage (failed|interrupted)\b")


def last_words(tail: list[str]) -> str:
    """What DVC's last lines say about the failure: the stage's own ``<stage> stage failed ...`` line and
    DVC's ``ERROR`` line when the stage said one (not its traceback), else DVC's last 15 lines."""
    said = [line for line in tail if _STAGE_SAID.match(line)]
    if not said:
        return "Last DVC output:\n" + "\n".join(tail[-15:])
    return "\n".join([said[-1], *[line for line in tail if line.startswith("ERROR:")][-1:]])


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
    parser.add_argument(
        "-j", "--jobs", type=int, help="stages at once, each on its own device share (default: GPUs, else 2)"
    )
    parser.add_argument("--fail-fast", action="store_true", help="after a failed stage, start no more")
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 (one stage at a time) or more")
    if args.name and not args.experiment:
        parser.error(f"--name {args.name}: an experiment's name; add --experiment (plain dvc repro has none)")
    from flows._cli import quiet_refusals, run_command
    from flows._prefect_api import PrefectApiUnreachable, prefect_api

    def body() -> int:
        try:
            # what the flow would refuse fails here, in a second, before a Prefect server starts (the flow
            # resolves the overrides again, under the workspace lock: the params files may change meanwhile)
            resolve_overrides(args.profile, dict.fromkeys(FORM_KEYS), args.sets, REPO_ROOT)
            if args.data_root is not None:
                data_root_dir(args.data_root, REPO_ROOT)  # not a directory
            if args.name:
                _experiment_name(args.name, None, "")  # not a git ref name
            quiet_refusals()
            with prefect_api():
                result = pipeline_flow(
                    profile=args.profile,
                    extra_overrides=args.sets,
                    targets=args.targets,
                    as_experiment=args.experiment,
                    experiment_name=args.name,
                    data_root=args.data_root,
                    force=args.force,
                    jobs=args.jobs,
                    fail_fast=args.fail_fast,
                )
        except (PipelineFailed, ProfileError, _dvc.WorkspaceBusy, ValueError, PrefectApiUnreachable) as err:
            print(f"error: {err}", file=sys.stderr)  # the reason is the message: the type adds nothing
            return 1
        for stage, info in result["stages"].items():
            print(f"{stage:28s} {info['outcome']}")
        print(f"pipeline_run_id={result['pipeline_run_id']}")
        return 0

    # Ctrl-C / SIGTERM: DVC and its stage are stopped (exit 130 / 143); any other error is a bug: raised.
    stopped = (
        "; DVC and the running stage were stopped (pretraining keeps its last checkpoint): "
        "run it again to go on"
    )
    return run_command(body, "pipeline", after_stop=stopped, errors=())


if __name__ == "__main__":
    from flows._cli import exit_command

    exit_command(main())
