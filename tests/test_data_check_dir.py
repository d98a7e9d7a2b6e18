"""flows/_stage.py::data_check_dir: a stage's data-check reports follow its output location."""

from __future__ import annotations

import pytest

from bert_core.constants import REPO_ROOT
from flows._stage import CHECKS_DIR, data_check_dir
from flows.stages import STAGES, get


@pytest.mark.parametrize("stage", ["corpus", "vocab", "pretrain_data"])
def test_the_default_output_keeps_the_repository_reports(stage, monkeypatch):
    default = get(stage).outs[0]
    assert (
        data_check_dir(stage, default, default)
        == CHECKS_DIR / stage
        == REPO_ROOT / "reports/data_checks" / stage
    )
    monkeypatch.chdir(REPO_ROOT / "params")  # an absolute default path is the same output
    assert data_check_dir(stage, REPO_ROOT / default, default) == CHECKS_DIR / stage


def test_a_finetune_instance_with_its_default_output(monkeypatch):
    stage = get("finetune")
    default = stage.expand(stage.outs[1], "sst2")
    assert data_check_dir("finetune", REPO_ROOT / default, default) == CHECKS_DIR / "finetune"


def test_an_output_elsewhere_gets_its_reports_beside_it(tmp_path, monkeypatch):
    assert data_check_dir("corpus", tmp_path / "try" / "corpus", "data/corpus") == (
        tmp_path / "try" / "reports" / "data_checks" / "corpus"
    )
    monkeypatch.chdir(tmp_path)  # a relative --out is relative to the working directory, as the output is
    assert data_check_dir("vocab", "elsewhere/vocab", "data/vocab") == (
        tmp_path / "elsewhere" / "reports" / "data_checks" / "vocab"
    )


def test_every_stage_with_data_checks_reads_its_output_location():
    """The flows that write data-check reports name them through data_check_dir, not the repository."""
    for stage in STAGES:
        source = (REPO_ROOT / (stage.flow_module.replace(".", "/") + ".py")).read_text()
        if "report_dir" in source and stage.name != "evaluate":  # evaluate's report is its DVC output
            assert "data_check_dir(" in source, stage.name
            assert '"reports" / "data_checks"' not in source, stage.name
