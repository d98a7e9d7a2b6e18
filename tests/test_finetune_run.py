"""Every task kind fine-tunes and evaluates from local official-format files with a tiny model.

The data root mixes the real files of ../shared/data (GLUE, SQuAD v1.1 dev, CoNLL-2003) with the small
official-format fixtures in tests/fixtures/tasks for what shared/data lacks (MNLI, QQP, QNLI train,
SQuAD v2.0, SWAG); SQuAD v1.1 "train" is one article of the real dev file. Each test checks the written
predictions against the official scorers, so the files and the metrics cannot drift apart.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from bert_core.finetune.params import FinetuneParams
from bert_core.finetune.results import FinetuneResult
from bert_core.owned import OUTPUT_MARK

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def data_root(shared_data, tmp_path_factory) -> Path:
    """A data root laid out like shared/data: real files where they exist, fixtures elsewhere."""
    root = tmp_path_factory.mktemp("data_root")
    glue = root / "glue"
    glue.mkdir()
    for task in ("CoLA", "SST-2", "MRPC", "STS-B", "RTE", "WNLI", "diagnostic"):
        os.symlink(shared_data / "glue" / task, glue / task)
    for task in ("MNLI", "QQP"):
        os.symlink(FIXTURES / "glue" / task, glue / task)
    (glue / "QNLI").mkdir()
    for name in ("dev.tsv", "test.tsv"):
        os.symlink(shared_data / "glue" / "QNLI" / name, glue / "QNLI" / name)
    os.symlink(FIXTURES / "glue" / "QNLI" / "train.tsv", glue / "QNLI" / "train.tsv")
    squad = root / "squad"
    squad.mkdir()
    os.symlink(shared_data / "squad" / "dev-v1.1.json", squad / "dev-v1.1.json")
    dev = json.loads((shared_data / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    (squad / "train-v1.1.json").write_text(json.dumps({"version": "1.1", "data": dev["data"][1:2]}))
    for name in ("dev-v2.0.json", "train-v2.0.json"):
        os.symlink(FIXTURES / "squad" / name, squad / name)
    os.symlink(FIXTURES / "swag", root / "swag")
    os.symlink(shared_data / "conll2003", root / "conll2003")
    return root


@pytest.fixture(scope="module")
def tiny_model(shared_data, tmp_path_factory) -> Path:
    """A tiny random BERT in Hugging Face format with the real uncased vocab (as the pretrain stage writes)."""
    from bert_core.config import BertConfig
    from bert_core.model import BertForPreTraining

    path = tmp_path_factory.mktemp("pretrained") / "model"
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    BertForPreTraining(config).save_pretrained(path)
    shutil.copy(shared_data / "checkpoints" / "bert-base-uncased" / "vocab.txt", path / "vocab.txt")
    return path


def _params(**defaults) -> FinetuneParams:
    base = dict(
        train_limit=24,
        eval_limit=16,
        test_limit=8,
        learning_rates=[1e-3],
        seeds=[1],
        epochs=1,
        batch_size=8,
        eval_batch_size=16,
        max_seq_length=64,
    )
    base.update(defaults)
    return FinetuneParams(defaults=base, small_task_seeds=[1], data_checks=False)


def _run(task: str, params: FinetuneParams, tiny_model: Path, data_root: Path, out: Path) -> FinetuneResult:
    from bert_core.finetune.run import finetune_task

    return finetune_task(
        task, params, tiny_model, out / task, model_out=out / "models" / task, data_root=data_root
    )


GLUE_CASES = {
    # task: (dev predictions file or None, leaderboard files)
    "cola": ("dev_predictions.tsv", ["CoLA.tsv"]),
    "sst2": ("dev_predictions.tsv", ["SST-2.tsv"]),
    "mrpc": ("dev_predictions.tsv", ["MRPC.tsv"]),
    "stsb": ("dev_predictions.tsv", ["STS-B.tsv"]),
    "qqp": ("dev_predictions.tsv", ["QQP.tsv"]),
    "mnli": ("dev_matched_predictions.tsv", ["MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"]),
    "qnli": ("dev_predictions.tsv", ["QNLI.tsv"]),
    "rte": ("dev_predictions.tsv", ["RTE.tsv"]),
    "wnli": ("dev_predictions.tsv", ["WNLI.tsv"]),
}


@pytest.mark.parametrize("task", list(GLUE_CASES))
def test_glue_task_end_to_end(task, tiny_model, data_root, tmp_path, monkeypatch, caplog):
    from bert_core.metrics import glue_metrics
    from bert_core.tasks import get_task, load_task_split

    caplog.set_level(logging.INFO, "bert_core")
    monkeypatch.setattr("bert_core.constants.REPO_ROOT", tmp_path)  # the outputs lie in "the repository"
    spec = get_task(task)
    params = _params()
    result = _run(task, params, tiny_model, data_root, tmp_path)
    metrics = result.metrics()
    assert set(spec.metric_keys) <= {k.removeprefix("dev.") for k in metrics}
    # The dev predictions file, re-read and re-scored, gives the recorded metric.
    dev_file, submissions = GLUE_CASES[task]
    lines = (tmp_path / task / dev_file).read_text().splitlines()
    assert lines[0] == "index\tprediction"
    rows = load_task_split(spec, spec.dev_splits[0], data_root=data_root, limit=16)
    values = [line.split("\t")[1] for line in lines[1:]]
    preds = (
        [float(v) for v in values]
        if spec.kind == "regression"
        else [spec.submission_labels.index(v) for v in values]
    )
    if spec.kind == "regression":  # the file clips to [0, 5] and rounds to 3 decimals
        assert all(0.0 <= p <= 5.0 for p in preds)
    else:
        rescored = glue_metrics(task, preds, [r["label"] for r in rows])
        assert rescored[spec.main_metric] == pytest.approx(metrics[f"dev.{spec.main_metric}"])
    # Leaderboard files: header, one line per test row, official label strings.
    for name in submissions:
        sub = (tmp_path / task / "submission" / name).read_text().splitlines()
        assert sub[0] == "index\tprediction" and len(sub) > 1
        for line in sub[1:]:
            _, value = line.split("\t")
            assert (
                (0.0 <= float(value) <= 5.0) if spec.kind == "regression" else value in spec.submission_labels
            )
    if task == "mnli":
        assert "dev_mismatched.accuracy" in metrics
    # Trivial baselines: fitted on the 24 capped training rows, scored on the 16 evaluated rows.
    from bert_core.kinds import get_kind

    train = load_task_split(spec, "train", data_root=data_root, limit=24)
    assert result.baselines == get_kind(spec).baselines(spec, rows, train_rows=train)
    constant = "mean" if spec.kind == "regression" else "majority"
    assert f"baseline.{constant}.{spec.main_metric}" in metrics
    assert json.loads((tmp_path / task / "summary.json").read_text())["baselines"] == result.baselines
    shown = [r.getMessage() for r in caplog.records if "trivial baselines" in r.getMessage()]
    assert shown and shown[0].startswith(f"{task}: trivial baselines: {constant} "), caplog.text
    assert not re.search(r"\d\.\d{5}|[{}]", shown[0]), shown[0]  # figures to 4 digits, not a dict's repr
    # The selected model is a Hugging Face directory that transformers loads with its head.
    model_dir = tmp_path / "models" / task
    assert (model_dir / "config.json").is_file() and (model_dir / "model.safetensors").is_file()
    assert (model_dir / "tokenizer.json").is_file()
    # ... with the serving task JSON beside it: the directory serves as its registered version does.
    from bert_core.serving import serving_task
    from bert_core.serving.local import hf_task

    assert hf_task(model_dir) == serving_task(spec, params.for_task(task))
    assert FinetuneResult.load(tmp_path / task / "summary.json").metrics() == pytest.approx(metrics)
    # The summary (a DVC output) names its files relative to the repository: the same bytes in every clone.
    named = json.loads((tmp_path / task / "summary.json").read_text())["outputs"]
    assert named["model"] == f"models/{task}" and f"{task}/{dev_file}" in named.values()
    assert all(not Path(p).is_absolute() and (tmp_path / p).exists() for p in named.values())


def test_squad_v1_real_dev_subset(tiny_model, data_root, tmp_path):
    from bert_core.metrics import squad_metrics
    from bert_core.tasks import load_task_split

    params = _params(max_seq_length=128, doc_stride=32, eval_limit=12, train_limit=16)
    result = _run("squad_v1", params, tiny_model, data_root, tmp_path)
    preds = json.loads((tmp_path / "squad_v1" / "dev" / "predictions.json").read_text())
    rows = load_task_split("squad_v1", "dev", data_root=data_root, limit=12)
    assert set(preds) == {r["id"] for r in rows}
    for row in rows:  # every answer is a span of its own context
        assert preds[row["id"]] in row["context"]
    scored = squad_metrics(rows, preds, version="squad_v1")
    assert scored["f1"] == pytest.approx(result.metrics()["dev.f1"])
    assert {"dev.exact_match", "dev.f1"} <= set(result.metrics())


def test_squad_v2_fixture_records_null_threshold(tiny_model, data_root, tmp_path):
    from bert_core.metrics import squad_metrics
    from bert_core.tasks import load_task_split

    params = _params(max_seq_length=96, doc_stride=32)
    result = _run("squad_v2", params, tiny_model, data_root, tmp_path)
    metrics = result.metrics()
    assert "dev.null_threshold" in metrics and {
        "dev.f1",
        "dev.exact",
        "dev.HasAns_f1",
        "dev.NoAns_f1",
    } <= set(metrics)
    out = tmp_path / "squad_v2" / "dev"
    preds = json.loads((out / "predictions.json").read_text())
    odds = json.loads((out / "null_odds.json").read_text())
    assert set(preds) == set(odds)
    threshold = metrics["dev.null_threshold"]
    assert all((preds[q] == "") == (odds[q] > threshold) for q in preds)
    rows = load_task_split("squad_v2", "dev", data_root=data_root, limit=16)
    assert squad_metrics(rows, preds, version="squad_v2")["f1"] == pytest.approx(metrics["dev.f1"])
    # The tuned threshold is in the model directory's task.json, as in the registered version's.
    task = json.loads((tmp_path / "models" / "squad_v2" / "task.json").read_text())
    assert task["kind"] == "span_qa" and task["null_threshold"] == threshold


def test_swag_fixture(tiny_model, data_root, tmp_path):
    result = _run("swag", _params(), tiny_model, data_root, tmp_path)
    lines = (tmp_path / "swag" / "dev_predictions.csv").read_text().splitlines()
    assert lines[0] == "id,pred,prob0,prob1,prob2,prob3"
    probs = [sum(float(x) for x in line.split(",")[2:]) for line in lines[1:]]
    assert all(p == pytest.approx(1.0, abs=1e-4) for p in probs)
    assert "dev.accuracy" in result.metrics() and (tmp_path / "swag" / "test_predictions.csv").is_file()
    assert (
        set(result.baselines) == {"majority", "tfidf_ending"}
        and "baseline.majority.accuracy" in result.metrics()
    )


def test_conll_ner_file_scores_like_the_metric(tiny_model, data_root, tmp_path):
    from bert_core.metrics import conll_file_metrics

    result = _run("conll2003", _params(), tiny_model, data_root, tmp_path)
    path = tmp_path / "conll2003" / "dev_predictions.conll"
    sentences = path.read_text().strip().split("\n\n")
    assert len(sentences) == 16 and all(
        len(line.split(" ")) == 3 for s in sentences for line in s.splitlines()
    )
    assert conll_file_metrics(path)["f1"] == pytest.approx(result.metrics()["dev.f1"])
    assert set(result.baselines) == {"majority", "lexicon"} and "baseline.lexicon.f1" in result.metrics()


def test_grid_seeds_random_baseline_and_selection(tiny_model, data_root, tmp_path):
    base = _params(
        learning_rates=[1e-3, 1e-4], random_init_baseline=True, evals_per_epoch=2, predict_test=False
    )
    # rte is a small task: it gets small_task_seeds unless its own overrides set seeds
    params = base.model_copy(update={"small_task_seeds": [1, 2]})
    assert params.for_task("rte").seeds == [1, 2] and params.for_task("sst2").seeds == [1]
    result = _run("rte", params, tiny_model, data_root, tmp_path)
    assert len(result.trials) == 8
    assert {(t.init, t.learning_rate, t.seed) for t in result.trials} == {
        (i, lr, s) for i in ("pretrained", "random") for lr in (1e-3, 1e-4) for s in (1, 2)
    }
    pretrained = [t for t in result.trials if t.init == "pretrained"]
    best = max(t.dev["accuracy"] for t in pretrained)
    assert result.selected.init == "pretrained" and result.selected.dev["accuracy"] == best
    metrics = result.metrics()
    assert metrics["seeds"] == 2 and "dev.accuracy_std" in metrics
    same_lr = [t.dev["accuracy"] for t in pretrained if t.learning_rate == result.selected.learning_rate]
    assert metrics["dev.accuracy_mean"] == pytest.approx(sum(same_lr) / 2)
    assert metrics["gap.dev.accuracy"] == pytest.approx(
        metrics["dev.accuracy"] - metrics["random_init.dev.accuracy"]
    )
    # learning curves: two dev evaluations per epoch, losses logged along the way
    assert len(result.selected.evals) == 2 and result.selected.history
    assert all(math.isfinite(h["loss"]) for h in result.selected.history)
    assert not (tmp_path / "rte" / "submission").exists()


def test_data_checks_and_bad_inputs(tiny_model, data_root, tmp_path):
    from bert_core.finetune.run import finetune_task
    from bert_core.tasks import TaskDataError

    params = FinetuneParams(
        defaults=dict(
            train_limit=16, eval_limit=8, learning_rates=[1e-3], epochs=1, batch_size=8, predict_test=False
        ),
        data_checks=True,
    )
    seen = []
    finetune_task("sst2", params, tiny_model, tmp_path / "ok", data_root=data_root, on_data=seen.append)
    assert {r.suite for r in seen[0].check_reports} == {"task-sst2-train", "task-sst2-dev"}
    assert all(r.success for r in seen[0].check_reports)

    no_tokenizer = tmp_path / "bare"
    shutil.copytree(tiny_model, no_tokenizer)
    (no_tokenizer / OUTPUT_MARK).unlink(missing_ok=True)  # edited by hand: a user's own checkpoint
    (no_tokenizer / "vocab.txt").unlink()
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        finetune_task("sst2", params, no_tokenizer, tmp_path / "x", data_root=data_root)
    empty_root = tmp_path / "empty_root"
    empty_root.mkdir()
    with pytest.raises(TaskDataError, match=r"train\.tsv"):
        finetune_task("sst2", params, tiny_model, tmp_path / "y", data_root=empty_root)
    assert not (tmp_path / "y").exists()  # a failed run leaves no finished-looking output

    short = tmp_path / "short_positions"  # a position table shorter than SST-2's default 128 tokens
    shutil.copytree(tiny_model, short)
    (short / OUTPUT_MARK).unlink(missing_ok=True)  # edited by hand: a user's own checkpoint
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    with pytest.raises(ValueError, match=r"max_seq_length=128 is longer than .*max_position_embeddings=64"):
        finetune_task("sst2", params, short, tmp_path / "z", data_root=data_root)
    assert not (tmp_path / "z").exists()
