"""Profiles: -S formatting that DVC parses back, profile resolution and switching, the check, the CLI."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from bert_core.constants import REPO_ROOT
from flows import overrides as ov
from flows import profiles
from flows.overrides import ProfileError
from flows.profiles import cli as _profiles_cli


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, timeout=60)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repo with one params file and three profiles (committed)."""
    (tmp_path / "params" / "profiles").mkdir(parents=True)
    (tmp_path / "params" / "x.yaml").write_text(
        "x:\n  lr: 0.001  # peak\n  steps: 10\n  name: small\n  tasks: {a: {}, b: {seeds: [1]}}\n"
        "  sources:\n    - {name: s1, max_bytes: 100}\n  workers: 1\n  parent: null\n"
    )
    (tmp_path / "params" / "profiles" / "cpu-small.yaml").write_text("# Defaults.\n{}\n")
    (tmp_path / "params" / "profiles" / "big.yaml").write_text(
        "# Big one.\n# Second line.\nparams/x.yaml:\n  x.lr: 1.0e-4\n  x.steps: 1000\n"
        "  x.sources.0.max_bytes: null\n"
    )
    (tmp_path / "params" / "profiles" / "named.yaml").write_text("params/x.yaml:\n  x.name: other\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "-c", "user.email=t@e", "-c", "user.name=t", "add", "-A")
    _git(tmp_path, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "init")
    return tmp_path


def _x(root: Path) -> dict:
    return yaml.safe_load((root / "params" / "x.yaml").read_text())["x"]


VALUES = [
    None,
    True,
    False,
    0,
    -3,
    1e-4,
    5e-05,
    2e-3,
    0.1,
    1e20,
    "base",
    "a b",
    "it's",
    "x:y",
    "null",
    "True",
    "false",
    "inf",
    "7",
    "",
    "1e-4",
    "a,b",
    "a=b",
    " padded ",
    "path/to/x.txt",
    "models/released/google--bert_uncased",
    "/abs/path",
    "-a",
    "a+b",
    "$x",
    "ü",
    "back\\slash\\",
    ["sst2", "mrpc"],
    [1e-4, 5e-5, 2e-3],
    [[1, 2], [3]],
    ["a b", None, True],
    {"a": 1, "b": "c d", "e": {}},
    {"rte": {"learning_rates": [2e-3], "train_limit": 50}, "mrpc": {}},
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_values_round_trip_through_dvc(value, tmp_path):
    """What we print for -S is what DVC's own -S implementation writes into the params file."""
    text = ov.format_value(value)
    assert ov.parse_value(text) == value
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "p.yaml").write_text(yaml.safe_dump({"p": {"k": "old", "d": {"z": 1}}}))
    key = "p.d" if isinstance(value, dict) else "p.k"
    profiles.apply({"params/p.yaml": {key: value}}, tmp_path)
    # DVC (ruamel) writes 5e-05 without a dot, which PyYAML reads as a string; the stage models coerce it.
    got = yaml.safe_load((tmp_path / "params" / "p.yaml").read_text())["p"][key[2:]]
    if isinstance(value, float):
        got = float(got)
    elif isinstance(value, list) and value and isinstance(value[0], float):
        got = [float(v) for v in got]
    assert got == value


def test_list_describe_and_load(repo):
    assert profiles.list_profiles(repo) == ["cpu-small", "big", "named"]
    assert profiles.describe_profile("big", repo) == "Big one. Second line."
    assert profiles.load("cpu-small", repo).overrides == {}
    with pytest.raises(ProfileError, match="Known profiles: cpu-small, big, named"):
        profiles.load("nope", repo)


def test_switching_profiles_restores_defaults(repo):
    big = profiles.resolve("big", None, repo)
    assert big == {"params/x.yaml": {"x.lr": 1e-4, "x.steps": 1000, "x.sources.0.max_bytes": None}}
    profiles.apply(big, repo)
    assert _x(repo)["steps"] == 1000 and _x(repo)["sources"][0]["max_bytes"] is None
    assert "# peak" in (repo / "params" / "x.yaml").read_text()  # comments kept
    assert profiles.resolve("big", None, repo) == {}  # already applied: nothing to change
    back = profiles.resolve("cpu-small", None, repo)  # restores every key any profile sets
    assert back == {"params/x.yaml": {"x.lr": 0.001, "x.sources.0.max_bytes": 100, "x.steps": 10}}
    profiles.apply(back, repo)
    assert _x(repo)["steps"] == 10 and _x(repo)["lr"] == 0.001
    # A hand edit of a key no profile manages survives a profile switch.
    (repo / "params" / "x.yaml").write_text((repo / "params" / "x.yaml").read_text().replace("small", "mine"))
    assert profiles.resolve("named", None, repo) == {"params/x.yaml": {"x.name": "other"}}
    assert profiles.resolve(None, {"params/x.yaml": {"x.steps": 10}}, repo) == {}  # only real changes
    # 10 and 10.0 are the same value; true and 1 are not (a params model tells a flag from a count)
    assert profiles.resolve(None, {"params/x.yaml": {"x.steps": 10.0}}, repo) == {}
    flag = {"params/x.yaml": {"x.workers": True}}
    assert profiles.resolve(None, flag, repo) == flag


def test_mappings_are_replaced_not_merged(repo):
    tasks = {"b": {}, "c": {"seeds": [2]}}
    overrides = profiles.resolve(None, {"params/x.yaml": {"x.tasks": tasks}}, repo)
    assert ov.set_args(overrides) == [
        "-S",
        "params/x.yaml:~x.tasks",
        "-S",
        "params/x.yaml:+x.tasks={b:{},c:{seeds:[2]}}",
    ]
    profiles.apply(overrides, repo)
    assert _x(repo)["tasks"] == tasks
    # A later key below an earlier mapping applies after it; one above it replaces it.
    merged = ov.merge({"f": {"x.tasks.b.seeds": [1], "x.lr": 1}}, {"f": {"x.tasks": {}}})
    assert merged == {"f": {"x.lr": 1, "x.tasks": {}}}


def test_unknown_keys_and_bad_specs_are_named(repo):
    for key in ("x.nope", "x.lr.nope", "x.sources.1.max_bytes", "x.sources.first", "x.sources.0.nope"):
        with pytest.raises(ProfileError, match=rf"params/x.yaml: no key '{key}' .*check its spelling"):
            profiles.resolve(None, {"params/x.yaml": {key: 1}}, repo)
    # A value DVC's -S cannot set is refused when resolving, as `dvc exp run -S` would refuse it.
    for key, value, why in (
        ("x.tasks", [1], "Cannot merge DictConfig with ListConfig"),
        ("x.parent", {"a": 1}, "Could not delete from config. 'x.parent' does not exist"),
    ):
        with pytest.raises(ProfileError, match=rf"params/x.yaml: DVC's -S cannot apply .*{why}"):
            profiles.resolve(None, {"params/x.yaml": {key: value}}, repo)
        with pytest.raises(ProfileError, match="could not apply"):
            profiles.apply({"params/x.yaml": {key: value}}, repo)
    with pytest.raises(ProfileError, match="expected FILE:KEY=VALUE"):
        ov.parse_set_args(["x.lr=1"])
    assert ov.parse_set_args(["params/x.yaml:x.lr=2e-5", "params/x.yaml:x.tasks=[a,b]"]) == {
        "params/x.yaml": {"x.lr": 2e-5, "x.tasks": ["a", "b"]}
    }
    # what `python -m flows.profiles args` prints for a replaced mapping reads back as that mapping
    mapping = {"params/x.yaml": {"x.tasks": {"sst2": {"train_limit": 10}}}}
    assert ov.parse_set_args(ov.set_args(mapping)[1::2]) == mapping
    for alone in (["params/x.yaml:~x.tasks"], ["params/x.yaml:+x.tasks={a: 1}"], ["params/x.yaml:x.lr=1,2"]):
        with pytest.raises(ProfileError, match=r"a key is removed only to be replaced|one value per key"):
            ov.parse_set_args(alone)
    (repo / "params" / "profiles" / "broken.yaml").write_text("params/x.yaml: [1, 2]\n")
    with pytest.raises(ProfileError, match="must map dotted keys"):
        profiles.load("broken", repo)


TRICKY = {
    "params/x.yaml": {
        "x.lr": 5e-05,
        "x.name": "null",
        "x.sources.0.max_bytes": None,
        "x.tasks": {"c": {"seeds": [2]}, "b": {}},
        "x.tasks.c.seeds": [3, 4],
        "x.workers": True,
    }
}


@pytest.mark.parametrize("name", [None, *profiles.list_profiles()])
def test_params_in_memory_are_what_dvc_s_writes(name, repo, tmp_path):
    """The params a run will see (``effective_params``: DVC's ``-S`` code run in memory) are, value for value
    and type for type, the file ``dvc.utils.hydra.apply_overrides`` writes for the same overrides. (That file
    keeps a replaced mapping's surviving keys in their old order, which no stage reads.)"""
    from dvc.utils.hydra import apply_overrides
    from dvc.utils.serialize import load_yaml

    root = repo if name is None else REPO_ROOT
    overrides = TRICKY if name is None else profiles.resolve(name, only_changes=False)
    for file, keys in overrides.items():
        ours = OmegaConf.to_object(profiles.effective_params(file, overrides, root))
        written = tmp_path / Path(file).name
        shutil.copyfile(root / file, written)
        apply_overrides(written, [o for k, v in keys.items() for o in ov.hydra_overrides(k, v)])
        assert json.dumps(ours, sort_keys=True) == json.dumps(load_yaml(written), sort_keys=True), file


def test_check_uses_the_stage_params_models(tmp_path):
    """A key that does not exist, and a value the stage's pydantic model refuses, are both reported."""
    shutil.copytree(REPO_ROOT / "params", tmp_path / "params", ignore=shutil.ignore_patterns("profiles"))
    (tmp_path / "params" / "profiles").mkdir()
    (tmp_path / "params" / "profiles" / "typo.yaml").write_text(
        "params/vocab.yaml:\n  vocab.vocab_sise: 10\n"
    )
    (tmp_path / "params" / "profiles" / "bad.yaml").write_text("params/vocab.yaml:\n  vocab.vocab_size: -5\n")
    report = profiles.check_profiles(tmp_path)
    text = "\n".join(report.problems)
    assert "profile 'typo': params/vocab.yaml has no key 'vocab.vocab_sise'" in text
    assert "params/vocab.yaml with profile 'bad'" in text and "vocab.vocab_size" in text
    assert len(report.problems) == 2


def test_every_profile_of_the_repository_parses():
    names = profiles.list_profiles()
    assert {"cpu-small", "gpu-base", "tiny"} <= set(names)
    assert profiles.load("cpu-small").overrides == {}
    report = profiles.check_profiles()
    assert report.ok, "\n".join(report.problems)


def test_gpu_base_follows_the_paper():
    gpu = ov.merge(profiles.load("gpu-base").overrides)
    flat = {k: v for keys in gpu.values() for k, v in keys.items()}
    assert flat["corpus.cap.max_bytes"] is None and flat["pretrain_data.dupe_factor"] == 10
    assert flat["pretrain_data.phases"] == ["seq128", "seq512"]
    # the paper's objective, whatever the CPU profile's recipe: 15% masking, NSP pairs and loss, dropout
    assert (flat["pretrain_data.masked_lm_prob"], flat["pretrain_data.random_next_prob"]) == (0.15, 0.5)
    assert flat["pretrain.nsp"] is True and flat["pretrain.model.overrides"] == {}
    pretrain = gpu.get("params/pretrain.yaml")
    if pretrain is None:
        pytest.skip("params/pretrain.yaml is not in the gpu-base profile yet")
    assert pretrain["pretrain.model.preset"] == "base"


def test_cli(repo, capsys):
    assert _profiles_cli.main(["args", "big", "-S", "params/x.yaml:x.name='it\\'s'"], root=repo) == 0
    args = shlex.split(capsys.readouterr().out)
    assert args[:2] == ["-S", "params/x.yaml:x.lr=0.0001"] and args[-1] == "params/x.yaml:x.name='it\\'s'"
    assert _profiles_cli.main(["apply", "big"], root=repo) == 0
    assert _x(repo)["steps"] == 1000
    assert _profiles_cli.main(["args", "nope"], root=repo) == 2
    assert "unknown profile" in capsys.readouterr().err
    assert _profiles_cli.main(["args", "big", "-S", "params/x.yaml:x.name=it's"], root=repo) == 2
    assert "not a valid -S value" in capsys.readouterr().err
    assert _profiles_cli.main(["check"], root=repo) == 0


def test_a_profile_applied_by_dvc_shows_no_further_changes(tmp_path):
    """After `apply` (DVC's -S writes ``5e-05`` and keeps a mapping's key order), the params read as DVC
    reads them (YAML 1.2 floats) and nothing is left to change."""
    shutil.copytree(REPO_ROOT / "params", tmp_path / "params")
    for git in (
        ["init", "-q"],
        ["add", "params"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "p"],
    ):
        subprocess.run(["git", *git], cwd=tmp_path, check=True)
    profiles.apply(profiles.resolve("gpu-base", root=tmp_path), tmp_path)
    assert "5e-05" in (tmp_path / "params/finetune.yaml").read_text(encoding="utf-8")
    assert profiles.resolve("gpu-base", root=tmp_path) == {}


def test_a_profile_key_the_workspace_lost_is_named_with_the_way_back(repo):
    """An earlier run's `-S` replaced x.sources in the workspace file (repro mode writes it there): the
    profiles' x.sources.0.max_bytes no longer exists, and the error says where it went and how to restore it."""
    profiles.apply({"params/x.yaml": {"x.sources": []}}, repo)
    with pytest.raises(
        ProfileError, match=r"profiles set 'x\.sources\.0\.max_bytes'.*git checkout params/x\.yaml"
    ):
        profiles.resolve("named", None, repo)


def test_a_profiles_task_list_keeps_the_own_tasks_the_workspace_declares(tmp_path):
    """A profile's task list is a scale setting for the paper's tasks: an own task declared in the workspace
    (committed or not) stays under every profile, and the run form can choose it; an explicit task list
    (``-S``) still replaces everything."""
    from flows._inputs import form_overrides

    (tmp_path / "params" / "profiles").mkdir(parents=True)
    finetune = tmp_path / "params" / "finetune.yaml"
    finetune.write_text("finetune:\n  tasks:\n    sst2: {train_limit: 100}\n")
    (tmp_path / "params" / "profiles" / "cpu-small.yaml").write_text("# Defaults.\n{}\n")
    (tmp_path / "params" / "profiles" / "gpu.yaml").write_text(
        "params/finetune.yaml:\n  finetune.tasks: {mrpc: {}, sst2: {}}\n"
    )
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "-c", "user.email=t@e", "-c", "user.name=t", "add", "-A")
    _git(tmp_path, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "init")
    reviews = {
        "define": {"kind": "classification", "text": "review"},
        "train_file": "t.csv",
        "dev_file": "d.csv",
    }
    finetune.write_text(
        yaml.safe_dump({"finetune": {"tasks": {"sst2": {"train_limit": 100}, "reviews": reviews}}})
    )
    tasks = profiles.resolve("gpu", root=tmp_path)["params/finetune.yaml"]["finetune.tasks"]
    assert tasks == {"mrpc": {}, "sst2": {}, "reviews": reviews}
    assert (
        profiles.resolve("cpu-small", root=tmp_path) == {}
    )  # the workspace already is the default + its own
    chosen = profiles.resolve(
        "gpu", lambda current: form_overrides({"tasks": ["reviews"]}, current), tmp_path
    )
    assert chosen["params/finetune.yaml"]["finetune.tasks"] == {"reviews": reviews}
    explicit = profiles.resolve("gpu", {"params/finetune.yaml": {"finetune.tasks": {"mrpc": {}}}}, tmp_path)
    assert explicit["params/finetune.yaml"]["finetune.tasks"] == {"mrpc": {}}
    # committed, then edited in the workspace: the workspace's declaration stands
    _git(tmp_path, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qam", "own task")
    edited = {**reviews, "epochs": 5}
    finetune.write_text(
        yaml.safe_dump({"finetune": {"tasks": {"sst2": {"train_limit": 100}, "reviews": edited}}})
    )
    assert profiles.resolve("cpu-small", root=tmp_path) == {}
    tasks = profiles.resolve("gpu", root=tmp_path)["params/finetune.yaml"]["finetune.tasks"]
    assert tasks == {"mrpc": {}, "sst2": {}, "reviews": edited}
