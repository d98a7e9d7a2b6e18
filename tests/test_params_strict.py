"""Params files are as strict as DVC reads them: a repeated key or an empty section is an error with its line."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from bert_core.config import BertConfig
from bert_core.constants import REPO_ROOT
from bert_core.hf import save_pretrained
from bert_core.model import BertForPreTraining
from bert_core.params import ParamsError, StrictModel, load_params, read_yaml


class Section(StrictModel):
    device: str = "cpu"
    nested: dict[str, int] | None = None


def test_a_repeated_key_names_both_lines(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("finetune:\n  device: cpu\n  device: cuda\n")
    with pytest.raises(ParamsError, match=r"p\.yaml:3: duplicate key 'device' \(first at line 2\)"):
        read_yaml(path)


def test_a_repeated_key_in_a_nested_mapping(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("finetune:\n  nested:\n    a: 1\n    b: 2\n    a: 3\n")
    with pytest.raises(ParamsError, match=r"p\.yaml:5: duplicate key 'a' \(first at line 3\)"):
        load_params(path, "finetune", Section)


def test_an_empty_section_is_not_all_defaults(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("# comment\nfinetune:\n")
    with pytest.raises(ParamsError, match=r"p\.yaml:2: section 'finetune' is empty"):
        load_params(path, "finetune", Section)


def test_anchors_and_merge_keys_still_work(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("base: &b {device: cuda}\nfinetune:\n  <<: *b\n")
    assert load_params(path, "finetune", Section).device == "cuda"


def test_floats_read_as_yaml_1_2_as_dvc_writes_them(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("a:\n  lr: 5e-05\n  big: 1E+3\n  n: 12\n  ver: '5e-05'\n")
    assert read_yaml(path)["a"] == {"lr": 5e-05, "big": 1000.0, "n": 12, "ver": "5e-05"}


def test_committed_params_and_profiles_are_strict_clean():
    from bert_core.constants import REPO_ROOT

    files = sorted((REPO_ROOT / "params").rglob("*.yaml"))
    assert files
    for path in files:
        read_yaml(path)


def test_saved_weights_follow_the_umask_not_0600(tmp_path):
    """safetensors creates its file 0600; in a shared workspace the weights must be as readable as the rest."""
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64))
    old = os.umask(0o022)
    try:
        out = save_pretrained(model, tmp_path / "m")
        mode = stat.S_IMODE((out / "model.safetensors").stat().st_mode)
        assert mode == stat.S_IMODE((out / "config.json").stat().st_mode) == 0o644
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        save_pretrained(model, out)  # replacing the weights in an existing directory
        assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o644
    finally:
        os.umask(old)


# --------------------------------------------------------- values MLflow or torch would refuse, refused early
def _stage_params(tmp_path, stage: str, key: str, value):
    import yaml

    from flows.stages import get

    data = yaml.safe_load((REPO_ROOT / "params" / f"{stage}.yaml").read_text())
    node = data[stage]
    *parents, last = key.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    path = tmp_path / f"{stage}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, lambda: get(stage).load_params(str(path))


@pytest.mark.parametrize(
    ("stage", "key", "value", "fragment"),
    [
        ("finetune", "registry.alias", "v1", "Version alias name 'v1' is reserved"),
        ("finetune", "registry.alias", "Latest", "'latest' alias name (case insensitive) is reserved"),
        ("finetune", "registry.name_prefix", "team/bert-", "Names cannot contain '/' or ':'"),
        ("pretrain", "registry_alias", "v2", "Version alias name 'v2' is reserved"),
        ("pretrain", "registered_model", "team:bert", "Names cannot contain '/' or ':'"),
        ("pretrain", "optimizer.betas", [1.5, 0.999], "Input should be less than 1"),
        ("pretrain", "optimizer.betas", [0.9, -0.1], "Input should be greater than or equal to 0"),
        ("pretrain", "optimizer.eps", 0, "Input should be greater than 0"),
        ("corpus", "seed", -1, "Input should be greater than or equal to 0"),
    ],
)
def test_values_other_libraries_refuse_are_params_errors_naming_the_key(
    tmp_path, stage, key, value, fragment
):
    path, load = _stage_params(tmp_path, stage, key, value)
    with pytest.raises(ParamsError) as err:
        load()
    assert f"{path}: '{stage}.{key}" in str(err.value) and fragment in str(err.value)


def test_mlflows_own_validators_accept_the_committed_names(tmp_path):
    from mlflow.utils.validation import _validate_model_alias_name_reserved

    for stage, key in (("finetune", "registry.alias"), ("pretrain", "registry_alias")):
        _, load = _stage_params(tmp_path, stage, key, "champion_2")
        load()
    _validate_model_alias_name_reserved("champion_2")


@pytest.mark.parametrize("stage", ["finetune", "pretrain"])
def test_device_cuda_without_a_gpu_is_refused_when_the_stage_loads_its_params(tmp_path, monkeypatch, stage):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _, load = _stage_params(tmp_path, stage, "device", "cuda")
    with pytest.raises(ParamsError, match=rf"'{stage}.device' = 'cuda': this machine has no CUDA device"):
        load()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    load()
    if stage == "pretrain":
        _, load = _stage_params(tmp_path, stage, "device", "cuda:1")
        with pytest.raises(
            ParamsError, match=r"'pretrain.device' = 'cuda:1': this machine has 1 CUDA device"
        ):
            load()
