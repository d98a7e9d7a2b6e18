"""The params of an own task (``finetune.tasks.<name>.define``): :class:`OwnTask`, which
:mod:`bert_core.tasks.own` turns into a :class:`~bert_core.tasks.TaskSpec`, and the keys an own task's
entry must have (:func:`own_task_keys`)."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from bert_core.params import StrictModel

if TYPE_CHECKING:
    from bert_core.tasks import TaskSpec


class OwnTask(StrictModel):
    """An own task (``finetune.tasks.<name>.define``, :mod:`bert_core.tasks.own`): classification,
    regression or NER on the user's labelled files (``train_file``, ``dev_file``, ``test_file``, read by
    :mod:`bert_core.tasks.table`: CSV, TSV or JSON Lines; NER: CoNLL columns or JSON Lines).

    Attributes:
        kind: ``classification`` (one of ``labels`` per example), ``regression`` (a number),
            ``token_classification`` (an entity tag per word), ``span_qa`` (SQuAD's format, or ``.jsonl``
            in its Hub columns) or ``multiple_choice`` (the right one of a row's ``choices``; without them,
            SWAG's format).
        text: The field (CSV/TSV column, JSON key) of the text; NER's JSON Lines: of the word list
            (default ``tokens``).
        text_pair: The field of the second text, for a sentence-pair task (``None``: one text).
        label: The field of the label, score or tag list (default ``label``; NER ``tags``).
        labels: The classes in the model's output order (``f1``'s positive class is the second), NER's
            entity types, or the names of multiple choice's positions (``[A, B, C, D, E]``: the answer field
            holds one); ``None``: those of the train file, sorted (multiple choice: ``0`` ... ``N-1``).
        metric: The headline, which selects the learning rate and the registered model: ``accuracy``,
            ``f1`` (two classes), ``macro_f1``, ``matthews_corr``; ``spearman``, ``pearson``
            (regression); ``f1``, ``precision``, ``recall`` (NER). ``None``: the kind's first. The kind's
            other metrics are reported beside it.
        hub: A Hugging Face Hub dataset to read instead of files (``stanfordnlp/imdb``), whether or not
            ``BERT_DATA_ROOT`` is set; ``hub_config`` its config, ``hub_splits`` which of its splits are
            ``train``, ``dev`` (default ``train`` and ``validation``) and a labelled ``test`` (default none).
            A ``ClassLabel`` is read by its names, which are then the default ``labels``.
        no_answers: Span QA with unanswerable questions (SQuAD v2.0: a null answer, its threshold tuned on
            dev).
        choices: Multiple choice: the field holding each row's list of choices (JSON Lines, the Hub), or the
            fields holding one choice each (CSV columns); ``text`` is the question or context, ``text_pair``
            an optional start shared by every choice.
    """

    kind: Literal["classification", "regression", "token_classification", "span_qa", "multiple_choice"]
    text: str | None = Field(None, min_length=1)
    text_pair: str | None = Field(None, min_length=1)
    label: str | None = Field(None, min_length=1)
    labels: list[str] | None = Field(None, min_length=1)
    metric: (
        Literal[
            "accuracy",
            "f1",
            "macro_f1",
            "matthews_corr",
            "spearman",
            "pearson",
            "precision",
            "recall",
            "exact_match",
            "exact",
        ]
        | None
    ) = None
    hub: str | None = Field(None, min_length=1)
    hub_config: str | None = Field(None, min_length=1)
    hub_splits: dict[Literal["train", "dev", "test"], str] | None = None
    no_answers: bool = False
    choices: str | list[str] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> OwnTask:
        from bert_core.tasks import own_task_spec

        own_task_spec("own task", labels=self.labels or self._any_labels(), **self._fields())
        return self

    def _any_labels(self) -> list[str]:
        """Stand-in labels to check the rest before the train file gives the real ones."""
        if self.kind == "classification":
            return ["a", "b"] if self.metric == "f1" else ["a", "b", "c"]
        if self.kind == "multiple_choice" and isinstance(self.choices, str):
            return ["0", "1"]
        return ["X"] if self.kind == "token_classification" else []

    @property
    def labels_from_data(self) -> bool:
        """Whether the classes (entity types, choice positions) come from the train data: the params list
        none."""
        counted = self.kind == "multiple_choice" and isinstance(self.choices, str)  # the choices of a row
        return self.labels is None and (self.kind in ("classification", "token_classification") or counted)

    @property
    def main_metric(self) -> str:
        """The headline metric key (the evaluate stage checks a summary's against it)."""
        from bert_core.tasks.own import OWN_METRICS

        return self.metric or OWN_METRICS[self.kind][0]

    def _fields(self) -> dict[str, Any]:
        return self.model_dump(exclude={"labels"})

    def spec(
        self,
        name: str,
        train_file: os.PathLike[str] | None = None,
        test: bool = False,
        hub_revision: str | None = None,
    ) -> TaskSpec:
        """The task's :class:`TaskSpec`; the classes read from ``train_file`` (else the Hub's train split, at
        ``hub_revision``) when the params list none; ``test``: it has a labelled test file."""
        from bert_core.tasks import own_task_spec
        from bert_core.tasks.own import DEFAULT_FIELDS, DEFAULT_HUB_SPLITS
        from bert_core.tasks.table import hub_labels, labels_of

        labels = self.labels
        if self.labels_from_data:
            words, field = (  # multiple choice: the list field whose length counts the positions
                (str(self.choices), self.label or "label")
                if self.kind == "multiple_choice"
                else (self.text or DEFAULT_FIELDS[self.kind][0], self.label or DEFAULT_FIELDS[self.kind][1])
            )
            if train_file is not None:
                labels = labels_of(self.kind, Path(train_file), field, words or "")
            else:
                assert self.hub is not None, "the labels come from the train file or the Hub"
                split = {**DEFAULT_HUB_SPLITS, **(self.hub_splits or {})}["train"]
                labels = hub_labels(
                    self.kind, self.hub, self.hub_config, split, field, words or "", hub_revision
                )
        try:
            spec = own_task_spec(name, labels=labels or (), test=test, **self._fields())
            return dataclasses.replace(spec, hub_revision=hub_revision) if hub_revision else spec
        except ValueError as err:
            raise ValueError(f"finetune.tasks.{name}.define: {err}") from None


def own_task_keys(task: str, overrides: Any) -> None:
    """An own task names its own files, and nothing of the paper's tasks."""
    from bert_core.tasks import TASKS

    if task in TASKS:
        raise ValueError(
            f"tasks.{task}.define: {task} is one of the paper's tasks; give the own task another name"
        )
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", task):  # a path, a DVC stage, an MLflow model name
        raise ValueError(
            f"tasks.{task!r}: an own task's name is letters, digits, '_' and '-' (at most 64), starting with a "
            "letter or digit"
        )
    missing = [k for k in ("train_file", "dev_file") if getattr(overrides, k) is None]
    if missing and overrides.define.hub is None:
        raise ValueError(
            f"tasks.{task}: an own task reads its own files or a Hub dataset; set {' and '.join(missing)}, or "
            "define.hub"
        )
    if overrides.dev_split:
        raise ValueError(f"tasks.{task}.dev_split: an own task has no official dev file to split; remove it")
    if overrides.hub_revision and overrides.define.hub is None:
        why = "reads its own files, not a Hub dataset (define.hub); remove it"
        raise ValueError(f"tasks.{task}.hub_revision: {task} {why}")
