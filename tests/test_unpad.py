"""Unpadded encoding (``BertConfig.unpad``, ``bert_core.unpad``) against the padded path: same outputs at
real tokens, same losses and gradients (fp32, 1e-5), for every head; under torch.compile too."""

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
)
from bert_core.unpad import Packing, set_unpad

B, T, V = 6, 11, 99
TOL = 1e-5


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_config(**kw) -> BertConfig:
    """transformers' tester sizes; no dropout, so train mode is deterministic and comparable."""
    values = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, **kw}
    return BertConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        type_vocab_size=2,
        num_labels=3,
        **values,
    )


def make_batch(mask_rows: dict[int, slice] | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded rows of different lengths (row 0 full), plus any extra masked slices."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    for i, n in enumerate([T, 3, 7, 1, 10, 5]):
        mask[i, n:] = 0
    for i, cols in (mask_rows or {}).items():
        mask[i, cols] = 0
    ids = ids.masked_fill(mask == 0, 0)
    types = (torch.arange(T) >= T // 2).long().expand(B, T).clone() * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def pair(cls, config: BertConfig, **kw):
    """The same weights twice: padded and unpadded."""
    torch.manual_seed(0)
    padded = cls(config, **kw)
    unpadded = cls(config.replace(unpad=True), **kw)
    unpadded.load_state_dict(padded.state_dict())
    return padded, unpadded


def probe_loss(hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """A scalar with real gradients: a fixed random projection of the hidden states at real tokens (the
    sum of squares of a LayerNorm output is nearly constant, so its gradients are rounding noise)."""
    w = torch.randn(hidden.shape[-1], generator=torch.Generator().manual_seed(1))
    return (hidden[keep] @ w).sin().mean()


def assert_grads_close(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        if pa.grad is None:
            assert pb.grad is None or not pb.grad.any(), name
            continue
        torch.testing.assert_close(pb.grad, pa.grad, atol=TOL, rtol=TOL, msg=name)


def test_packing_gather_scatter_roundtrip():
    batch = make_batch()
    packing = Packing.from_mask(batch["attention_mask"])
    assert packing.indices.numel() == int(batch["attention_mask"].sum())
    x = torch.randn(B, T, 5)
    back = packing.scatter(packing.gather(x))
    keep = batch["attention_mask"].bool()
    assert torch.equal(back[keep], x[keep])
    assert not back[~keep].any()
    assert torch.equal(packing.positions, torch.arange(B * T)[keep.flatten()] % T)


def test_packing_rejects_a_3d_mask():
    with pytest.raises(ValueError, match=r"attention_mask must be \(batch, seq_len\)"):
        Packing.from_mask(torch.ones(2, 3, 4))


def test_unpad_config_is_validated_and_not_written_to_config_json():
    with pytest.raises(ValueError, match=r"BertConfig\.unpad"):
        make_config(unpad="yes")
    cfg = make_config(unpad=True)
    assert "unpad" not in cfg.to_hf_dict()


@pytest.mark.parametrize("extra", [None, {2: slice(0, 2)}, {4: slice(3, 6)}], ids=["right", "left", "holes"])
def test_encoder_equal_at_real_tokens_and_zero_at_padding(extra):
    padded, unpadded = pair(BertModel, make_config())
    batch = make_batch(extra)
    a, b = padded(**batch), unpadded(**batch)
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(b.last_hidden_state[keep], a.last_hidden_state[keep], atol=TOL, rtol=TOL)
    assert not b.last_hidden_state[~keep].any()
    if keep[:, 0].all():
        torch.testing.assert_close(b.pooler_output, a.pooler_output, atol=TOL, rtol=TOL)
    probe_loss(a.last_hidden_state, keep).backward()
    probe_loss(b.last_hidden_state, keep).backward()
    assert_grads_close(padded, unpadded)


def test_no_padding_and_no_mask():
    padded, unpadded = pair(BertModel, make_config())
    ids = make_batch()["input_ids"].clamp(min=1)
    full = torch.ones_like(ids)
    torch.testing.assert_close(
        unpadded(ids, full).last_hidden_state, padded(ids, full).last_hidden_state, atol=TOL, rtol=TOL
    )
    torch.testing.assert_close(
        unpadded(ids).last_hidden_state, padded(ids).last_hidden_state, atol=TOL, rtol=TOL
    )


def _mlm_labels(batch):
    labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
    for i, j in [(0, 1), (0, 9), (1, 2), (2, 4), (4, 8), (5, 3)]:
        labels[i, j] = batch["input_ids"][i, j]
    return labels


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train-no-dropout"])
def test_pretraining_logits_loss_and_gradients(train):
    config = make_config()
    padded, unpadded = pair(BertForPreTraining, config)
    padded.train(train), unpadded.train(train)
    batch = make_batch()
    batch["labels"] = _mlm_labels(batch)
    batch["next_sentence_label"] = torch.tensor([0, 1, 0, 1, 1, 0])
    a, b = padded(**batch), unpadded(**batch)
    for field in ("loss", "mlm_loss", "nsp_loss", "masked_lm_logits", "seq_relationship_logits"):
        torch.testing.assert_close(getattr(b, field), getattr(a, field), atol=TOL, rtol=TOL, msg=field)
    a.loss.backward(), b.loss.backward()
    assert_grads_close(padded, unpadded)


def test_masked_lm_full_logits_equal_at_real_tokens():
    padded, unpadded = pair(BertForMaskedLM, make_config())
    padded.eval(), unpadded.eval()
    batch = make_batch()
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(
        unpadded(**batch).logits[keep], padded(**batch).logits[keep], atol=TOL, rtol=TOL
    )


@pytest.mark.parametrize(
    ("cls", "labels"),
    [
        (BertForSequenceClassification, torch.tensor([0, 2, 1, 1, 0, 2])),
        (BertForTokenClassification, None),
    ],
    ids=["sequence", "token"],
)
def test_finetuning_heads_loss_and_gradients(cls, labels):
    padded, unpadded = pair(cls, make_config())
    padded.eval(), unpadded.eval()
    batch = make_batch()
    if labels is None:  # token tags, -100 at padding as the fine-tuning collate writes them
        labels = torch.randint(0, 3, (B, T)).masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
    a, b = padded(**batch, labels=labels), unpadded(**batch, labels=labels)
    keep = batch["attention_mask"].bool()
    logits_a, logits_b = (a.logits[keep], b.logits[keep]) if a.logits.dim() == 3 else (a.logits, b.logits)
    torch.testing.assert_close(logits_b, logits_a, atol=TOL, rtol=TOL)
    torch.testing.assert_close(b.loss, a.loss, atol=TOL, rtol=TOL)
    a.loss.backward(), b.loss.backward()
    assert_grads_close(padded, unpadded)


def test_multiple_choice_equal():
    padded, unpadded = pair(BertForMultipleChoice, make_config())
    padded.eval(), unpadded.eval()
    batch = {k: v.view(2, 3, T) for k, v in make_batch().items()}
    labels = torch.tensor([0, 2])
    a, b = padded(**batch, labels=labels), unpadded(**batch, labels=labels)
    torch.testing.assert_close(b.logits, a.logits, atol=TOL, rtol=TOL)
    torch.testing.assert_close(b.loss, a.loss, atol=TOL, rtol=TOL)


def test_question_answering_keeps_the_padded_path():
    """Its loss reads the logits at padding positions, so unpad=True must not change it at all."""
    config = make_config().replace(num_labels=2)
    padded, unpadded = pair(BertForQuestionAnswering, config)
    padded.eval(), unpadded.eval()
    assert unpadded.bert.unpad is False
    batch = make_batch()
    pos = torch.tensor([0, 1, 2, 0, 5, 1])
    a, b = (
        padded(**batch, start_positions=pos, end_positions=pos),
        unpadded(**batch, start_positions=pos, end_positions=pos),
    )
    assert torch.equal(a.start_logits, b.start_logits) and torch.equal(a.loss, b.loss)


def test_gradient_checkpointing_with_unpad():
    config = make_config()
    padded, unpadded = pair(BertModel, config)
    unpadded.gradient_checkpointing_enable()
    padded.train(), unpadded.train()
    batch = make_batch()
    keep = batch["attention_mask"].bool()
    probe_loss(padded(**batch).last_hidden_state, keep).backward()
    probe_loss(unpadded(**batch).last_hidden_state, keep).backward()
    assert_grads_close(padded, unpadded)


@pytest.mark.slow
def test_compiled_unpadded_encoder_is_one_graph_and_matches_eager():
    """fullgraph=True fails on any graph break; N (real tokens) is a symbolic size, so two batches with
    different padding run in the same compiled graph."""
    import torch._dynamo

    torch._dynamo.reset()
    padded, unpadded = pair(BertModel, make_config())
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(unpadded, fullgraph=True)
        for extra in (None, {0: slice(5, T)}):
            batch = make_batch(extra)
            keep = batch["attention_mask"].bool()
            out = compiled(**batch).last_hidden_state
            ref = padded(**batch).last_hidden_state
            torch.testing.assert_close(out[keep], ref[keep], atol=TOL, rtol=TOL)
            probe_loss(out, keep).backward()
            probe_loss(ref, keep).backward()
            assert_grads_close(padded, unpadded)
            padded.zero_grad(), unpadded.zero_grad()


def test_set_unpad_switches_a_loaded_model_and_leaves_qa_padded(tmp_path):
    model = BertForSequenceClassification(make_config())
    model.save_pretrained(tmp_path / "m")
    loaded = BertForSequenceClassification.from_pretrained(tmp_path / "m")
    assert loaded.bert.unpad is False  # config.json never carries it
    set_unpad(loaded)
    assert loaded.bert.unpad and loaded.config.unpad
    qa = set_unpad(BertForQuestionAnswering(make_config().replace(num_labels=2)))
    assert qa.bert.unpad is False and qa.config.unpad is False


def test_pretrain_and_finetune_params_expose_unpad():
    from bert_core.finetune.params import TaskSettings
    from bert_core.pretrain.params import ModelParams

    assert ModelParams(unpad=True).config(vocab_size=V, max_position_embeddings=128).unpad
    assert not ModelParams().config(vocab_size=V, max_position_embeddings=128).unpad
    with pytest.raises(ValueError, match=r"pretrain\.model\.unpad"):
        ModelParams(overrides={"unpad": True})
    assert TaskSettings(unpad=True).unpad and not TaskSettings().unpad
