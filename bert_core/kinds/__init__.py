"""Task kinds as components: one module per kind, one table keyed by kind.

A kind (:class:`~bert_core.kinds.base.TaskKind`) owns everything that depends on how the model reads and
answers a task: its head class, encoding, post-processing, scoring, prediction files and data checks.
``TaskSpec.kind`` (:mod:`bert_core.tasks`) names one; :func:`get_kind` returns it.

* ``classification`` (GLUE but STS-B), ``regression`` (STS-B): :mod:`~bert_core.kinds.sequence`
* ``span_qa`` (SQuAD v1.1, v2.0): :mod:`~bert_core.kinds.span_qa`
* ``multiple_choice`` (SWAG): :mod:`~bert_core.kinds.multiple_choice`
* ``token_classification`` (CoNLL-2003 NER): :mod:`~bert_core.kinds.token_classification`

Shared: the interface and helpers in :mod:`~bert_core.kinds.base`, the data checks that dispatch on the
kind in :mod:`~bert_core.kinds.checks`.

Adding a kind: a module with a :class:`TaskKind` subclass and one row in :data:`KINDS`.
"""

from __future__ import annotations

from bert_core.kinds.base import FeatureError, KindSettings, SplitScore, TaskKind, max_seq_length
from bert_core.kinds.multiple_choice import MultipleChoice
from bert_core.kinds.sequence import SequenceClassification, SequenceRegression
from bert_core.kinds.span_qa import SpanQA
from bert_core.kinds.token_classification import TokenClassification
from bert_core.tasks.registry import TaskSpec

#: ``TaskSpec.kind`` -> the component that implements it.
KINDS: dict[str, TaskKind] = {
    component.name: component
    for component in (
        SequenceClassification(),
        SequenceRegression(),
        SpanQA(),
        MultipleChoice(),
        TokenClassification(),
    )
}


def get_kind(spec: TaskSpec | str) -> TaskKind:
    """The :class:`TaskKind` of a task (its spec) or of a kind name.

    Raises:
        KeyError: an unknown kind, naming the known ones.
    """
    name = spec if isinstance(spec, str) else spec.kind
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown task kind {name!r}; known kinds: {', '.join(KINDS)}") from None


__all__ = ["KINDS", "FeatureError", "KindSettings", "SplitScore", "TaskKind", "get_kind", "max_seq_length"]
