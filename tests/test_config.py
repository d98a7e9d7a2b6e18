"""BertConfig: presets, validation errors that name the field and the fix, transformers config.json I/O."""

from __future__ import annotations

import dataclasses

import pytest

from bert_core.config import ACTIVATIONS, PRESETS, BertConfig

VOCAB = 30522


@pytest.mark.parametrize(
    ("name", "layers", "hidden", "heads"),
    [
        ("tiny", 2, 128, 2),
        ("mini", 4, 256, 4),
        ("small", 4, 512, 8),
        ("medium", 8, 512, 8),
        ("base", 12, 768, 12),
        ("large", 24, 1024, 16),
    ],
)
def test_presets_have_the_published_sizes(name, layers, hidden, heads):
    cfg = BertConfig.from_preset(name, vocab_size=VOCAB)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (layers, hidden, heads)
    assert cfg.intermediate_size == 4 * hidden
    assert cfg.vocab_size == VOCAB
    assert (cfg.hidden_dropout_prob, cfg.attention_probs_dropout_prob) == (0.1, 0.1)
    assert (cfg.max_position_embeddings, cfg.type_vocab_size, cfg.layer_norm_eps) == (512, 2, 1e-12)


def test_preset_name_is_case_insensitive_and_overrides_apply():
    cfg = BertConfig.from_preset("BASE", vocab_size=100, hidden_dropout_prob=0.0, num_labels=3)
    assert cfg.hidden_dropout_prob == 0.0 and cfg.num_labels == 3 and cfg.hidden_size == 768


def test_overriding_width_keeps_the_4h_rule_unless_given():
    assert BertConfig.from_preset("tiny", vocab_size=99, hidden_size=64).intermediate_size == 256
    assert (
        BertConfig.from_preset("tiny", vocab_size=99, hidden_size=64, intermediate_size=100).intermediate_size
        == 100
    )


def test_intermediate_size_defaults_to_4h():
    assert BertConfig(vocab_size=10, hidden_size=32, num_attention_heads=4).intermediate_size == 128


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown BERT preset 'huge'") as err:
        BertConfig.from_preset("huge", vocab_size=VOCAB)
    for name in PRESETS:
        assert name in str(err.value)


def test_vocab_size_is_required():
    with pytest.raises(TypeError):
        BertConfig.from_preset("tiny")  # type: ignore[call-arg]


def test_unknown_override_names_the_field_and_the_valid_ones():
    with pytest.raises(ValueError, match="hidden_sizes") as err:
        BertConfig.from_preset("tiny", vocab_size=VOCAB, hidden_sizes=3)
    assert "hidden_size" in str(err.value) and "num_attention_heads" in str(err.value)


def test_hidden_size_not_divisible_by_heads():
    with pytest.raises(ValueError, match=r"hidden_size=100 is not divisible by num_attention_heads=12"):
        BertConfig(vocab_size=VOCAB, hidden_size=100, num_attention_heads=12)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("vocab_size", 0, r"vocab_size=0 is invalid: expected an integer >= 1"),
        ("hidden_size", "768", r"hidden_size='768' is invalid: expected an integer"),
        ("num_hidden_layers", 2.0, r"num_hidden_layers=2.0 is invalid"),
        ("num_attention_heads", True, r"num_attention_heads=True is invalid"),
        ("intermediate_size", -1, r"intermediate_size=-1 is invalid"),
        (
            "hidden_dropout_prob",
            1.0,
            r"hidden_dropout_prob=1.0 is invalid: expected a probability in \[0, 1\)",
        ),
        ("attention_probs_dropout_prob", -0.1, r"attention_probs_dropout_prob=-0.1 is invalid"),
        ("classifier_dropout", 2, r"classifier_dropout=2 is invalid"),
        ("layer_norm_eps", 0, r"layer_norm_eps=0 is invalid"),
        ("initializer_range", -0.02, r"initializer_range=-0.02 is invalid"),
        (
            "pad_token_id",
            30522,
            r"pad_token_id=30522 is invalid: expected an integer in \[0, vocab_size=30522\)",
        ),
        ("num_labels", 0, r"num_labels=0 is invalid"),
        ("max_position_embeddings", 0, r"max_position_embeddings=0 is invalid"),
        ("type_vocab_size", 0, r"type_vocab_size=0 is invalid"),
        ("problem_type", "ranking", r"problem_type='ranking' is invalid"),
    ],
)
def test_bad_values_name_the_field_the_value_and_what_is_valid(field, value, message):
    values = {"vocab_size": VOCAB, field: value}
    with pytest.raises(ValueError, match=message):
        BertConfig.from_preset("tiny", **values)


def test_unknown_activation_lists_the_supported_ones():
    with pytest.raises(ValueError, match="hidden_act='mish'") as err:
        BertConfig(vocab_size=VOCAB, hidden_act="mish")
    assert all(act in str(err.value) for act in ACTIVATIONS)


def test_id2label_must_cover_every_label():
    with pytest.raises(ValueError, match=r"id2label has ids \[0, 1\] but num_labels=3"):
        BertConfig(vocab_size=VOCAB, num_labels=3, id2label={0: "a", 1: "b"})
    cfg = BertConfig(vocab_size=VOCAB, num_labels=2, id2label={"1": "pos", "0": "neg"})
    assert cfg.id2label == {0: "neg", 1: "pos"}


def test_config_is_frozen_and_replace_validates():
    cfg = BertConfig.from_preset("tiny", vocab_size=VOCAB)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.hidden_size = 3  # type: ignore[misc]
    assert cfg.replace(num_labels=5).num_labels == 5
    with pytest.raises(ValueError, match="num_attention_heads"):
        cfg.replace(num_attention_heads=3)
    with pytest.raises(ValueError, match="unknown BertConfig field"):
        cfg.replace(heads=3)


def test_hf_dict_round_trip_and_transformers_reads_it():
    transformers = pytest.importorskip("transformers")
    cfg = BertConfig.from_preset(
        "mini", vocab_size=1234, num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"}, classifier_dropout=0.2
    )
    hf_dict = cfg.to_hf_dict(architectures=["BertForSequenceClassification"])
    assert hf_dict["model_type"] == "bert" and hf_dict["architectures"] == ["BertForSequenceClassification"]
    assert BertConfig.from_hf_dict(hf_dict) == cfg

    theirs = transformers.BertConfig(**hf_dict)
    for name in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "max_position_embeddings",
        "type_vocab_size",
        "layer_norm_eps",
        "initializer_range",
        "pad_token_id",
        "num_labels",
        "classifier_dropout",
    ):
        assert getattr(theirs, name) == getattr(cfg, name), name
    assert theirs.id2label == {0: "neg", 1: "neu", 2: "pos"}
    # ...and back from what transformers writes (its to_dict has many extra keys).
    assert BertConfig.from_hf_dict(theirs.to_dict()) == cfg


def test_default_labels_are_not_stored():
    cfg = BertConfig(vocab_size=99, num_labels=4)
    hf_dict = cfg.to_hf_dict()
    assert hf_dict["id2label"] == {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2", "3": "LABEL_3"}
    assert BertConfig.from_hf_dict(hf_dict) == cfg  # id2label stays None


def test_from_hf_dict_reads_old_configs_without_model_type():
    old = {
        "vocab_size": 30522,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "hidden_act": "gelu",
        "type_vocab_size": 2,
        "max_position_embeddings": 512,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "initializer_range": 0.02,
    }
    cfg = BertConfig.from_hf_dict(old)
    assert cfg == BertConfig.from_preset("base", vocab_size=30522)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"model_type": "roberta"}, r"model_type='roberta'.*BERT models only"),
        ({"position_embedding_type": "relative_key"}, r"position_embedding_type='relative_key'"),
        ({"is_decoder": True}, r"is_decoder=True"),
        ({"tie_word_embeddings": False}, r"tie_word_embeddings=False"),
        ({"hidden_size": 100}, r"cfg.json: BertConfig.hidden_size=100 is not divisible"),
    ],
)
def test_from_hf_dict_rejects_what_this_encoder_does_not_implement(patch, message):
    hf_dict = {**BertConfig(vocab_size=99).to_hf_dict(), **patch}
    with pytest.raises(ValueError, match=message):
        BertConfig.from_hf_dict(hf_dict, source="cfg.json")


def test_from_hf_dict_requires_sizes():
    with pytest.raises(ValueError, match="does not look like a BERT config"):
        BertConfig.from_hf_dict({"model_type": "bert"})
