"""Task-file edge cases: CR-only line endings, huge headers, SQuAD answer types, duplicate ids and
impossible questions, a CoNLL byte-order mark; bounded error messages; where a failed data check's report is."""

from __future__ import annotations

import json

import pytest

from bert_core.tasks import TaskDataError, load_task_split
from bert_core.tasks.base import MAX_MESSAGE_CHARS


def _write(root, relative, text, encoding="utf-8"):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding))
    return path


def test_cr_only_tsv_is_named_and_the_message_is_short(tmp_path):
    rows = "".join(f"{i}\tsentence number {i} " + "x" * 200 + "\tentailment\r" for i in range(20_000))
    _write(tmp_path, "glue/RTE/dev.tsv", "index\tsentence1\tlabel\r" + rows)  # ~4.5 MB, one "line"
    with pytest.raises(
        TaskDataError, match=r"RTE/dev\.tsv: file uses CR-only line endings; convert to LF"
    ) as e:
        load_task_split("rte", "dev", data_root=tmp_path)
    assert len(str(e.value)) < 400


def test_cr_only_conll_file_is_named(tmp_path):
    _write(tmp_path, "conll2003/eng.testa", "EU NNP I-NP I-ORG\rrejects VBZ I-VP O\r")
    with pytest.raises(TaskDataError, match=r"eng\.testa: file uses CR-only line endings"):
        load_task_split("conll2003", "dev", data_root=tmp_path)


def test_huge_header_is_quoted_as_an_excerpt(tmp_path):
    header = "\t".join(f"column{i}" for i in range(100_000))
    _write(tmp_path, "glue/QNLI/dev.tsv", header + "\n0\n")
    with pytest.raises(TaskDataError, match=r"QNLI/dev\.tsv:1: .*characters in all") as e:
        load_task_split("qnli", "dev", data_root=tmp_path)
    assert len(str(e.value)) < 1000


def test_task_data_error_is_bounded_whatever_the_caller_quotes():
    err = TaskDataError("f.tsv:1: " + "y" * 5_000_000)
    assert len(str(err)) < MAX_MESSAGE_CHARS + 100 and str(err).endswith("characters in all]")


def _squad(qas, version="1.1"):
    return json.dumps(
        {
            "version": version,
            "data": [{"title": "T", "paragraphs": [{"context": "Paris is big.", "qas": qas}]}],
        }
    )


def _qa(qid, start=0, text="Paris", **extra):
    return {"id": qid, "question": "Which?", "answers": [{"text": text, "answer_start": start}], **extra}


def test_squad_answer_start_must_be_an_integer(tmp_path):
    _write(tmp_path, "squad/dev-v1.1.json", _squad([_qa("q1", start="0")]))
    with pytest.raises(
        TaskDataError, match=r"question q1: answer_start must be an integer .*got '0' \(str\)"
    ):
        load_task_split("squad_v1", "dev", data_root=tmp_path)


def test_squad_duplicate_question_ids_are_refused(tmp_path):
    _write(tmp_path, "squad/dev-v1.1.json", _squad([_qa("q1"), _qa("q2"), _qa("q1")]))
    with pytest.raises(
        TaskDataError,
        match=r"dev-v1\.1\.json data\[0\]\.paragraphs\[0\]\.qas\[2\]: duplicate question id 'q1' "
        r"\(first at data\[0\]\.paragraphs\[0\]\.qas\[0\]\)",
    ):
        load_task_split("squad_v1", "dev", data_root=tmp_path)


def test_squad_v1_file_with_impossible_questions_is_refused(tmp_path):
    impossible = {"id": "q2", "question": "Who?", "answers": [], "is_impossible": True}
    _write(tmp_path, "squad/dev-v1.1.json", _squad([_qa("q1"), impossible]))
    with pytest.raises(TaskDataError, match=r"qas\[1\]: question 'q2' is marked is_impossible.*squad_v2"):
        load_task_split("squad_v1", "dev", data_root=tmp_path)
    _write(tmp_path, "squad/dev-v2.0.json", _squad([_qa("q1"), impossible], version="v2.0"))
    assert [r["is_impossible"] for r in load_task_split("squad_v2", "dev", data_root=tmp_path)] == [
        False,
        True,
    ]


def test_conll_file_with_a_bom(tmp_path):
    text = "-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nrejects VBZ I-VP O\n\nPeter NNP I-NP I-PER\n"
    _write(tmp_path, "conll2003/eng.testa", text, encoding="utf-8-sig")
    rows = load_task_split("conll2003", "dev", data_root=tmp_path)
    assert [r["tokens"] for r in rows] == [["EU", "rejects"], ["Peter"]]
    assert rows[0]["tags"] == ["B-ORG", "O"]


def test_stage_failed_line_is_bounded():
    from flows._cli import MAX_REASON_CHARS, failure_line

    line = failure_line("finetune stage failed (rte)", ValueError("z" * 4_000_000))
    assert line.startswith("finetune stage failed (rte): ValueError: zzz")
    assert len(line) < MAX_REASON_CHARS + 200 and "[truncated: 4000000 characters in all]" in line
    assert failure_line("x stage failed", OSError("short")) == "x stage failed: OSError: short"
    unknown = KeyError("unknown task 'x'; valid tasks: cola, sst2")
    assert (
        failure_line("x stage failed", unknown)
        == "x stage failed: KeyError: unknown task 'x'; valid tasks: cola, sst2"
    )


def test_failed_data_check_points_at_a_report_that_exists(tmp_path):
    from bert_core.checks import DataCheckError
    from bert_core.finetune.params import FinetuneParams
    from bert_core.finetune.trial import load_task_data
    from bert_core.tasks import get_task

    header = "index\tsentence1\tsentence2\tlabel\n"
    _write(
        tmp_path, "glue/RTE/train.tsv", header + "0\tA man.\tA person.\tentailment\n1\t \tB.\tentailment\n"
    )
    reports = tmp_path / "reports" / "data_checks" / "finetune" / "rte"
    with pytest.raises(DataCheckError, match=r"task-rte-train.*failed 1 critical") as e:
        load_task_data(
            get_task("rte"),
            FinetuneParams().for_task("rte"),
            None,
            data_root=tmp_path,
            check_report_dir=reports,
        )
    index = reports / "task-rte-train" / "index.html"
    assert f"(report: {index})" in str(e.value) and index.is_file()
