"""Params files are as strict as DVC reads them: a repeated key or an empty section is an error with its line."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from bert_core.config import BertConfig
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
