"""The pipeline flow's inputs: a profile, the form fields (:data:`FORM_KEYS`) and ``-S`` overrides layered
into one :class:`RunInputs`, computed once, that the DVC command, the checkpoint tracking and the stage
list all read; and the stages' environment.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_core.tracking import tracking_uri
from flows import TELEMETRY_OFF, profiles
from flows._checkpoint import track_model_source
from flows.overrides import Overrides, merge, parse_set_args, set_args

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


def form_overrides(fields: dict[str, Any], current: Callable[[str, str], Any]) -> Overrides:
    """The params overrides of the form fields that were set (``None`` keeps the profile's value).

    Args:
        fields: Form field name -> value.
        current: A key's value as the profile leaves it; ``tasks`` keeps each chosen task's settings.
    """
    out: Overrides = {}
    for name, value in fields.items():
        if value is None or name == "tasks":
            continue
        for file, key in FORM_KEYS[name]:
            out.setdefault(file, {})[key] = list(value) if isinstance(value, tuple | list) else value
    cleared = [f for f in PER_TASK_FIELDS if fields.get(f) is not None]
    if fields.get("tasks") is None and not cleared:
        return out
    file, key = TASKS_KEY
    tasks_now = current(file, key)
    tasks_now = tasks_now if isinstance(tasks_now, dict) else {}
    chosen = fields.get("tasks")
    names = list(dict.fromkeys(chosen)) if chosen is not None else list(tasks_now)
    tasks = {t: {k: v for k, v in (tasks_now.get(t) or {}).items() if k not in cleared} for t in names}
    if tasks != tasks_now:
        out.setdefault(file, {})[key] = tasks
    return out


@dataclass(frozen=True)
class RunInputs:
    """One run's params and stages, computed once (:func:`run_inputs`); every consumer reads this.

    Attributes:
        overrides: What differs from the workspace params (``dvc exp run -S``, or what repro mode writes).
        targets: The DVC stages to run: those asked for, else the profile's ``targets:``; ``[]``: all.
    """

    overrides: Overrides
    targets: list[str]


def run_inputs(
    profile: str | None,
    fields: dict[str, Any],
    sets: list[str],
    root: Path,
    *,
    targets: list[str] | None = None,
    log: Callable[[str], None] = print,
) -> RunInputs:
    """A profile, then the form fields, then free ``-S`` overrides (``sets``), resolved once into one set.

    Raises:
        ProfileError: an unknown profile, a malformed ``-S`` argument, a key that does not exist, a value
            its stage would refuse, or a starting checkpoint DVC cannot track (each names the file and key).
    """
    chosen, overrides = resolve_overrides(profile, fields, sets, root)
    overrides = track_model_source(overrides, root, log)
    return RunInputs(overrides, list(targets or (chosen.targets if chosen else [])))


def resolve_overrides(
    profile: str | None, fields: dict[str, Any], sets: list[str], root: Path
) -> tuple[profiles.Profile | None, Overrides]:
    """The profile and the overrides it, the form fields and ``sets`` make, each file checked as its stage
    checks it; no side effect (the command line checks its arguments with it before Prefect starts).

    Raises:
        ProfileError: as :func:`run_inputs`, but for the starting checkpoint.
    """
    chosen = profiles.load(profile, root) if profile else None
    given = parse_set_args(sets)
    return chosen, profiles.resolve(
        chosen, lambda current: merge(form_overrides(fields, current), given), root
    )


def dvc_command(
    *,
    as_experiment: bool,
    exp_name: str | None,
    overrides: Overrides,
    targets: list[str],
    force: bool,
) -> list[str]:
    """The DVC arguments (after ``dvc``) for this run."""
    if as_experiment:
        args = ["exp", "run", "--name", exp_name or "", *set_args(overrides)]
    else:
        args = ["repro"]
    if force:
        args.append("--force")
    return args + list(targets)


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


def data_root_dir(data_root: str, root: Path) -> Path | None:
    """The local data root a run form or ``--data-root`` names (``None``: ``hub``, the Hugging Face Hub).

    Raises:
        ValueError: it is not a directory.
    """
    if data_root.strip().lower() == "hub":
        return None
    path = (root / Path(data_root).expanduser()).resolve()
    if not path.is_dir():
        raise ValueError(
            f"data_root={data_root!r}: {path} is not a directory. Give a data root laid out like "
            "shared/data, 'hub' for the Hugging Face Hub, or leave it empty to keep BERT_DATA_ROOT."
        )
    return path


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
        if (path := data_root_dir(data_root, root)) is None:
            env.pop("BERT_DATA_ROOT", None)
        else:
            env["BERT_DATA_ROOT"] = str(path)
    elif env.get("BERT_DATA_ROOT"):
        env["BERT_DATA_ROOT"] = str((root / env["BERT_DATA_ROOT"]).resolve())
    return env
