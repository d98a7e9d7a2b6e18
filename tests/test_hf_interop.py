"""Exact interop with Hugging Face transformers: same names, same numbers, directories that load both ways.

Everything runs in fp32 on the CPU with small random models (no Hub access). "Theirs into ours" goes
through ``transformers``' ``save_pretrained`` and our ``from_pretrained``; "ours into theirs" through
our ``save_pretrained`` and ``transformers.AutoModelFor*.from_pretrained``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bert_core import model as ours_mod
from bert_core.config import BertConfig
from bert_core.hf import CheckpointError, UnsafeCheckpointError, read_state_dict

transformers = pytest.importorskip("transformers")

B, T, C, V = 3, 9, 2, 99
ATOL = 1e-5

# our class name -> the transformers Auto class that must load what we save
AUTO = {
    "BertModel": "AutoModel",
    "BertForPreTraining": "AutoModelForPreTraining",
    "BertForMaskedLM": "AutoModelForMaskedLM",
    "BertForSequenceClassification": "AutoModelForSequenceClassification",
    "BertForTokenClassification": "AutoModelForTokenClassification",
    "BertForQuestionAnswering": "AutoModelForQuestionAnswering",
    "BertForMultipleChoice": "AutoModelForMultipleChoice",
}
HEADS = list(AUTO)


@pytest.fixture(autouse=True)
def _quiet_and_single_threaded():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    yield
    torch.set_num_threads(threads)


def make_config(name: str = "BertModel", **overrides) -> BertConfig:
    values = dict(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        num_labels=2 if name == "BertForQuestionAnswering" else 3,
    )
    values.update(overrides)
    return BertConfig(**values)


def hf_config(config: BertConfig):
    return transformers.BertConfig(**config.to_hf_dict())


def make_inputs(name: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Padded batch with both segment ids; (B, C, T) for multiple choice."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    segments = torch.zeros(B, T, dtype=torch.long)
    segments[:, 4:] = 1
    batch = {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": segments * mask}
    if name == "BertForMultipleChoice":
        batch = {k: torch.stack([v, v.roll(1, dims=0)], dim=1) for k, v in batch.items()}  # (B, C, T)
    return batch


def make_labels(name: str, config: BertConfig, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if name in ("BertForPreTraining", "BertForMaskedLM"):
        labels = torch.full((B, T), -100)
        for i, j in [(0, 0), (0, 7), (1, 2), (1, 5), (2, 1)]:
            labels[i, j] = int(torch.randint(0, V, (1,), generator=g))
        out = {"labels": labels}
        if name == "BertForPreTraining":
            out["next_sentence_label"] = torch.tensor([0, 1, 1])
        return out
    if name == "BertForSequenceClassification":
        if config.num_labels == 1:
            return {"labels": torch.rand(B, generator=g)}
        return {"labels": torch.randint(0, config.num_labels, (B,), generator=g)}
    if name == "BertForTokenClassification":
        labels = torch.randint(0, config.num_labels, (B, T), generator=g)
        labels[:, 0] = -100
        return {"labels": labels}
    if name == "BertForQuestionAnswering":
        return {"start_positions": torch.tensor([1, 4, 40]), "end_positions": torch.tensor([2, 5, 40])}
    if name == "BertForMultipleChoice":
        return {"labels": torch.tensor([0, 1, 1])}
    return {}


def outputs(name: str, out) -> dict[str, torch.Tensor]:
    """The comparable tensors of an output (ours or theirs: same field names where it matters)."""
    if name == "BertModel":
        return {"last_hidden_state": out.last_hidden_state, "pooler_output": out.pooler_output}
    if name == "BertForPreTraining":
        return {
            "prediction_logits": out.prediction_logits,
            "seq_relationship_logits": out.seq_relationship_logits,
        }
    if name == "BertForQuestionAnswering":
        return {"start_logits": out.start_logits, "end_logits": out.end_logits}
    return {"logits": out.logits}


def base(model):
    return model if isinstance(model, ours_mod.BertModel | transformers.BertModel) else model.bert


def flat(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.reshape(-1, v.shape[-1]) for k, v in batch.items()}


@torch.no_grad()
def randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Non-trivial values everywhere (LayerNorm weights and biases included)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g) * 0.1
        p.copy_(1.0 + noise if name.endswith("LayerNorm.weight") else noise)


def assert_same_outputs(name: str, ours, theirs, inputs) -> None:
    with torch.no_grad():
        a, b = ours(**inputs), theirs(**inputs)
        for key, value in outputs(name, a).items():
            diff = (value - outputs(name, b)[key]).abs().max().item()
            assert diff <= ATOL, f"{name}.{key}: max abs diff {diff}"
        hidden_inputs = flat(inputs) if name == "BertForMultipleChoice" else inputs
        ha = base(ours)(**hidden_inputs).last_hidden_state
        hb = base(theirs)(**hidden_inputs).last_hidden_state
        assert (ha - hb).abs().max().item() <= ATOL, f"{name}: hidden states differ"


# ---------------------------------------------------------------------------------------------- names
@pytest.mark.parametrize("name", HEADS)
def test_parameter_names_and_shapes_match_transformers(name):
    config = make_config(name)
    ours = getattr(ours_mod, name)(config)
    theirs = getattr(transformers, name)(hf_config(config))
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == {
        k: tuple(v.shape) for k, v in theirs.state_dict().items()
    }


# ---------------------------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("name", HEADS)
def test_transformers_model_loads_into_ours_with_equal_outputs(name, tmp_path):
    config = make_config(name)
    theirs = getattr(transformers, name)(hf_config(config)).eval()
    randomise(theirs)
    theirs.save_pretrained(tmp_path)
    ours, report = getattr(ours_mod, name).from_pretrained(tmp_path, output_loading_info=True)
    assert not ours.training
    assert (report.missing_keys, report.unexpected_keys, report.mismatched_keys) == ([], [], [])
    assert ours.config == config
    assert_same_outputs(name, ours, theirs, make_inputs(name))


@pytest.mark.parametrize("name", HEADS)
def test_our_model_loads_into_transformers_auto_class_with_equal_outputs(name, tmp_path):
    config = make_config(name)
    ours = getattr(ours_mod, name)(config).eval()
    randomise(ours)
    ours.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [name]
    auto = getattr(transformers, AUTO[name])
    theirs, info = auto.from_pretrained(tmp_path, output_loading_info=True)
    assert type(theirs).__name__ == name
    assert (set(info["missing_keys"]), set(info["unexpected_keys"]), set(info["mismatched_keys"])) == (
        set(),
        set(),
        set(),
    )
    assert_same_outputs(name, ours, theirs.eval(), make_inputs(name))


@pytest.mark.parametrize(
    ("name", "overrides"),
    [(h, {}) for h in HEADS if h != "BertModel"] + [("BertForSequenceClassification", {"num_labels": 1})],
)
def test_losses_equal_transformers(name, overrides):
    config = make_config(name, **overrides)
    ours = getattr(ours_mod, name)(config).eval()
    randomise(ours)
    theirs = getattr(transformers, name)(hf_config(config)).eval()
    theirs.load_state_dict(ours.state_dict())
    inputs = {**make_inputs(name), **make_labels(name, config)}
    with torch.no_grad():
        a, b = ours(**inputs).loss, theirs(**inputs).loss
    assert abs(a.item() - b.item()) <= ATOL, f"{name}: loss {a.item()} vs transformers {b.item()}"


def test_sparse_mlm_loss_and_gradients_equal_transformers_dense_ones():
    name = "BertForPreTraining"
    config = make_config(name, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = getattr(ours_mod, name)(config)
    randomise(ours)
    theirs = getattr(transformers, name)(hf_config(config))
    theirs.load_state_dict(ours.state_dict())
    inputs = {**make_inputs(name), **make_labels(name, config)}
    out_ours, out_theirs = ours(**inputs), theirs(**inputs)
    expected_mlm = torch.nn.functional.cross_entropy(
        out_theirs.prediction_logits.reshape(-1, V), inputs["labels"].reshape(-1), ignore_index=-100
    )
    assert abs(out_ours.mlm_loss.item() - expected_mlm.item()) <= ATOL
    assert abs(out_ours.loss.item() - out_theirs.loss.item()) <= ATOL
    selected = inputs["labels"] != -100
    torch.testing.assert_close(
        out_ours.masked_lm_logits, out_theirs.prediction_logits[selected], atol=ATOL, rtol=0
    )
    out_ours.loss.backward()
    out_theirs.loss.backward()
    grads_theirs = dict(theirs.named_parameters())
    for key, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, grads_theirs[key].grad, atol=ATOL, rtol=1e-4, msg=key)


# ---------------------------------------------------------------------------------------------- prefixes and heads
def test_pretraining_checkpoint_into_classifier_initialises_the_new_head(tmp_path, caplog):
    pre = ours_mod.BertForPreTraining(make_config())
    randomise(pre)
    pre.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="bert_core.hf"):
        clf, report = ours_mod.BertForSequenceClassification.from_pretrained(
            tmp_path, num_labels=4, output_loading_info=True
        )
    assert report.missing_keys == ["classifier.bias", "classifier.weight"]
    assert {k for k in report.unexpected_keys} == {
        "cls.predictions.bias",
        "cls.predictions.transform.LayerNorm.bias",
        "cls.predictions.transform.LayerNorm.weight",
        "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.dense.weight",
        "cls.seq_relationship.bias",
        "cls.seq_relationship.weight",
    }
    assert "classifier.weight" in caplog.text
    assert clf.config.num_labels == 4 and clf.classifier.weight.shape == (4, 32)
    assert torch.equal(
        clf.bert.encoder.layer[1].output.dense.weight, pre.bert.encoder.layer[1].output.dense.weight
    )
    assert torch.all(clf.classifier.bias == 0)  # freshly initialised as transformers does
    assert abs(clf.classifier.weight.std().item() - 0.02) < 0.01
    assert all(torch.isfinite(p).all() for p in clf.parameters())
    # transformers agrees on what is new
    _, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path, num_labels=4, output_loading_info=True
    )
    assert set(info["missing_keys"]) == set(report.missing_keys)


def test_a_new_task_head_for_fine_tuning_is_no_warning_a_missing_encoder_tensor_still_is(tmp_path, caplog):
    pre = ours_mod.BertForPreTraining(make_config())
    pre.save_pretrained(tmp_path)
    with caplog.at_level(logging.INFO, logger="bert_core.hf"):
        ours_mod.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=2, new_head=True)
    assert [r.levelname for r in caplog.records if "classifier.weight" in r.getMessage()] == ["INFO"]
    state = load_file(tmp_path / "model.safetensors")
    del state["bert.encoder.layer.0.output.dense.bias"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bert_core.hf"):
        ours_mod.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=2, new_head=True)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "bert.encoder.layer.0.output.dense.bias" in warned[0]
    assert "classifier" not in warned[0]


def test_bare_encoder_checkpoint_into_head_and_head_checkpoint_into_encoder(tmp_path):
    enc = ours_mod.BertModel(make_config())
    randomise(enc)
    enc.save_pretrained(tmp_path / "enc")
    assert "embeddings.word_embeddings.weight" in read_state_dict(tmp_path / "enc")[0]  # no prefix
    qa, report = ours_mod.BertForQuestionAnswering.from_pretrained(
        tmp_path / "enc", num_labels=2, output_loading_info=True
    )
    assert report.missing_keys == ["qa_outputs.bias", "qa_outputs.weight"]
    assert report.unexpected_keys == [
        "bert.pooler.dense.bias",
        "bert.pooler.dense.weight",
    ]  # QA has no pooler
    assert torch.equal(qa.bert.embeddings.word_embeddings.weight, enc.embeddings.word_embeddings.weight)

    mlm = ours_mod.BertForMaskedLM(make_config()).eval()
    randomise(mlm)
    mlm.save_pretrained(tmp_path / "mlm")
    enc2, report = ours_mod.BertModel.from_pretrained(tmp_path / "mlm", output_loading_info=True)
    assert report.missing_keys == ["pooler.dense.bias", "pooler.dense.weight"]
    assert all(k.startswith("cls.") for k in report.unexpected_keys)
    inputs = make_inputs("BertModel")
    with torch.no_grad():
        torch.testing.assert_close(
            enc2(**inputs).last_hidden_state, mlm.bert(**inputs).last_hidden_state, atol=0, rtol=0
        )


def test_strict_load_refuses_a_new_head(tmp_path):
    ours_mod.BertForPreTraining(make_config()).save_pretrained(tmp_path)
    with pytest.raises(
        CheckpointError, match=r"strict load .* missing \['classifier.bias', 'classifier.weight'\]"
    ):
        ours_mod.BertForSequenceClassification.from_pretrained(tmp_path, strict=True)


def test_old_checkpoint_with_gamma_beta_names_and_buffers(tmp_path):
    name = "BertForPreTraining"
    config = make_config(name)
    theirs = transformers.BertForPreTraining(hf_config(config)).eval()
    randomise(theirs)
    state = {}
    for key, value in theirs.state_dict().items():
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        state[key] = value.clone()
    state["bert.embeddings.position_ids"] = torch.arange(config.max_position_embeddings)[None]
    assert "cls.predictions.decoder.weight" in state  # old files stored the tied copy too
    torch.save(state, tmp_path / "pytorch_model.bin")
    old_config = {k: v for k, v in config.to_hf_dict().items() if k not in ("model_type", "architectures")}
    (tmp_path / "config.json").write_text(json.dumps(old_config))
    ours, report = ours_mod.BertForPreTraining.from_pretrained(tmp_path, output_loading_info=True)
    assert (report.missing_keys, report.unexpected_keys) == ([], [])
    assert report.renamed_keys["bert.embeddings.LayerNorm.gamma"] == "bert.embeddings.LayerNorm.weight"
    assert_same_outputs(name, ours, theirs, make_inputs(name))


def test_sharded_checkpoint(tmp_path):
    theirs = transformers.BertForMaskedLM(hf_config(make_config())).eval()
    randomise(theirs)
    theirs.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ours, report = ours_mod.BertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert len(report.source) > 1 and report.missing_keys == []
    assert_same_outputs("BertForMaskedLM", ours, theirs, make_inputs("BertForMaskedLM"))


# ---------------------------------------------------------------------------------------------- safety and errors
def test_pickle_carrying_code_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "code-was-executed"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    ours_mod.BertModel(make_config()).save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").unlink()
    state = {"embeddings.word_embeddings.weight": torch.zeros(V, 32), "payload": Payload()}
    torch.save(state, tmp_path / "m" / "pytorch_model.bin")
    assert not marker.exists()
    with pytest.raises(UnsafeCheckpointError, match=r"refusing to load .*pytorch_model.bin.*open"):
        ours_mod.BertModel.from_pretrained(tmp_path / "m")
    assert not marker.exists()


def test_training_checkpoint_is_not_a_model_directory(tmp_path):
    ours_mod.BertModel(make_config()).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save({"model": {"w": torch.zeros(1)}, "step": 3}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="does not hold a flat state dict"):
        ours_mod.BertModel.from_pretrained(tmp_path)


def test_truncated_safetensors_is_a_clear_error(tmp_path):
    ours_mod.BertModel(make_config()).save_pretrained(tmp_path)
    file = tmp_path / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model.safetensors .* truncated or corrupt"):
        ours_mod.BertModel.from_pretrained(tmp_path)


def test_truncated_pickle_is_a_clear_error(tmp_path):
    ours_mod.BertModel(make_config()).save_pretrained(tmp_path)
    state, _ = read_state_dict(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(state, tmp_path / "pytorch_model.bin")
    data = (tmp_path / "pytorch_model.bin").read_bytes()
    (tmp_path / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin cannot be read .* truncated or corrupt"):
        ours_mod.BertModel.from_pretrained(tmp_path)


def test_different_model_size_names_the_tensor_and_both_shapes(tmp_path):
    ours_mod.BertModel(make_config()).save_pretrained(tmp_path)
    bigger = make_config(hidden_size=64).to_hf_dict()
    (tmp_path / "config.json").write_text(json.dumps(bigger))
    with pytest.raises(CheckpointError) as err:
        ours_mod.BertModel.from_pretrained(tmp_path)
    message = str(err.value)
    assert "embeddings.word_embeddings.weight: checkpoint [99, 32] vs model [99, 64]" in message
    assert "different model size" in message and "model.safetensors" in message


def test_other_label_count_needs_ignore_mismatched_sizes(tmp_path):
    ours_mod.BertForSequenceClassification(make_config(num_labels=3)).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"classifier.weight: checkpoint \[3, 32\] vs model \[5, 32\]"):
        ours_mod.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    model, report = ours_mod.BertForSequenceClassification.from_pretrained(
        tmp_path, num_labels=5, ignore_mismatched_sizes=True, output_loading_info=True
    )
    assert [k for k, _, _ in report.mismatched_keys] == ["classifier.bias", "classifier.weight"]
    assert model.classifier.weight.shape == (5, 32)
    assert torch.all(model.classifier.bias == 0) and abs(model.classifier.weight.std().item() - 0.02) < 0.01


def test_not_a_bert_directory(tmp_path):
    ours_mod.BertModel(make_config()).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model_type"] = "roberta"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config.json has model_type='roberta'.*BERT models only"):
        ours_mod.BertModel.from_pretrained(tmp_path)


def test_unmatched_names_are_not_silently_accepted(tmp_path):
    ours_mod.BertModel(make_config()).save_pretrained(tmp_path)
    from safetensors.torch import save_file

    save_file({"model/embeddings/word": torch.zeros(2)}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="not a transformers-format BERT checkpoint"):
        ours_mod.BertModel.from_pretrained(tmp_path)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ours_mod.BertModel.from_pretrained(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"has no config.json.*Files present: \(empty\)"):
        ours_mod.BertModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(make_config().to_hf_dict()))
    with pytest.raises(FileNotFoundError, match=r"has no weights file: expected one of model.safetensors"):
        ours_mod.BertModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config.json is not valid JSON \(line 1"):
        ours_mod.BertModel.from_pretrained(tmp_path)


def test_save_into_existing_directory_keeps_other_files_and_leaves_no_temporaries(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n")
    first = ours_mod.BertModel(make_config())
    first.save_pretrained(tmp_path)
    second = ours_mod.BertModel(make_config())
    randomise(second)
    second.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors", "vocab.txt"]
    loaded = ours_mod.BertModel.from_pretrained(tmp_path)
    assert torch.equal(loaded.pooler.dense.weight, second.pooler.dense.weight)
    assert not [p for p in os.listdir(tmp_path.parent) if ".tmp-" in p]  # no atomic-write leftovers beside it


# ---------------------------------------------------------------------------------------------- pipeline
def test_fill_mask_pipeline_runs_on_our_saved_model(tmp_path, shared_data: Path):
    vocab = shared_data / "checkpoints" / "bert-base-uncased" / "vocab.txt"
    if not vocab.is_file():
        pytest.skip(f"{vocab} is not present")
    # transformers 5: BertTokenizer(vocab_file=...) silently ignores the file (a 5-token vocab), and
    # BertTokenizerFast is the same class; `vocab=` reads it.
    tokenizer = transformers.BertTokenizer(vocab=str(vocab))
    assert len(tokenizer) == 30522
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    ours = ours_mod.BertForMaskedLM(config).eval()
    randomise(ours)
    ours.save_pretrained(tmp_path)
    fill = transformers.pipeline("fill-mask", model=str(tmp_path), tokenizer=tokenizer, device="cpu")
    text = "paris is the [MASK] of france."
    results = fill(text, top_k=5)
    enc = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        logits = ours(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).logits
    position = int((enc["input_ids"][0] == tokenizer.mask_token_id).nonzero())
    probs = logits[0, position].softmax(-1)
    top = probs.topk(5)
    assert [r["token"] for r in results] == top.indices.tolist()
    for r, p in zip(results, top.values.tolist()):
        assert abs(r["score"] - p) < 1e-5
