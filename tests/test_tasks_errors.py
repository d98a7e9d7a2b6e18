"""Malformed task data fails loudly, naming the file and line (or question id) and what to do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bert_core.tasks import TaskDataError, load_task_split

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"


def _write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_tsv_row_with_a_missing_column(tmp_path):
    _write(
        tmp_path,
        "glue/RTE/dev.tsv",
        "index\tsentence1\tsentence2\tlabel\n0\tA man.\tA person.\tentailment\n1\tOnly one sentence\tentailment\n",
    )
    with pytest.raises(TaskDataError, match=r"RTE/dev\.tsv:3: 3 tab-separated fields, the header has 4"):
        load_task_split("rte", "dev", data_root=tmp_path)


def test_tsv_header_without_a_needed_column(tmp_path):
    _write(tmp_path, "glue/QNLI/dev.tsv", "index\tquestion\tlabel\n0\tWhy?\tentailment\n")
    with pytest.raises(TaskDataError, match=r"QNLI/dev\.tsv:1: missing column\(s\) \['sentence'\]"):
        load_task_split("qnli", "dev", data_root=tmp_path)


def test_tsv_unknown_label(tmp_path):
    _write(
        tmp_path,
        "glue/MNLI/dev_matched.tsv",
        (FIXTURES / "glue" / "MNLI" / "dev_matched.tsv").read_text().replace("\tneutral\n", "\tmaybe\n", 1),
    )
    with pytest.raises(TaskDataError, match=r"dev_matched\.tsv:2: unknown mnli label 'maybe'; valid labels"):
        load_task_split("mnli", "dev_matched", data_root=tmp_path)


def test_cola_bad_label_and_stsb_bad_score(tmp_path):
    _write(tmp_path, "glue/CoLA/dev.tsv", "gj04\t1\t\tGood.\ngj04\t2\t*\tBad label.\n")
    with pytest.raises(TaskDataError, match=r"CoLA/dev\.tsv:2: unknown cola label '2'"):
        load_task_split("cola", "dev", data_root=tmp_path)
    _write(tmp_path, "glue/STS-B/dev.tsv", "index\tsentence1\tsentence2\tscore\n0\ta\tb\tfive\n")
    with pytest.raises(TaskDataError, match=r"STS-B/dev\.tsv:2: stsb score 'five' is not a number"):
        load_task_split("stsb", "dev", data_root=tmp_path)


def test_labelled_split_must_have_labels(tmp_path):
    _write(tmp_path, "glue/WNLI/dev.tsv", "index\tsentence1\tsentence2\n0\ta\tb\n")
    with pytest.raises(TaskDataError, match="header has no 'label' column"):
        load_task_split("wnli", "dev", data_root=tmp_path)


def test_bad_squad_offset_names_the_question(tmp_path):
    doc = json.loads((FIXTURES / "squad" / "dev-v2.0.json").read_text())
    doc["data"][0]["paragraphs"][0]["qas"][1]["answers"][0]["answer_start"] += 1
    _write(tmp_path, "squad/dev-v2.0.json", json.dumps(doc))
    with pytest.raises(
        TaskDataError,
        match=r"question 56ddde6b9a695914005b9629: answer '10th and 11th centuries' is not at answer_start=95",
    ):
        load_task_split("squad_v2", "dev", data_root=tmp_path)


def test_squad_structure_and_version_errors(tmp_path):
    _write(
        tmp_path,
        "squad/dev-v1.1.json",
        '{"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": "c", "qas": [{"id": "q"}]}]}]}',
    )
    with pytest.raises(
        TaskDataError, match=r"data\[0\]\.paragraphs\[0\]\.qas\[0\]: missing or malformed field 'question'"
    ):
        load_task_split("squad_v1", "dev", data_root=tmp_path)
    shutil.copy(FIXTURES / "squad" / "dev-v2.0.json", tmp_path / "squad" / "dev-v1.1.json")
    with pytest.raises(TaskDataError, match=r"version 'v2\.0', which is not a squad_v1 file"):
        load_task_split("squad_v1", "dev", data_root=tmp_path)
    _write(tmp_path, "squad/dev-v1.1.json", '{"version": "1.1", "data": [')
    with pytest.raises(TaskDataError, match=r"dev-v1\.1\.json:1: not valid JSON"):
        load_task_split("squad_v1", "dev", data_root=tmp_path)


def test_bad_conll_line_and_tag(tmp_path):
    _write(tmp_path, "conll2003/eng.testa", "-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nrejects VBZ I-VP\n")
    with pytest.raises(TaskDataError, match=r"eng\.testa:4: expected 4 space-separated columns"):
        load_task_split("conll2003", "dev", data_root=tmp_path)
    _write(tmp_path, "conll2003/eng.testa", "EU NNP I-NP I-ORG\nrejects VBZ I-VP I-XYZ\n")
    with pytest.raises(TaskDataError, match=r"eng\.testa:2: unknown NER tag 'I-XYZ'"):
        load_task_split("conll2003", "dev", data_root=tmp_path)


def test_bad_swag_rows(tmp_path):
    header = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
    _write(tmp_path, "swag/val.csv", header + "0,v,1,A b,A.,b,gold,e0,e1,e2,e3,4\n")
    with pytest.raises(TaskDataError, match=r"val\.csv:2: SWAG label '4' is not one of 0, 1, 2, 3"):
        load_task_split("swag", "dev", data_root=tmp_path)
    _write(tmp_path, "swag/val.csv", header + "0,v,1,A b,A.,b,gold,e0,e1,e2,1\n")
    with pytest.raises(TaskDataError, match=r"val\.csv:2: 11 fields, the header has 12"):
        load_task_split("swag", "dev", data_root=tmp_path)


def test_missing_local_file_says_what_to_do(tmp_path):
    with pytest.raises(TaskDataError, match=r"glue/MNLI/train\.tsv does not exist.*unset BERT_DATA_ROOT"):
        load_task_split("mnli", "train", data_root=tmp_path)


def test_unknown_split_and_task():
    with pytest.raises(KeyError, match=r"mnli has no split 'dev'; valid splits: \['train', 'dev_matched'"):
        load_task_split("mnli", "dev", data_root=FIXTURES)
    with pytest.raises(KeyError, match="unknown task"):
        load_task_split("imdb", "train", data_root=FIXTURES)
