"""Model behaviour on transformers' "model tester" config: shapes of every head, losses, masking, tying."""

from __future__ import annotations

import pytest
import torch

from bert_core.config import BertConfig
from bert_core.constants import IGNORE_INDEX
from bert_core.model import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    padding_mask,
)

B, T, V, H, C = 13, 7, 99, 32, 4  # batch, seq len, vocab, hidden, choices (transformers' BertModelTester)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def config() -> BertConfig:
    return BertConfig(
        vocab_size=V,
        hidden_size=H,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=512,
        type_vocab_size=16,
        num_labels=3,
    )


@pytest.fixture
def batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    segments = torch.randint(0, 16, (B, T), generator=g)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments}


def mlm_labels(ids: torch.Tensor, positions: list[tuple[int, int]]) -> torch.Tensor:
    labels = torch.full_like(ids, IGNORE_INDEX)
    for i, j in positions:
        labels[i, j] = ids[i, j]
    return labels


def test_bert_model_shapes(config, batch):
    out = BertModel(config)(**batch)
    assert out.last_hidden_state.shape == (B, T, H)
    assert out.pooler_output.shape == (B, H)
    assert BertModel(config, add_pooling_layer=False)(**batch).pooler_output is None


def test_pretraining_without_labels_returns_full_logits(config, batch):
    out = BertForPreTraining(config)(**batch)
    assert out.prediction_logits.shape == (B, T, V)
    assert out.seq_relationship_logits.shape == (B, 2)
    assert out.loss is out.mlm_loss is out.nsp_loss is out.masked_lm_logits is None


def test_pretraining_with_labels_computes_mlm_only_at_masked_positions(config, batch):
    model = BertForPreTraining(config)
    positions = [(0, 1), (0, 5), (3, 2), (12, 6)]
    labels = mlm_labels(batch["input_ids"], positions)
    nsp = torch.randint(0, 2, (B,))
    out = model(**batch, labels=labels, next_sentence_label=nsp)
    assert out.prediction_logits is None
    assert out.masked_lm_logits.shape == (len(positions), V)
    assert out.masked_lm_labels.tolist() == [int(batch["input_ids"][i, j]) for i, j in positions]
    assert out.seq_relationship_logits.shape == (B, 2)
    assert torch.allclose(out.loss, out.mlm_loss + out.nsp_loss)
    # The sparse logits are the full logits at those positions, and the loss is their mean CE.
    model.eval()
    with torch.no_grad():
        sparse = model(**batch, labels=labels)
        full = model(**batch).prediction_logits
    expected = torch.stack([full[i, j] for i, j in positions])
    torch.testing.assert_close(sparse.masked_lm_logits, expected, atol=1e-6, rtol=1e-5)
    expected_loss = torch.nn.functional.cross_entropy(expected, sparse.masked_lm_labels)
    torch.testing.assert_close(sparse.mlm_loss, expected_loss)
    assert sparse.loss is sparse.mlm_loss and sparse.nsp_loss is None
    out.loss.backward()
    assert model.bert.embeddings.word_embeddings.weight.grad is not None


def test_pretraining_nsp_only_and_no_masked_positions(config, batch):
    model = BertForPreTraining(config)
    nsp = torch.randint(0, 2, (B,))
    out = model(**batch, next_sentence_label=nsp)
    assert out.loss is out.nsp_loss and out.mlm_loss is None
    none_masked = torch.full_like(batch["input_ids"], IGNORE_INDEX)
    out = model(**batch, labels=none_masked, next_sentence_label=nsp)
    assert out.mlm_loss.item() == 0.0 and torch.isfinite(out.loss)
    assert out.masked_lm_logits.shape == (0, V)
    out.loss.backward()  # still differentiable


def test_mlm_labels_must_match_input_shape(config, batch):
    with pytest.raises(ValueError, match="labels must have the shape of input_ids"):
        BertForPreTraining(config)(**batch, labels=torch.zeros(B, T + 1, dtype=torch.long))


def test_masked_lm_shapes(config, batch):
    model = BertForMaskedLM(config)
    assert not hasattr(model.bert, "pooler") or model.bert.pooler is None
    assert model(**batch).logits.shape == (B, T, V)
    out = model(**batch, labels=mlm_labels(batch["input_ids"], [(0, 0), (5, 3)]))
    assert out.logits is None and out.masked_lm_logits.shape == (2, V) and out.loss.ndim == 0


def test_sequence_classification_shapes_and_losses(config, batch):
    model = BertForSequenceClassification(config).eval()
    labels = torch.randint(0, 3, (B,))
    out = model(**batch, labels=labels)
    assert out.logits.shape == (B, 3) and out.loss.ndim == 0
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels))
    # multi-label: float targets -> BCE
    multi = model(**batch, labels=torch.randint(0, 2, (B, 3)).float())
    assert multi.loss.ndim == 0 and torch.isfinite(multi.loss)


def test_regression_when_one_label(config, batch):
    model = BertForSequenceClassification(config.replace(num_labels=1)).eval()
    targets = torch.rand(B) * 5
    out = model(**batch, labels=targets)
    assert out.logits.shape == (B, 1)
    torch.testing.assert_close(out.loss, torch.nn.functional.mse_loss(out.logits.squeeze(-1), targets))
    int_targets = model(**batch, labels=torch.randint(0, 5, (B,)))  # integer scores are cast, not an error
    assert torch.isfinite(int_targets.loss)


def test_token_classification_shapes_and_ignored_labels(config, batch):
    model = BertForTokenClassification(config).eval()
    labels = torch.randint(0, 3, (B, T))
    labels[:, 0] = IGNORE_INDEX
    out = model(**batch, labels=labels)
    assert out.logits.shape == (B, T, 3)
    keep = labels != IGNORE_INDEX
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits[keep], labels[keep]))


def test_question_answering_shapes_and_out_of_window_positions(config, batch):
    model = BertForQuestionAnswering(config.replace(num_labels=2)).eval()
    out = model(**batch, start_positions=torch.randint(0, T, (B,)), end_positions=torch.randint(0, T, (B,)))
    assert out.start_logits.shape == (B, T) and out.end_logits.shape == (B, T) and out.loss.ndim == 0
    far = torch.full((B,), 10 * T)
    far[0] = 1
    out = model(**batch, start_positions=far, end_positions=far)  # all but one ignored
    torch.testing.assert_close(
        out.loss,
        (
            torch.nn.functional.cross_entropy(out.start_logits[:1], far[:1])
            + torch.nn.functional.cross_entropy(out.end_logits[:1], far[:1])
        )
        / 2,
    )


def test_question_answering_requires_two_labels(config):
    with pytest.raises(ValueError, match="num_labels=2"):
        BertForQuestionAnswering(config)  # num_labels=3


def test_multiple_choice_shapes(config, batch):
    model = BertForMultipleChoice(config)
    expand = {k: v.unsqueeze(1).expand(-1, C, -1).contiguous() for k, v in batch.items()}
    out = model(**expand, labels=torch.randint(0, C, (B,)))
    assert out.logits.shape == (B, C) and out.loss.ndim == 0
    with pytest.raises(ValueError, match=r"\(batch, choices, seq_len\)"):
        model(**batch)


def test_padding_does_not_change_real_positions(config):
    model = BertModel(config).eval()
    ids = torch.randint(1, V, (1, 5))
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.tensor([[1] * 5 + [0] * 3])
    with torch.no_grad():
        short = model(ids).last_hidden_state
        long = model(padded, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(long[:, :5], short, atol=1e-5, rtol=1e-5)


def test_padding_mask_is_none_without_padding_and_finite_for_empty_rows():
    assert padding_mask(None, torch.float32) is None
    assert padding_mask(torch.ones(2, 3, dtype=torch.long), torch.float32) is None
    mask = padding_mask(torch.tensor([[1, 1, 0], [0, 0, 0]]), torch.float32)
    assert mask.shape == (2, 1, 1, 3) and torch.isfinite(mask).all()
    with pytest.raises(ValueError, match=r"attention_mask must be \(batch, seq_len\)"):
        padding_mask(torch.ones(2, 1, 3), torch.float32)


def test_off_the_cpu_the_padding_mask_is_built_without_reading_the_mask():
    """On a GPU, asking whether a mask has padding waits for the device; the mask is built instead. The meta
    device stands in: reading a value there raises."""
    mask = padding_mask(torch.ones(2, 3, dtype=torch.long, device="meta"), torch.float32)
    assert mask.shape == (2, 1, 1, 3) and mask.device.type == "meta"


def test_fully_padded_row_gives_finite_outputs(config, batch):
    batch = dict(batch)
    batch["attention_mask"] = batch["attention_mask"].clone()
    batch["attention_mask"][4] = 0
    out = BertForPreTraining(config).eval()(**batch)
    assert torch.isfinite(out.prediction_logits).all() and torch.isfinite(out.seq_relationship_logits).all()


def test_missing_segments_mean_segment_zero(config, batch):
    model = BertModel(config).eval()
    ids = batch["input_ids"]
    with torch.no_grad():
        a = model(ids).last_hidden_state
        b = model(ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state
    torch.testing.assert_close(a, b)


def test_too_long_input_is_a_clear_error(config):
    model = BertModel(config.replace(max_position_embeddings=8))
    with pytest.raises(ValueError, match="sequence length 9 exceeds max_position_embeddings=8"):
        model(torch.ones(1, 9, dtype=torch.long))


def test_mlm_decoder_is_tied_and_initialisation_follows_transformers(config):
    model = BertForPreTraining(config)
    emb = model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.weight is emb
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    assert torch.all(emb[config.pad_token_id] == 0)
    assert torch.all(model.cls.predictions.bias == 0)
    assert torch.all(model.bert.embeddings.LayerNorm.weight == 1)
    assert abs(model.bert.encoder.layer[0].intermediate.dense.weight.std().item() - 0.02) < 0.003
    # counted once
    distinct = {id(p) for p in model.parameters()}
    assert model.num_parameters() == sum(p.numel() for p in model.parameters()) and len(distinct) == len(
        list(model.parameters())
    )
    model.to(torch.float64)  # moving keeps the tie
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_dropout_only_in_training_mode(config, batch):
    model = BertForSequenceClassification(config)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, model(**batch).logits)
        model.train()
        assert not torch.equal(model(**batch).logits, model(**batch).logits)


def test_gradient_checkpointing_gives_the_same_gradients(config, batch):
    torch.manual_seed(0)
    plain = BertForPreTraining(config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    ckpt = BertForPreTraining(plain.config)
    ckpt.load_state_dict(plain.state_dict())
    ckpt.gradient_checkpointing_enable()
    labels = mlm_labels(batch["input_ids"], [(0, 1), (4, 4)])
    for model in (plain, ckpt):
        model(**batch, labels=labels, next_sentence_label=torch.zeros(B, dtype=torch.long)).loss.backward()
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


@pytest.mark.parametrize("preset", ["base", "large"])
def test_parameter_counts_equal_transformers(preset):
    transformers = pytest.importorskip("transformers")
    cfg = BertConfig.from_preset(preset, vocab_size=30522)
    with torch.device("meta"):
        ours = BertModel(cfg)
        theirs = transformers.BertModel(transformers.BertConfig(**cfg.to_hf_dict()))
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters())
    assert count == {"base": 109_482_240, "large": 335_141_888}[preset]  # the paper's 110M / 340M


@pytest.mark.parametrize(
    ("cls", "head"),
    [
        (BertForSequenceClassification, "classifier"),
        (BertForTokenClassification, "classifier"),
        (BertForMultipleChoice, "classifier"),
        (BertForPreTraining, "cls.seq_relationship"),
        (BertForPreTraining, "cls.predictions.transform.dense"),
    ],
)
def test_heads_are_initialised_like_transformers(cls, head):
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=V, hidden_size=256, num_hidden_layers=1, num_attention_heads=4, num_labels=64
    )
    layer = cls(config).get_submodule(head)
    assert torch.all(layer.bias == 0)  # nn.Linear's own default init would not give zeros
    assert abs(layer.weight.std().item() - config.initializer_range) < 0.005


def test_bf16_autocast_forward_and_backward(config, batch):
    model = BertForPreTraining(config)
    labels = mlm_labels(batch["input_ids"], [(0, 1), (4, 4)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**batch, labels=labels, next_sentence_label=torch.zeros(B, dtype=torch.long))
    assert out.masked_lm_logits.dtype == torch.bfloat16 and torch.isfinite(out.loss)
    out.loss.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.gpu
def test_cuda_matches_cpu(config, batch, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    model = BertForPreTraining(config).eval()
    labels = mlm_labels(batch["input_ids"], [(0, 1), (4, 4)])
    # float32 on both sides (TF32 matrix products differ from the CPU's by ~1e-4, over this tolerance)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    with torch.no_grad():
        cpu = model(**batch, labels=labels)
        model.cuda()
        gpu = model(**{k: v.cuda() for k, v in batch.items()}, labels=labels.cuda())
    torch.testing.assert_close(gpu.masked_lm_logits.cpu(), cpu.masked_lm_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        gpu.seq_relationship_logits.cpu(), cpu.seq_relationship_logits, atol=1e-4, rtol=1e-4
    )
