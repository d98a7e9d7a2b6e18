"""Great Expectations checks on task data: real data passes, each kind of corruption fails its expectation."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from bert_core.checks import DataCheckError
from bert_core.kinds.checks import check_task_split, task_checks, task_frame
from bert_core.tasks import TaskRows, load_task_split
from bert_core.tasks.registry import get_task

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"


def _failed(report) -> str:
    return " ".join(report.summary()["failed_critical"])


def test_real_and_fixture_data_pass(shared_data, tmp_path):
    report = check_task_split(
        load_task_split("mrpc", "dev", data_root=shared_data), report_dir=tmp_path / "docs"
    )
    assert report.success, report.summary()
    assert (tmp_path / "docs" / "index.html").is_file()
    for task, split in (("swag", "test"), ("squad_v2", "dev"), ("mnli", "test_matched")):
        assert check_task_split(load_task_split(task, split, data_root=FIXTURES)).success


def test_corruptions_fail_the_matching_expectations():
    swag = load_task_split("swag", "dev", data_root=FIXTURES)
    bad = TaskRows(copy.deepcopy(list(swag)), task="swag", split="dev", source="x")
    bad[0]["endings"] = bad[0]["endings"][:3]
    bad[1]["label"] = 7
    report = check_task_split(bad)
    assert "n_endings" in _failed(report) and "column='label'" in _failed(report)
    with pytest.raises(DataCheckError, match="critical expectation"):
        report.raise_for_critical()

    squad = copy.deepcopy(list(load_task_split("squad_v2", "dev", data_root=FIXTURES)))
    squad[0]["answers"]["answer_start"][0] += 3
    squad[1]["question"] = "  "
    squad[5]["answers"] = {"text": ["x"], "answer_start": [0]}  # impossible question with an answer
    failed = _failed(check_task_split(squad, task="squad_v2", split="dev"))
    assert "answers_at_offsets" in failed and "answers_match_is_impossible" in failed
    assert "question_len" in failed  # 1 empty question in 18 is far above the 0.1% tolerated

    conll = [
        {"id": "0", "tokens": ["EU", ""], "tags": ["B-ORG", "B-XYZ"]},
        {"id": "0", "tokens": [], "tags": []},
    ]
    failed = _failed(check_task_split(conll, task="conll2003", split="dev"))
    for name in ("tags_in_label_set", "min_token_len", "n_tokens", "expect_column_values_to_be_unique"):
        assert name in failed

    glue = [{"id": "0", "text_a": "", "text_b": "b", "label": 3}]
    failed = _failed(check_task_split(glue, task="rte", split="dev"))
    assert "text_a_len" in failed and "column='label'" in failed


def test_every_expectation_column_exists_in_the_frame(shared_data):
    samples = {
        "cola": load_task_split("cola", "dev", data_root=shared_data, limit=5),
        "stsb": load_task_split("stsb", "test", data_root=shared_data, limit=5),
        "squad_v1": load_task_split("squad_v1", "dev", data_root=shared_data, limit=5),
        "swag": load_task_split("swag", "train", data_root=FIXTURES),
        "conll2003": load_task_split("conll2003", "dev", data_root=shared_data, limit=5),
    }
    for name, rows in samples.items():
        spec = get_task(name)
        columns = set(task_frame(spec, rows).columns)
        for check in task_checks(spec, rows.split):
            assert check.critical and check.expectation.column in columns, (name, check.name)


def test_rows_without_task_and_split_are_refused():
    with pytest.raises(ValueError, match="needs the task and split"):
        check_task_split([{"id": "0"}])
