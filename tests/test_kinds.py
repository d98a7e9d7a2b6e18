"""The kind table: every registered task has a kind, and every kind implements the whole interface."""

from __future__ import annotations

import inspect

import pytest

from bert_core.kinds import KINDS, TaskKind, get_kind
from bert_core.kinds.base import TaskKind as BaseTaskKind
from bert_core.tasks import TASKS, get_task


def test_the_table_covers_every_task_in_the_registry():
    assert {spec.kind for spec in TASKS.values()} <= set(KINDS)
    for spec in TASKS.values():
        assert get_kind(spec) is KINDS[spec.kind] is get_kind(spec.kind)


def test_every_kind_is_used_and_keyed_by_its_own_name():
    assert set(KINDS) == {spec.kind for spec in TASKS.values()}
    assert all(kind.name == key for key, kind in KINDS.items())


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_kind_implements_the_base_interface(name):
    kind = KINDS[name]
    assert TaskKind is BaseTaskKind and isinstance(kind, TaskKind)
    assert not inspect.isabstract(type(kind)), f"{name}: {sorted(type(kind).__abstractmethods__)}"
    from torch import nn

    assert issubclass(kind.model_class, nn.Module)
    for method in ("encode", "score", "write_predictions", "frame_columns", "checks", "build_model"):
        base = inspect.signature(getattr(BaseTaskKind, method))
        assert list(inspect.signature(getattr(type(kind), method)).parameters) == list(base.parameters), (
            method
        )


def test_head_sizes_and_classes():
    from bert_core import model as m

    assert get_kind(get_task("stsb")).num_labels(get_task("stsb")) == 1
    assert get_kind(get_task("swag")).num_labels(get_task("swag")) == 4
    assert get_kind(get_task("squad_v2")).num_labels(get_task("squad_v2")) == 2
    assert get_kind(get_task("mnli")).num_labels(get_task("mnli")) == 3
    assert {name: kind.model_class for name, kind in KINDS.items()} == {
        "classification": m.BertForSequenceClassification,
        "regression": m.BertForSequenceClassification,
        "span_qa": m.BertForQuestionAnswering,
        "multiple_choice": m.BertForMultipleChoice,
        "token_classification": m.BertForTokenClassification,
    }


def test_unknown_kind_names_the_known_ones():
    with pytest.raises(KeyError, match="unknown task kind 'ranking'; known kinds: classification"):
        get_kind("ranking")
