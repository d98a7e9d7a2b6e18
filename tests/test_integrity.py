"""Stored outputs are verified before use: each written by its real writer on tiny data, then damaged in place
(same size), and every reader refuses it naming the file; a manifest-less output is range-checked; a re-written
output passes again; a NaN weight never becomes a prediction."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bert_core.atomic import atomic_path
from bert_core.integrity import HASH_NAME, CorruptOutputError, read_manifest, verify_output
from bert_core.owned import OUTPUT_MARK
from bert_core.pretrain_data.build import build_pretrain_data
from bert_core.pretrain_data.params import PretrainDataParams
from bert_core.pretrain_data.storage import InstanceStore
from bert_core.pretrain_data.testing import make_synthetic_inputs

DAMAGED = r"is damaged: its content changed since it was written .*same size.*dvc repro.*dvc checkout"


def flip(path: Path, at: float = 0.5, n: int = 4) -> None:
    """Invert ``n`` bytes at fraction ``at`` of the file, keeping its size (damage in place)."""
    data = bytearray(path.read_bytes())
    i = min(int(len(data) * at), len(data) - n)
    data[i : i + n] = bytes(b ^ 0xFF for b in data[i : i + n])
    path.write_bytes(bytes(data))


def test_the_manifest_lists_every_file_deterministically(tmp_path):
    out = tmp_path / "out"
    for _ in range(2):
        with atomic_path(out, is_dir=True) as tmp:
            (tmp / "b.txt").write_text("bee")
            (tmp / "sub").mkdir()
            (tmp / "sub" / "a.bin").write_bytes(b"\x00" * 10)
        if _ == 0:
            first = (out / OUTPUT_MARK).read_bytes()
    assert (out / OUTPUT_MARK).read_bytes() == first  # same content, same bytes: DVC hashes stay put
    manifest = json.loads(first)
    assert list(manifest) == ["files", "written_by"]
    assert manifest["files"]["sub/a.bin"]["size"] == 10
    assert len(manifest["files"]["b.txt"][HASH_NAME]) == 32
    assert verify_output(out) == [out / "b.txt", out / "sub" / "a.bin"]


def test_a_file_replaced_inside_a_marked_output_is_recorded_again(tmp_path):
    out = tmp_path / "out"
    with atomic_path(out, is_dir=True) as tmp:
        (tmp / "a.json").write_text("{}")
    with atomic_path(out / "a.json") as tmp:
        tmp.write_text('{"x": 1}')
    verify_output(out, ["a.json"])
    assert read_manifest(out)["files"]["a.json"]["size"] == 8


# ------------------------------------------------------------------------------------------- pretraining


@pytest.fixture(scope="module")
def pretrain_out(tmp_path_factory) -> tuple[Path, Path, Path]:
    corpus, vocab = make_synthetic_inputs(tmp_path_factory.mktemp("in"), n_train=200, n_heldout=60)
    out = tmp_path_factory.mktemp("pd") / "pretrain_data"
    params = PretrainDataParams(
        dupe_factor=1,
        num_workers=1,
        window_tokens=5_000,
        min_window_docs=16,
        task_bytes=100_000,
        check_sample=50_000,
    )
    build_pretrain_data(
        params, corpus_dir=corpus, vocab_dir=vocab, output_dir=out, report_dir=out.parent / "r"
    )
    return out, corpus, vocab


def _copy(out: Path, tmp_path: Path) -> tuple[Path, Path]:
    copy = tmp_path / "pretrain_data"
    shutil.copytree(out, copy)
    return copy, next(copy.glob("*/train"))


def test_a_pretraining_shard_damaged_in_place_is_refused_by_name(pretrain_out, tmp_path):
    _, data = _copy(pretrain_out[0], tmp_path)
    InstanceStore(data)  # intact: opens
    shard = data / "shard-00000.tokens.bin"
    flip(shard)
    with pytest.raises(CorruptOutputError, match=rf"{shard}.*{DAMAGED}"):
        InstanceStore(data)


def test_a_damaged_index_is_refused_by_name(pretrain_out, tmp_path):
    _, data = _copy(pretrain_out[0], tmp_path)
    flip(data / "index.json", at=0.0, n=1)  # "{" no more: not even JSON
    with pytest.raises(CorruptOutputError, match=rf"{data / 'index.json'} is damaged"):
        InstanceStore(data)


@pytest.mark.parametrize("damage", ["token", "offsets"])
def test_without_a_manifest_an_out_of_range_file_is_refused_by_name(pretrain_out, tmp_path, damage):
    copy, data = _copy(pretrain_out[0], tmp_path)
    (copy / OUTPUT_MARK).unlink()  # an output written before manifests existed
    store = InstanceStore(data)
    if damage == "token":
        path = data / "shard-00000.tokens.bin"
        tokens = np.memmap(path, dtype=store.index["token_dtype"], mode="r+")
        tokens[5] = store.vocab_size  # one past the vocabulary
        tokens.flush()
        del tokens, store
        match = rf"{path} is damaged: token id \d+ at position 5 is outside \[0, \d+\)"
    else:
        path = data / "shard-00000.offsets.bin"
        offsets = np.memmap(path, dtype=np.int64, mode="r+")
        offsets[2] = offsets[1] - 1  # a step back
        offsets.flush()
        del offsets, store
        match = rf"{path} is damaged: entry 1 spans -?\d+ items"
    with pytest.raises(CorruptOutputError, match=match):
        InstanceStore(data)


def test_a_rewritten_pretraining_output_passes_again(pretrain_out, tmp_path):
    out, corpus, vocab = pretrain_out
    copy, data = _copy(out, tmp_path)
    flip(data / "shard-00000.tokens.bin")
    with pytest.raises(CorruptOutputError):
        InstanceStore(data)
    params = PretrainDataParams(
        dupe_factor=1,
        num_workers=1,
        window_tokens=5_000,
        min_window_docs=16,
        task_bytes=100_000,
        check_sample=50_000,
    )
    build_pretrain_data(
        params, corpus_dir=corpus, vocab_dir=vocab, output_dir=copy, report_dir=tmp_path / "r"
    )
    assert len(InstanceStore(data)) > 0


def test_a_damaged_vocab_is_refused_by_name(pretrain_out, tmp_path):
    from bert_core.vocab.info import read_vocab

    _, data = _copy(pretrain_out[0], tmp_path)
    flip(data / "vocab.txt", at=0.9, n=1)
    with pytest.raises(CorruptOutputError, match=rf"{data / 'vocab.txt'} is damaged"):
        read_vocab(data / "vocab.txt")


# ------------------------------------------------------------------------------------------- corpus


def test_a_corpus_shard_damaged_in_place_is_refused_by_name(tmp_path):
    from bert_core.corpus.shards import DocumentShardWriter, iter_shard_batches, open_shard

    with atomic_path(tmp_path / "corpus", is_dir=True) as tmp:
        writer = DocumentShardWriter(tmp / "train", max_bytes=10_000_000)
        for i in range(50):
            text = [f"Sentence {j} of document {i}." for j in range(5)]
            writer.write({"doc_id": str(i), "source": "t", "title": str(i), "sentences": text}, 150)
        writer.close()
    shard = tmp_path / "corpus" / "train" / "part-00000.parquet"
    assert sum(b.num_rows for b in iter_shard_batches(open_shard(shard), shard)) == 50
    flip(shard, at=0.3)
    with pytest.raises(CorruptOutputError, match=rf"{shard}.*{DAMAGED}"):
        open_shard(shard)


# ------------------------------------------------------------------------------------------- models


def _model_dir(path: Path) -> Path:
    from bert_core.config import BertConfig
    from bert_core.model import BertForSequenceClassification

    config = BertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        num_labels=2,
    )
    torch.manual_seed(0)
    return BertForSequenceClassification(config).save_pretrained(path)


def test_a_model_weight_file_damaged_in_place_is_refused_by_name(tmp_path):
    from bert_core.hf import CheckpointError
    from bert_core.model import BertForSequenceClassification

    path = _model_dir(tmp_path / "model")
    weights = path / "model.safetensors"
    BertForSequenceClassification.from_pretrained(path)
    flip(weights, at=0.6)
    with pytest.raises(CorruptOutputError, match=rf"{weights}.*{DAMAGED}"):
        BertForSequenceClassification.from_pretrained(path)
    (path / OUTPUT_MARK).unlink()  # a user's own directory: no checksums, safetensors' error names the file
    flip(weights, at=0.6)  # undo
    flip(weights, at=0.0005, n=2)  # the header's JSON
    with pytest.raises(CheckpointError, match=rf"{weights} \(\d+ bytes\) cannot be read as safetensors"):
        BertForSequenceClassification.from_pretrained(path)


def test_checkpoints_check_reports_a_damaged_model_in_one_line(tmp_path, capsys):
    from flows.checkpoints import main

    path = _model_dir(tmp_path / "model")
    (path / "vocab.txt").write_text("\n".join(f"t{i}" for i in range(40)) + "\n")
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ok (vocabulary 40 tokens" in out and ("fine-tuning only" in out) == ("40 rows" not in out)
    flip(path / "model.safetensors", at=0.0005, n=2)
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.safetensors" in err and "Traceback" not in err
    (path / OUTPUT_MARK).unlink()  # no checksum: the header itself fails, still one line naming the file
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.safetensors" in err and "Traceback" not in err


def _with_nan(path: Path, tensor: str) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(path / "model.safetensors")
    state[tensor][0, 0] = float("nan")
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})


def test_a_nan_weight_makes_prediction_fail_naming_the_model(tmp_path):
    from serving_models import build_model, task_json

    from bert_core.hf import CheckpointError
    from bert_core.serving.predictor import NonFiniteOutputError, Predictor

    path = build_model("sst2", tmp_path / "model")
    predictor = Predictor(path, task_json("sst2"), device="cpu")
    with torch.no_grad():  # damaged after loading (or a numerically broken model): outputs are checked
        predictor.model.classifier.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteOutputError, match=rf"model {path} produced NaN"):
        predictor.predict({"text": "a fine film"})
    _with_nan(path, "classifier.weight")  # damaged on disk: refused when loaded
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor classifier\.weight holds 1 NaN"):
        Predictor(path, task_json("sst2"), device="cpu")
