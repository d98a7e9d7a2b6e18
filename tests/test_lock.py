"""requirements/lock.txt agrees with pyproject.toml, and `make` installs with it (no network, fast)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
RERUN = (
    "pyproject.toml and requirements/lock.txt disagree: run `make lock`, then `make test`, and commit both"
)


def _load_lock_module():
    spec = importlib.util.spec_from_file_location("requirements_lock", ROOT / "requirements" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lock = _load_lock_module()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _pins(path: Path = lock.LOCK) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for name, version in lock.read_pins(path):
        key = canonicalize_name(name)
        if key in pins:
            pytest.fail(f"requirements/{path.name} pins {name} twice; {RERUN}")
        pins[key] = Version(version)
    return pins


def _torch_spec_version() -> str:
    match = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert match, "the Makefile no longer sets TORCH_SPEC ?= torch==<version>"
    return match.group(1)


def _unsatisfied(requirements: list[str], pins: dict[str, Version], *, optional: bool = False) -> list[str]:
    problems = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = canonicalize_name(req.name)
        if key == "torch":
            continue  # pinned by the Makefile's TORCH_SPEC (tested below), never by the lock
        if key not in pins:
            if not optional:
                problems.append(f"{req.name}: no pin in requirements/lock.txt")
        elif not req.specifier.contains(pins[key], prereleases=True):
            problems.append(f"{req.name}: the lock pins {pins[key]}, outside pyproject's {req.specifier}")
    return problems


def test_every_line_is_an_exact_pin_and_none_twice():
    pins = _pins()
    assert len(pins) > 50
    assert not [n for n in pins if lock._UNPINNED.match(n)], (
        "torch and its CUDA packages belong to TORCH_SPEC"
    )


def test_header_hash_matches_pyproject_dependency_lists():
    recorded = lock.read_header_hash()
    assert recorded is not None, f"requirements/lock.txt has no `# {lock.HASH_KEY}:` header line; {RERUN}"
    assert recorded == lock.pyproject_hash(), RERUN


def test_every_pyproject_requirement_has_a_satisfying_pin():
    project, pins = _project(), _pins()
    extras = project.get("optional-dependencies", {})
    problems = _unsatisfied(project["dependencies"], pins) + _unsatisfied(extras["dev"], pins)
    for extra, requirements in extras.items():
        if extra != "dev":  # e.g. browser: installed on demand, checked when the lock has it
            problems += _unsatisfied(requirements, pins, optional=True)
    assert not problems, "\n".join([*problems, RERUN])


def test_torch_spec_satisfies_pyproject_torch_bound():
    (torch,) = [Requirement(r) for r in _project()["dependencies"] if Requirement(r).name == "torch"]
    assert torch.specifier.contains(_torch_spec_version()), f"TORCH_SPEC is outside pyproject's {torch}"


def test_checks_catch_a_bumped_bound(tmp_path):
    """A scratch pyproject with one bound moved past the pinned version fails both the hash and the pins."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    bumped = text.replace('"fastapi>=0.139,<0.151"', '"fastapi>=0.151"')
    assert bumped != text
    scratch = tmp_path / "pyproject.toml"
    scratch.write_text(bumped, encoding="utf-8")
    assert lock.pyproject_hash(scratch) != lock.read_header_hash()
    deps = tomllib.loads(bumped)["project"]["dependencies"]
    assert _unsatisfied(deps, _pins()) == ["fastapi: the lock pins 0.150.0, outside pyproject's >=0.151"]
    # A comment or re-indentation is not drift.
    scratch.write_text(text.replace("[project]\n", "[project]\n# a comment\n"), encoding="utf-8")
    assert lock.pyproject_hash(scratch) == lock.pyproject_hash()


def _make_dry_run(*args: str) -> list[str]:
    """The install recipe as make would run it (`-n -B`: print, run nothing), free of an outer make's flags."""
    env = {
        k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "MAKELEVEL"}
    }
    out = subprocess.run(
        ["make", "-n", "-B", *args, ".venv/.installed"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return [line for line in out.splitlines() if "pip install" in line and '-e ".[dev]"' in line]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_installs_the_project_with_the_lock():
    (install,) = _make_dry_run()
    assert "-c requirements/lock.txt" in install, install
    (unlocked,) = _make_dry_run("LOCK=")
    assert "-c" not in unlocked.split(), unlocked
    # The venv is rebuilt when the lock changes.
    assert re.search(
        r"^\$\(VENV\)/\.installed: pyproject\.toml \$\(LOCK\)$", (ROOT / "Makefile").read_text(), re.M
    )
