"""Static checks of the pipeline definition: dvc.yaml params keys exist, stage commands resolve, profiles parse."""

from __future__ import annotations

import importlib.util
import re
import shlex

import pytest

from bert_core.constants import REPO_ROOT
from flows import _dvc, overrides, pipeline, profiles
from flows.stages import INPUTS, STAGES


@pytest.fixture(scope="module")
def stages() -> list[_dvc.StageInfo]:
    if not (REPO_ROOT / "dvc.yaml").is_file():
        pytest.skip("no dvc.yaml yet")
    return _dvc.stage_infos(REPO_ROOT)  # DVC's own parser: foreach/vars expanded (finetune@sst2 ...)


def test_every_params_key_exists(stages):
    problems = []
    for stage in stages:
        for file, key in stage.params:
            path = REPO_ROOT / file
            if not path.is_file():
                problems.append(f"{stage.name}: params file {file} does not exist")
                continue
            if not overrides.has_key(profiles.read_params_file(file), key):
                problems.append(f"{stage.name}: {file} has no key '{key}'")
            if not file.startswith("params/"):
                problems.append(f"{stage.name}: params file {file} is outside params/ (list keys per file)")
    assert not problems, "\n".join(problems)


def test_every_stage_command_resolves(stages):
    problems = []
    for stage in stages:
        for part in re.split(r"&&|;", stage.cmd):
            words = shlex.split(part)
            if words[:1] == ["exec"]:
                words = words[1:]
            if not words or words[0] not in ("python", "python3"):
                problems.append(
                    f"{stage.name}: command '{part.strip()}' does not run `python -m flows.<stage>`"
                )
                continue
            if "-m" not in words:
                problems.append(f"{stage.name}: '{part.strip()}' runs a script; use `python -m <module>`")
                continue
            module = words[words.index("-m") + 1]
            if importlib.util.find_spec(module) is None:
                problems.append(f"{stage.name}: module {module} does not exist")
    assert not problems, "\n".join(problems)


def test_every_stage_is_served(stages):
    modules = {s.module_name for s in STAGES}
    used = {m for s in stages for m in re.findall(r"-m\s+flows\.(\w+)", s.cmd) if s.name != INPUTS}
    assert used == modules


def test_every_profile_parses():
    report = profiles.check_profiles(REPO_ROOT)
    assert report.ok, "\n".join(report.problems)


def test_the_form_offers_every_profile():
    form = pipeline.pipeline_flow.parameters.properties["profile"]
    offered = set()
    for option in form.get("anyOf", [form]):
        offered |= set(option.get("enum", []))
    assert offered == set(profiles.list_profiles(REPO_ROOT))
