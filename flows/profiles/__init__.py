"""Named profiles: one set of params overrides per scale, selectable without editing code.

The params files hold the default profile; ``params/profiles/<name>.yaml`` maps params files to dotted keys
and values (its leading comment is its description), and may list ``targets:``, the DVC stages it runs.
A profile determines every key that *any* profile sets: keys it does not set go back to their committed
default (``git show HEAD:<file>``), so switching from ``gpu-base`` back to ``cpu-small`` leaves no GPU value
behind; keys no profile touches keep the workspace's value. A profile's task list replaces the paper's tasks
only: the own tasks the workspace declares (``define``) are the user's data, not a scale, and stay
(:data:`OWN_TASKS`). Values use DVC's ``-S`` syntax
(:mod:`flows.overrides`), and ``apply`` writes them with DVC's own implementation of ``-S``, so ``dvc exp
run -S`` and ``dvc repro`` after ``apply`` see the same files; resolving and checking run the same code in
memory (:func:`effective_params`). Command line: ``python -m flows.profiles``.
"""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bert_core.constants import REPO_ROOT
from bert_core.params import ParamsError, parse_params, parse_yaml
from flows import stages
from flows.overrides import (
    Overrides,
    ProfileError,
    has_key,
    hydra_overrides,
    merge,
    set_keys,
    value_at,
)

PROFILES_SUBDIR = Path("params") / "profiles"
DEFAULT_PROFILE = "cpu-small"
TARGETS_KEY = "targets"  # a profile's list of DVC stages to run (default: all)
#: (params file, mapping, marker): the mapping's entries that hold the marker (the workspace's own tasks)
#: stay as the workspace declares them under every profile that does not name them.
OWN_TASKS = ("params/finetune.yaml", "finetune.tasks", "define")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


# --------------------------------------------------------------------------------------------- reading


def profiles_dir(root: Path = REPO_ROOT) -> Path:
    return Path(root) / PROFILES_SUBDIR


def list_profiles(root: Path = REPO_ROOT) -> list[str]:
    """Profile names (file stems under ``params/profiles``), sorted, the default first."""
    names = sorted(p.stem for p in profiles_dir(root).glob("*.yaml") if _NAME_RE.match(p.stem))
    if DEFAULT_PROFILE in names:
        names.remove(DEFAULT_PROFILE)
        names.insert(0, DEFAULT_PROFILE)
    return names


def profile_path(name: str, root: Path = REPO_ROOT) -> Path:
    path = profiles_dir(root) / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(list_profiles(root)) or "none"
        raise ProfileError(f"unknown profile '{name}' ({path} not found). Known profiles: {known}")
    return path


def describe_profile(name: str, root: Path = REPO_ROOT) -> str:
    """The profile's leading comment block, as one paragraph."""
    lines = []
    for line in profile_path(name, root).read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(x for x in lines if x)


@dataclass(frozen=True)
class Profile:
    """One profile file, read and checked once: its overrides and its ``targets:``."""

    overrides: Overrides
    targets: list[str] = field(default_factory=list)
    """The DVC stages it runs (``released``: ``evaluate`` and its ``finetune@<task>`` deps); ``[]``: all."""


def _parse_yaml(text: str, where: str | Path) -> dict[str, Any]:
    """A profile's or params file's text as the stages read params (YAML 1.2 floats: ``1e-4`` is a number)."""
    try:
        return parse_yaml(text, where)
    except ParamsError as err:
        raise ProfileError(str(err)) from None


def load(name: str, root: Path = REPO_ROOT) -> Profile:
    """Read ``params/profiles/<name>.yaml``: ``{file: {dotted key: value}}`` and ``targets:`` (shapes checked)."""
    path = profile_path(name, root)
    data = _parse_yaml(path.read_text(encoding="utf-8"), path)
    targets = data.pop(TARGETS_KEY, [])
    if not isinstance(targets, list) or not all(isinstance(t, str) and t for t in targets):
        raise ProfileError(f"{path}: '{TARGETS_KEY}' must be a list of DVC stage names, got {targets!r}")
    known = {s.name for s in stages.STAGES}
    if unknown := [t for t in targets if t.split("@", 1)[0] not in known]:
        raise ProfileError(
            f"{path}: '{TARGETS_KEY}' names unknown stage(s) {unknown}; stages: {sorted(known)}"
        )
    out: Overrides = {}
    for file, keys in data.items():
        if not (isinstance(file, str) and file.startswith("params/") and file.endswith(".yaml")):
            raise ProfileError(f"{path}: '{file}' is not a params file (expected params/<stage>.yaml)")
        keys = {} if keys is None else keys
        if not isinstance(keys, dict) or not all(isinstance(k, str) and k for k in keys):
            raise ProfileError(f"{path}: '{file}' must map dotted keys to values")
        out[file] = dict(keys)
    return Profile(out, list(targets))


def _committed_text(root: str, file: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "show", f"HEAD:{file}"], cwd=root, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def read_params_file(file: str, root: Path = REPO_ROOT, *, committed: bool = False) -> DictConfig:
    """A params file as DVC's ``-S`` loads it (OmegaConf): the workspace copy, or the committed one (falls
    back to the workspace)."""
    text = _committed_text(str(root), file) if committed else None
    if text is None:
        path = Path(root) / file
        if not path.is_file():
            raise ProfileError(f"{path}: params file not found")
        text = path.read_text(encoding="utf-8")
    return OmegaConf.create(_parse_yaml(text, file), flags={"allow_objects": True})


# ------------------------------------------------------------------------------------------ resolving


def resolve(
    name: str | Profile | None,
    extra: Overrides | Callable[[Callable[[str, str], Any]], Overrides] | None = None,
    root: Path = REPO_ROOT,
    *,
    only_changes: bool = True,
) -> Overrides:
    """The overrides that turn the workspace params into profile ``name`` plus ``extra``.

    Args:
        name: A profile (or its name), or ``None`` to keep the workspace params and apply only ``extra``.
        extra: Further overrides (from ``-S`` or a form), applied last; or a function of ``current(file,
            key)`` (a value with the profile applied) that returns them, for a form's task list.
        root: Repository root.
        only_changes: Drop overrides equal to the workspace value (so ``dvc exp run`` shows only
            real changes).

    Raises:
        ProfileError: unknown profile, missing params file, a key that does not exist in its file, a
            value DVC's ``-S`` cannot set, or one the stage that reads the file would refuse.
    """
    profile = load(name, root) if isinstance(name, str) else name
    layers: list[Overrides] = []
    workspaces: dict[str, DictConfig] = {}  # each workspace params file, read once
    if profile is not None:  # every key that any profile sets goes back to its committed default first
        managed: dict[str, set[str]] = {}
        for other in list_profiles(root):
            for file, keys in load(other, root).overrides.items():
                managed.setdefault(file, set()).update(keys)
        defaults: Overrides = {}
        for file, keys in managed.items():
            committed = read_params_file(file, root, committed=True)
            workspace = workspaces[file] = read_params_file(file, root)
            defaults[file] = {k: value_at(committed, k) for k in sorted(keys) if has_key(committed, k)}
            if gone := [k for k in defaults[file] if not has_key(workspace, k)]:
                raise ProfileError(
                    f"{file}: profiles set '{gone[0]}', which the committed file has and the workspace's no "
                    "longer does: a list or mapping above it was replaced (a `-S` of an earlier run without "
                    f"--experiment is written into the params files). Restore it with `git checkout {file}`, "
                    "or give the whole value again with -S and no profile"
                )
        layers += [defaults, profile.overrides]
        layers.append(_own_tasks_kept(merge(*layers), workspaces, profile))
    if callable(extra):
        base = merge(*layers)
        with_base = functools.cache(lambda file: effective_params(file, base, root))  # once per file
        extra = extra(lambda file, key: value_at(with_base(file), key))
    out: Overrides = {}
    for file, keys in merge(*layers, extra or {}).items():
        params = workspaces.pop(file) if file in workspaces else read_params_file(file, root)
        changed = set_keys(params, keys, file)
        if keys:  # as its stage will read it: a value it refuses fails here, before anything is written
            check_params(file, params, f"{file} with the overrides")
        if kept := changed if only_changes else keys:
            out[file] = kept
    return out


def _own_tasks_kept(base: Overrides, workspaces: dict[str, DictConfig], profile: Profile) -> Overrides:
    """The task list ``base`` sets, with the workspace's own tasks as the workspace declares them (added,
    or in place of their committed entry) unless ``profile`` names them (``{}``: nothing to change)."""
    file, key, marker = OWN_TASKS
    tasks = base.get(file, {}).get(key)
    if not isinstance(tasks, dict) or file not in workspaces:
        return {}
    declared, named = value_at(workspaces[file], key), profile.overrides.get(file, {}).get(key) or {}
    own = {
        name: entry
        for name, entry in (declared if isinstance(declared, dict) else {}).items()
        if isinstance(entry, dict) and marker in entry and name not in named
    }
    kept = {**tasks, **own}
    return {file: {key: kept}} if kept != tasks else {}


def effective_params(file: str, overrides: Overrides, root: Path = REPO_ROOT) -> DictConfig:
    """The workspace params file ``file`` with ``overrides`` applied in memory, as ``dvc exp run -S`` would."""
    params = read_params_file(file, root)
    set_keys(params, overrides.get(file, {}), file)
    return params


def check_params(file: str, params: DictConfig, where: str) -> None:
    """Validate a params file's content (overrides applied) with the model of the stage that reads it, as
    the stage will (a file no stage reads is not checked). Raises ProfileError naming ``where`` and the key."""
    owner = stages.by_params_file(file)
    if owner is None:
        return
    if (section := value_at(params, owner.section)) is None:
        raise ProfileError(f"{where}: {file} has no top-level section '{owner.section}'")
    try:
        parse_params(section, owner.model(), where=where, prefix=owner.section)
    except ParamsError as err:
        raise ProfileError(str(err)) from None


def apply(overrides: Overrides, root: Path = REPO_ROOT) -> list[Path]:
    """Write overrides into the params files with DVC's own ``-S`` implementation (comments kept)."""
    from dvc.utils.hydra import apply_overrides

    written = []
    for file, keys in overrides.items():
        if not keys:
            continue
        path = Path(root) / file
        try:
            apply_overrides(path, [o for k, v in keys.items() for o in hydra_overrides(k, v)])
        except Exception as err:
            raise ProfileError(f"{file}: could not apply {keys}: {err} ({err.__cause__ or ''})") from None
        written.append(path)
    return written


# ------------------------------------------------------------------------------------------- checking


@dataclass
class ProfilesCheck:
    """What :func:`check_profiles` found: problems (the check fails) and notes."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_profiles(root: Path = REPO_ROOT, names: list[str] | None = None) -> ProfilesCheck:
    """Validate profiles: every key exists in its file and the resulting params parse with the model of the
    stage that owns the file (:mod:`flows.stages`); a params file no stage owns is checked for keys only."""

    report = ProfilesCheck()
    names = list_profiles(root) if names is None else names
    if not names:
        report.problems.append(f"no profiles found in {profiles_dir(root)}")
    files = {str(p.relative_to(root)) for p in (root / "params").glob("*.yaml")}
    for name in names:
        try:
            profile = load(name, root).overrides
        except ProfileError as err:
            report.problems.append(str(err))
            continue
        where = f"profile '{name}'"
        for file in sorted({*profile, *files}):
            keys = profile.get(file, {})
            try:
                params = read_params_file(file, root)
            except ProfileError as err:
                report.problems.append(f"{where}: {err}")
                continue
            if missing := [k for k in keys if not has_key(params, k)]:
                report.problems += [f"{where}: {file} has no key '{k}'" for k in missing]
                continue
            if stages.by_params_file(file) is None:
                if (note := f"no stage reads {file}; checked key names only") not in report.notes:
                    report.notes.append(note)
                continue
            try:
                set_keys(params, keys, f"{where}: {file}")
                check_params(file, params, f"{file} with {where}")
            except ProfileError as err:
                report.problems.append(str(err))
    return report
