"""bench/bench_finetune_released.py: the run_qa-style reference agrees with our SQuAD features, and the
bench runs end to end on a tiny model (real data from shared/data; skipped when it is absent)."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from bench import _hf_qa
from bench import bench_finetune_released as bench


def _squad_rows(root, n):
    from bert_core.tasks import get_task, load_task_split

    return list(load_task_split(get_task("squad_v1"), "dev", data_root=root, limit=n))


@pytest.fixture(scope="module")
def tokenizer(shared_data):
    from transformers import BertTokenizerFast

    return BertTokenizerFast(vocab=str(shared_data / "checkpoints" / "bert-base-uncased" / "vocab.txt"))


def test_run_qa_features_label_the_same_tokens_as_ours(shared_data, tokenizer):
    """Where both have one window per question, run_qa's labels and ours point at the same tokens."""
    from bert_core.kinds.span_qa import encode_squad

    rows = _squad_rows(shared_data, 60)
    theirs = _hf_qa.prepare_train_features(rows, tokenizer, 384, 128)
    ours = encode_squad(rows, tokenizer, max_seq_length=384, doc_stride=128, with_offsets=False)
    assert len(theirs) == len(ours) == len(rows)  # dev contexts of the first article fit one window
    for t, o in zip(theirs, ours):
        assert t["input_ids"] == o["input_ids"]
        assert (t["start_positions"], t["end_positions"]) == (o["start_positions"], o["end_positions"])
        assert t["start_positions"] > 0


def test_run_qa_postprocessing_recovers_gold_answers(shared_data, tokenizer):
    """Logits peaked at the gold tokens give back the gold answers (up to answers that end inside a token)."""
    import numpy as np

    from bert_core.metrics import squad_metrics

    rows = _squad_rows(shared_data, 30)
    train = _hf_qa.prepare_train_features(rows, tokenizer, 384, 128)
    inputs, meta = _hf_qa.prepare_validation_features(rows, tokenizer, 384, 128)
    width = max(len(f["input_ids"]) for f in inputs)
    start, end = np.full((len(inputs), width), -100.0), np.full((len(inputs), width), -100.0)
    for i, f in enumerate(train):
        start[i, : len(f["input_ids"])] = end[i, : len(f["input_ids"])] = 0.0
        start[i, f["start_positions"]] = end[i, f["end_positions"]] = 10.0
    answers = _hf_qa.postprocess_qa_predictions(rows, meta, start, end)
    scores = squad_metrics(rows, answers, version="squad_v1")
    assert scores["exact_match"] >= 95.0 and scores["f1"] >= 95.0  # e.g. gold "gold" in the token "golden"


def test_squad_split_by_article():
    rows = [{"title": t, "id": f"{t}{i}"} for t in "abcde" for i in range(2)]
    first, last = bench.squad_split(rows, 2)
    assert {r["title"] for r in first} == {"a", "b"} and {r["title"] for r in last} == {"d", "e"}
    with pytest.raises(SystemExit, match="only 5 articles"):
        bench.squad_split(rows, 3)


@pytest.mark.slow
def test_bench_runs_on_a_tiny_model(shared_data, tmp_path, capsys):
    from bert_core.config import BertConfig
    from bert_core.model import BertModel

    model_dir = tmp_path / "tiny"
    BertModel(BertConfig.from_preset("tiny", vocab_size=30522)).save_pretrained(model_dir)
    shutil.copy(shared_data / "checkpoints" / "bert-base-uncased" / "vocab.txt", model_dir / "vocab.txt")
    out = tmp_path / "results.json"
    argv = [
        "--data-root",
        str(shared_data),
        "--model-dir",
        str(model_dir),
        "--seeds",
        "1",
        "--threads",
        "1",
        "--batch-size",
        "4",
        "--sst2-train-rows",
        "8",
        "--sst2-dev-rows",
        "8",
        "--squad-articles",
        "2",
        "--squad-train-questions",
        "8",
        "--squad-eval-questions",
        "8",
        "--json",
        str(out),
    ]
    assert bench.main(argv) == 0
    table = capsys.readouterr().out
    assert re.search(r"\| sst2 +\| ours / hf +\|", table) and re.search(r"\| squad +\| ours / hf +\|", table)
    raw = json.loads(out.read_text())["raw"]
    for task in ("sst2", "squad"):
        assert {len(raw[task]["results"][c]) for c in ("ours", "hf")} == {1}
    assert raw["squad"]["dev_rows"] == 8
