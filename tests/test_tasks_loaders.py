"""Task loaders on the real official files (shared/data) and on official-format fixtures for the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from bert_core.tasks import TaskRows, get_task, load_task_split

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"

SCHEMAS = {
    "classification": {"id", "text_a", "text_b", "label"},
    "regression": {"id", "text_a", "text_b", "label"},
    "span_qa": {"id", "title", "context", "question", "answers", "is_impossible"},
    "token_classification": {"id", "tokens", "tags"},
    "multiple_choice": {"id", "context", "start", "endings", "label"},
}

# Official row counts (shared/data/PROVENANCE.md).
REAL_COUNTS = [
    ("cola", "train", 8551),
    ("cola", "dev", 1043),
    ("cola", "test", 1063),
    ("sst2", "train", 67349),
    ("sst2", "dev", 872),
    ("sst2", "test", 1821),
    ("mrpc", "train", 3668),
    ("mrpc", "dev", 408),
    ("mrpc", "test", 1725),
    ("stsb", "train", 5749),
    ("stsb", "dev", 1500),
    ("stsb", "test", 1379),
    ("qnli", "dev", 5463),
    ("qnli", "test", 5463),
    ("rte", "train", 2490),
    ("rte", "dev", 277),
    ("rte", "test", 3000),
    ("wnli", "train", 635),
    ("wnli", "dev", 71),
    ("wnli", "test", 146),
    ("mnli", "diagnostic", 1104),
    ("squad_v1", "dev", 10570),
    ("conll2003", "train", 14041),
    ("conll2003", "dev", 3250),
    ("conll2003", "test", 3453),
]

FIXTURE_COUNTS = [
    ("mnli", "train", 5),
    ("mnli", "dev_matched", 4),
    ("mnli", "dev_mismatched", 3),
    ("mnli", "test_matched", 2),
    ("mnli", "test_mismatched", 2),
    ("qqp", "train", 4),
    ("qqp", "dev", 3),
    ("qqp", "test", 2),
    ("qnli", "train", 3),
    ("squad_v2", "train", 18),
    ("squad_v2", "dev", 18),
    ("swag", "train", 3),
    ("swag", "dev", 2),
    ("swag", "test", 2),
]


def _check_schema(spec, split, rows):
    assert isinstance(rows, TaskRows) and isinstance(rows, list)
    assert rows.task == spec.name and rows.split == split
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(ids) and all(isinstance(i, str) for i in ids)
    for r in rows:
        assert set(r) == SCHEMAS[spec.kind]
    labelled = split not in spec.test_splits
    if spec.kind == "classification":
        assert all((r["label"] in range(len(spec.labels))) if labelled else r["label"] is None for r in rows)
        pair = spec.name not in ("cola", "sst2")
        assert all((r["text_b"] is not None) == pair for r in rows)
    elif spec.kind == "regression":
        assert all((0.0 <= r["label"] <= 5.0) if labelled else r["label"] is None for r in rows)
    elif spec.kind == "token_classification":
        assert all(
            len(r["tokens"]) == len(r["tags"]) > 0 and set(r["tags"]) <= set(spec.labels) for r in rows
        )
    elif spec.kind == "multiple_choice":
        assert all(len(r["endings"]) == 4 for r in rows)
        assert all((r["label"] in range(4)) if labelled else r["label"] is None for r in rows)


@pytest.mark.parametrize(("task", "split", "count"), REAL_COUNTS)
def test_real_files_load_with_official_counts(shared_data, task, split, count):
    rows = load_task_split(task, split, data_root=shared_data)
    assert len(rows) == count and rows.skipped == {}
    assert rows.source == str(shared_data / get_task(task).local_files[split])
    _check_schema(get_task(task), split, rows)


@pytest.mark.parametrize(("task", "split", "count"), FIXTURE_COUNTS)
def test_fixtures_load(task, split, count):
    rows = load_task_split(task, split, data_root=FIXTURES)
    assert len(rows) == count
    _check_schema(get_task(task), split, rows)


def test_known_values(shared_data):
    mrpc = load_task_split("mrpc", "dev", data_root=shared_data)  # the header line has a UTF-8 BOM
    assert mrpc[0]["label"] == 1 and mrpc[0]["text_a"].startswith("He said the foodservice pie business")
    assert load_task_split("stsb", "dev", data_root=shared_data)[0]["label"] == 5.0
    qnli = load_task_split("qnli", "dev", data_root=shared_data)
    assert qnli[0]["label"] == get_task("qnli").label_index("entailment")
    assert load_task_split("mrpc", "test", data_root=shared_data)[0]["id"] == "0"
    squad = load_task_split("squad_v1", "dev", data_root=shared_data)
    assert squad[0]["id"] == "56be4db0acb8001400a502ec" and squad[0]["title"] == "Super_Bowl_50"
    assert all(not r["is_impossible"] and len(r["answers"]["text"]) >= 1 for r in squad)


def test_tsv_quotes_are_literal_text(shared_data):
    # GLUE processors read TSVs with quoting disabled: a field that starts with " keeps its quote.
    mrpc = load_task_split("mrpc", "dev", data_root=shared_data)
    assert mrpc[0]["text_b"].startswith('" The foodservice pie business')


def test_fixture_specifics():
    mnli = load_task_split("mnli", "dev_mismatched", data_root=FIXTURES)
    assert [r["label"] for r in mnli] == [2, 2, 0]  # contradiction, contradiction, entailment
    assert "`operate'" in mnli[1]["text_a"]
    qqp = load_task_split("qqp", "train", data_root=FIXTURES)
    assert qqp.skipped == {"malformed row": 2} and qqp.n_skipped == 2  # one question broken over two lines
    assert qqp[-1]["text_b"] == 'When do you use "&" instead of "and"?'
    squad = load_task_split("squad_v2", "dev", data_root=FIXTURES)
    assert sum(r["is_impossible"] for r in squad) == 7
    assert all(r["answers"] == {"text": [], "answer_start": []} for r in squad if r["is_impossible"])
    swag = load_task_split("swag", "train", data_root=FIXTURES)
    assert swag[0]["endings"][0] == "pats her shoulder, then saunters toward someone."
    assert (swag[0]["context"], swag[0]["start"], swag[0]["label"]) == (
        "Students lower their eyes nervously.",
        "She",
        2,
    )


def test_conll_token_counts_and_iob2_copy_agree(shared_data, tmp_path):
    counts = {"train": 203621, "dev": 51362, "test": 46435}
    (tmp_path / "conll2003").mkdir()
    (tmp_path / "conll2003" / "iob2").symlink_to(shared_data / "conll2003" / "iob2")
    for split, n_tokens in counts.items():
        original = load_task_split("conll2003", split, data_root=shared_data)
        assert sum(len(r["tokens"]) for r in original) == n_tokens
        iob2 = load_task_split("conll2003", split, data_root=tmp_path)  # only iob2/*.txt there
        assert iob2.source.endswith(".txt")
        assert list(iob2) == list(original)


def test_limit_and_env_var(shared_data, monkeypatch):
    monkeypatch.setenv("BERT_DATA_ROOT", str(shared_data))
    rows = load_task_split("sst2", "train", limit=10)
    assert len(rows) == 10 and rows.source.startswith(str(shared_data.resolve()))
    assert len(load_task_split("conll2003", "dev", limit=3)) == 3
    assert len(load_task_split("squad_v1", "dev", limit=5)) == 5
    with pytest.raises(ValueError, match="positive"):
        load_task_split("sst2", "train", limit=0)
