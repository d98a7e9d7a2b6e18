"""``finetune.model.source`` naming another stage's output that is not built yet: that stage is named."""

from __future__ import annotations

import pytest

from bert_core.constants import REPO_ROOT
from bert_core.released import CheckpointSourceError
from flows.finetune import check_source_built


@pytest.mark.parametrize("source", ["models/pretrained", "./models/pretrained/", "{root}/models/pretrained"])
def test_the_pretrain_output_before_pretraining_names_the_stage(tmp_path, monkeypatch, source):
    monkeypatch.chdir(tmp_path)  # a workspace where models/pretrained does not exist
    if source.startswith("{root}"):
        if (REPO_ROOT / "models" / "pretrained").exists():
            pytest.skip("this checkout has models/pretrained")
        source = source.format(root=REPO_ROOT)
    with pytest.raises(CheckpointSourceError) as err:
        check_source_built(source)
    msg = str(err.value)
    assert (
        "does not exist: the pretrain stage has not run; run `dvc repro pretrain` (or `make pipeline`)" in msg
    )
    assert "hf download" not in msg and "Hub" not in msg


def test_other_sources_are_left_to_the_resolver(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "pretrained").mkdir(parents=True)
    for source in (
        "models/pretrained",
        "google-bert/bert-base-uncased",
        "models:/bert-pretrained@newest",
        str(tmp_path / "elsewhere"),
    ):
        check_source_built(source)
