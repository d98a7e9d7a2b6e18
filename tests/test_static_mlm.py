"""The static-shape MLM path (Google's masked_lm_positions / ids / weights) against the ``labels`` path:
same loss and gradients (fp32, 1e-5), same pretraining metrics, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bert_core.config import BertConfig
from bert_core.constants import IGNORE_INDEX
from bert_core.model import BertForMaskedLM, BertForPreTraining
from bert_core.pretrain.objective import PretrainingObjective
from bert_core.pretrain_data.loader import mlm_positions

B, T, V, P = 6, 24, 99, 5  # batch, seq len, vocab, max_predictions_per_seq


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_config() -> BertConfig:
    return BertConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def labels_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Padded rows, 0..P masked positions per row (row 3 has none), NSP labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    lengths = torch.tensor([T, T - 3, 10, 8, T, 6])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    ids = ids * mask
    labels = torch.full_like(ids, IGNORE_INDEX)
    for i, n in enumerate([P, 3, P, 0, 1, 2]):
        pos = torch.randperm(int(lengths[i]) - 1, generator=g)[:n] + 1
        labels[i, pos] = ids[i, pos]
        ids[i, pos] = 4  # [MASK]
    types = (torch.arange(T)[None, :] >= lengths[:, None] // 2).long() * mask
    nsp = torch.randint(0, 2, (B,), generator=g)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": types,
        "labels": labels,
        "next_sentence_label": nsp,
    }


def to_positions(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {k: v for k, v in batch.items() if k != "labels"}
    out |= {k: torch.from_numpy(v) for k, v in mlm_positions(batch["labels"].numpy(), P).items()}
    return out


def loss_and_grads(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("cls", [BertForPreTraining, BertForMaskedLM])
def test_positions_path_matches_labels_path(cls):
    torch.manual_seed(0)
    model = cls(tiny_config())
    ref = labels_batch()
    if cls is BertForMaskedLM:
        ref.pop("next_sentence_label")
    out_l, grads_l = loss_and_grads(model, ref)
    out_p, grads_p = loss_and_grads(model, to_positions(ref))
    torch.testing.assert_close(out_p.loss, out_l.loss, rtol=1e-5, atol=1e-5)
    assert grads_p.keys() == grads_l.keys() and len(grads_l) > 10
    for name in grads_l:
        torch.testing.assert_close(grads_p[name], grads_l[name], rtol=1e-5, atol=1e-5, msg=name)
    # (B, P, V) logits at the positions; the real slots are the labels path's (N, V) rows in order.
    real = out_p.masked_lm_labels != IGNORE_INDEX
    assert out_p.masked_lm_logits.shape == (B, P, V)
    torch.testing.assert_close(out_p.masked_lm_logits[real], out_l.masked_lm_logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(out_p.masked_lm_labels[real], out_l.masked_lm_labels)


def test_no_prediction_gives_zero_loss_and_finite_grads():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config())
    batch = to_positions(labels_batch())
    batch["masked_lm_weights"] = torch.zeros(B, P)
    batch.pop("next_sentence_label")
    out, grads = loss_and_grads(model, batch)
    assert out.mlm_loss.item() == 0.0 and (out.masked_lm_labels == IGNORE_INDEX).all()
    assert all(torch.isfinite(g).all() for g in grads.values())


def test_pretraining_metrics_are_identical_for_both_forms():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config())
    objective = PretrainingObjective.for_config(model.config)
    ref = labels_batch(seed=1)
    with torch.no_grad():
        s_l, s_p = objective.eval_step(model, ref), objective.eval_step(model, to_positions(ref))
    assert s_l.keys() == s_p.keys()
    for key in ("mlm_correct", "mlm_count", "nsp_correct", "nsp_count", "mlm_label_hist", "nsp_positive"):
        assert torch.equal(s_p[key], s_l[key]), key
    for key in ("mlm_loss_sum", "nsp_loss_sum"):
        torch.testing.assert_close(s_p[key], s_l[key], rtol=1e-5, atol=1e-5)
    m_l, m_p = objective.summarize(s_l), objective.summarize(s_p)
    assert m_p["mlm_acc"] == m_l["mlm_acc"] and m_p["baseline_mlm_acc"] == m_l["baseline_mlm_acc"]
    assert objective.flops(to_positions(ref)) == objective.flops(ref)


def test_bad_position_arguments_are_refused():
    model = BertForPreTraining(tiny_config())
    ref = labels_batch()
    both = to_positions(ref) | {"labels": ref["labels"]}
    with pytest.raises(ValueError, match="not both"):
        model(**both)
    with pytest.raises(ValueError, match="need masked_lm_positions"):
        model(ref["input_ids"], masked_lm_ids=torch.zeros(B, P, dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"masked_lm_weights must have the shape of masked_lm_positions \(6, 5\)"
    ):
        model(
            ref["input_ids"],
            masked_lm_positions=torch.zeros(B, P, dtype=torch.long),
            masked_lm_ids=torch.zeros(B, P, dtype=torch.long),
            masked_lm_weights=torch.ones(B, 4),
        )
    logits_only = model(ref["input_ids"], masked_lm_positions=torch.zeros(B, P, dtype=torch.long))
    assert logits_only.mlm_loss is None and logits_only.masked_lm_logits.shape == (B, P, V)


def test_mlm_positions_layout():
    labels = np.full((2, 7), IGNORE_INDEX)
    labels[0, [5, 2]] = [11, 12]
    out = mlm_positions(labels, 3)
    assert out["masked_lm_positions"].tolist() == [[2, 5, 0], [0, 0, 0]]
    assert out["masked_lm_ids"].tolist() == [[12, 11, 0], [0, 0, 0]]
    assert out["masked_lm_weights"].tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
