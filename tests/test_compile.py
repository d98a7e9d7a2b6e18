"""``torch.compile`` on CPU: the pretraining step and every fine-tuning head trace as one graph (no graph
break: on a GPU each break is a host synchronisation and a separate graph), and compiled losses equal the
eager ones in fp32.

The pretraining checks run by default (a few seconds of tracing on the tiny config); the per-head checks
and the Inductor compile are ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from bert_core.config import BertConfig
from bert_core.constants import IGNORE_INDEX
from bert_core.model import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bert_core.pretrain.objective import PretrainingObjective
from bert_core.pretrain_data.loader import mlm_positions

B, T, V, P, C = 4, 32, 99, 6, 3  # batch, seq len, vocab, max_predictions_per_seq, choices


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.set_num_threads(threads)


def tiny_config(**overrides) -> BertConfig:
    return BertConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **overrides,
    )


def encoder_inputs(padded: bool, seed: int = 0, shape: tuple[int, ...] = (B, T)) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    if padded:
        mask[..., 0, T // 2 :] = 0  # the first row (of each example) half padding
    return {
        "input_ids": ids * mask,
        "attention_mask": mask,
        "token_type_ids": (torch.arange(T) >= T // 3).long() * mask,
    }


def pretraining_batch(padded: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    """What the pretraining loader hands the step: Google's static-shape MLM targets."""
    batch = encoder_inputs(padded, seed)
    g = torch.Generator().manual_seed(seed + 1)
    labels = torch.full((B, T), IGNORE_INDEX)
    for i in range(B):
        n = int(batch["attention_mask"][i].sum())
        pos = torch.randperm(n - 1, generator=g)[: 1 + i] + 1  # 1..B predictions per row, P slots
        labels[i, pos] = batch["input_ids"][i, pos]
    batch |= {k: torch.from_numpy(v) for k, v in mlm_positions(labels.numpy(), P).items()}
    batch["next_sentence_label"] = torch.randint(0, 2, (B,), generator=g)
    return batch


def graphs_and_breaks(fn, *args) -> tuple[int, int, list[str]]:
    e = torch._dynamo.explain(fn)(*args)
    return e.graph_count, e.graph_break_count, [str(r.reason).splitlines()[0] for r in e.break_reasons]


def test_pretraining_step_is_one_graph():
    """The objective's whole training step (forward, loss, metric statistics) on the loader's batch form."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config())
    objective = PretrainingObjective.for_config(model.config)
    batch = pretraining_batch(padded=True)
    graphs, breaks, reasons = graphs_and_breaks(lambda b: objective.step(model, b).loss, batch)
    assert (graphs, breaks) == (1, 0), reasons


def test_labels_path_is_one_graph_once_data_dependent_sizes_are_allowed():
    """Transformers-style ``labels`` gather the N labelled positions (a ``nonzero``): one graph when
    Dynamo may keep N symbolic, as the Trainer lets it under compile; the loss has no branch on N (with
    none labelled it is 0, not NaN). Without that setting the gather itself breaks it."""
    import torch._dynamo

    model = BertForPreTraining(tiny_config())
    batch = pretraining_batch(padded=True)
    labels = torch.full((B, T), IGNORE_INDEX)
    real = batch.pop("masked_lm_weights") > 0
    rows = torch.arange(B)[:, None].expand(B, P)
    labels[rows[real], batch.pop("masked_lm_positions")[real]] = batch.pop("masked_lm_ids")[real]
    batch["labels"] = labels
    # config.patch, not monkeypatch: torch's config module hides a key that monkeypatch deletes on undo,
    # and every later compile in the process then fails to read it
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=False):
        _, breaks, _ = graphs_and_breaks(lambda b: model(**b).loss, batch)
    assert breaks > 0
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        graphs, breaks, reasons = graphs_and_breaks(lambda b: model(**b).loss, batch)
        assert (graphs, breaks) == (1, 0), reasons
        none = batch | {"labels": torch.full((B, T), IGNORE_INDEX)}
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(**none).mlm_loss, torch.tensor(0.0))


def test_compiled_pretraining_loss_and_grads_match_eager():
    """``fullgraph=True`` (an error on any break) through AOTAutograd, forward and backward, fp32; on a
    batch without padding, where eager mode takes the no-mask shortcut."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config())
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    batch = pretraining_batch(padded=False)
    eager_out = model(**batch)
    eager_out.loss.backward()
    eager_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    comp_out = compiled(**batch)
    comp_out.loss.backward()
    torch.testing.assert_close(comp_out.loss, eager_out.loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(comp_out.mlm_loss, eager_out.mlm_loss, rtol=1e-5, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, eager_grads[name], rtol=1e-5, atol=1e-5, msg=name)


def head_cases() -> dict[str, tuple[torch.nn.Module, dict[str, torch.Tensor]]]:
    """Every fine-tuning head with its labels, on a padded batch."""
    torch.manual_seed(0)
    enc = encoder_inputs(padded=True)
    g = torch.Generator().manual_seed(3)
    token_labels = torch.randint(0, 5, (B, T), generator=g).masked_fill(
        enc["attention_mask"] == 0, IGNORE_INDEX
    )
    return {
        "classification": (
            BertForSequenceClassification(tiny_config(num_labels=3)),
            enc | {"labels": torch.randint(0, 3, (B,), generator=g)},
        ),
        "regression": (
            BertForSequenceClassification(tiny_config(num_labels=1)),
            enc | {"labels": torch.rand(B)},
        ),
        "span_qa": (
            BertForQuestionAnswering(tiny_config(num_labels=2)),
            enc
            | {
                "start_positions": torch.tensor([1, 2, 3, T + 5]),
                "end_positions": torch.tensor([2, 4, 3, T + 5]),
            },
        ),
        "multiple_choice": (
            BertForMultipleChoice(tiny_config()),
            encoder_inputs(True, shape=(B, C, T)) | {"labels": torch.randint(0, C, (B,), generator=g)},
        ),
        "token_classification": (
            BertForTokenClassification(tiny_config(num_labels=5)),
            enc | {"labels": token_labels},
        ),
    }


@pytest.mark.slow
@pytest.mark.parametrize("head", list(head_cases()))
def test_finetuning_head_is_one_graph_and_matches_eager(head):
    model, batch = head_cases()[head]
    graphs, breaks, reasons = graphs_and_breaks(lambda b: model(**b).loss, batch)
    assert (graphs, breaks) == (1, 0), reasons
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(**batch).loss, model(**batch).loss, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_inductor_pretraining_step_matches_eager():
    """The default backend (Inductor, generated C++ on CPU), as ``pretrain.compile: true`` uses it."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config())
    batch = pretraining_batch(padded=True)
    eager = model(**batch).loss
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(**batch).loss, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_trainer_in_cuda_graph_mode_marks_every_step_and_trains_as_the_default_mode(monkeypatch):
    """``compile_mode="reduce-overhead"``: on a CPU there is no graph to capture, so the losses equal the
    default mode's; each micro-step is marked as a new CUDA-graph step (``pytest -m gpu`` runs it captured)."""
    from bert_core.training import TrainConfig, Trainer

    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))

    class Batches:
        def __iter__(self):
            while True:
                yield pretraining_batch(padded=True)

    losses = {}
    for mode in (None, "reduce-overhead"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = BertForPreTraining(tiny_config())
        config = TrainConfig(max_steps=3, lr=1e-3, compile=True, compile_mode=mode, log_every=1, device="cpu")
        fit = Trainer(model, PretrainingObjective.for_config(model.config), Batches(), config).fit()
        losses[mode] = [row["loss"] for row in fit.history if row["kind"] == "train"]
    assert len(marks) == 3
    assert losses["reduce-overhead"] == pytest.approx(losses[None], rel=1e-5)
