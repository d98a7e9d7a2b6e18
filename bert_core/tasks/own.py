"""Own tasks: the user's labelled data as a task of one of the paper's kinds, declared in the params
(``finetune.tasks.<name>.define``, :class:`bert_core.finetune.params.OwnTask`), without code.

* ``classification`` -- one of ``labels`` per text (or text pair); scored with accuracy, F1 (two classes,
  the second being positive), macro F1 and Matthews correlation.
* ``regression`` -- a number per text (or pair); Spearman and Pearson correlation.
* ``token_classification`` -- an entity tag per word (NER); ``labels`` are the entity types, the tags ``O``
  and ``B-``/``I-`` of each (IOB2; IOB1 files are converted); entity-level F1, precision and recall
  (seqeval's conlleval rules, as CoNLL-2003).
* ``span_qa`` -- extractive question answering on files in SQuAD's JSON format, or ``.jsonl`` files of one
  question a line in the Hub's columns (or a Hub dataset with SQuAD's columns); ``no_answers`` allows
  unanswerable questions (SQuAD v2.0: a null answer whose threshold is tuned on dev); the official scorer's
  F1 and exact match (``exact`` with ``no_answers``, as SQuAD v2.0).
* ``multiple_choice`` -- the right one of a row's choices: with ``choices``, from CSV, TSV or JSON Lines (the
  question or context in ``text``, an optional shared start of every choice in ``text_pair``, the choices in
  one list field or one column each, the answer in ``label``: a choice's index, or its name in ``labels``,
  ``A``-``E`` say); without, SWAG's CSV format (four endings); accuracy.

The rows are the task's ``train_file``, ``dev_file`` and, optionally, a labelled ``test_file`` (scored once,
with the model the dev set selected), or the splits of a Hugging Face Hub dataset (``hub``; a ``ClassLabel``
is read by its names), whether or not ``BERT_DATA_ROOT`` is set (:mod:`bert_core.tasks.table` reads both);
the headline ``metric`` (default: the kind's first) selects the learning rate and the registered model, and
the kind's other metrics are reported beside it. A fine-tuned model's ``task.json`` holds the definition
(:func:`own_task_json`), so a registered version is served without the params that declared it.
"""

from __future__ import annotations

from bert_core.tasks.registry import OWN_FORMAT, TASKS, TaskSpec, get_task

#: The kinds an own task can be, and the metric keys each is scored with (the default headline first).
OWN_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("accuracy", "f1", "macro_f1", "matthews_corr"),
    "regression": ("spearman", "pearson"),
    "token_classification": ("f1", "precision", "recall"),
    "span_qa": ("f1", "exact_match"),
    "multiple_choice": ("accuracy",),
}
#: A multiple-choice task's classes: the index of the right one of SWAG's four endings.
MULTIPLE_CHOICE_LABELS = ("0", "1", "2", "3")
#: An own Hub task's split names: ours -> the dataset's.
DEFAULT_HUB_SPLITS = {"train": "train", "dev": "validation"}
#: A field's name when the definition gives none: ``(text, label)`` per kind.
DEFAULT_FIELDS: dict[str, tuple[str | None, str]] = {
    "classification": (None, "label"),
    "regression": (None, "label"),
    "token_classification": ("tokens", "tags"),
}
#: The paper's formats own QA and multiple choice are read in (their fields are the format's).
FORMATS = {"span_qa": "squad", "multiple_choice": "swag"}


def tag_set(types: tuple[str, ...]) -> tuple[str, ...]:
    """The IOB2 tags of entity ``types``: ``O``, then ``B-`` and ``I-`` of each (CoNLL-2003's order)."""
    return ("O", *(f"{prefix}-{t}" for t in types for prefix in ("B", "I")))


def own_task_spec(
    name: str,
    *,
    kind: str,
    text: str | None = None,
    text_pair: str | None = None,
    label: str | None = None,
    labels: tuple[str, ...] | list[str] = (),
    metric: str | None = None,
    hub: str | None = None,
    hub_config: str | None = None,
    hub_splits: dict[str, str] | None = None,
    no_answers: bool = False,
    test: bool = False,
    choices: str | list[str] | tuple[str, ...] | None = None,
) -> TaskSpec:
    """The :class:`TaskSpec` of own task ``name`` (see the module docstring).

    Args:
        kind: A key of :data:`OWN_METRICS`.
        text, text_pair, label: The fields (CSV/TSV column, JSON key) of the text, the second text of a
            pair and the label; NER's JSON Lines: of the word list and the tag list (default ``tokens``,
            ``tags``; CoNLL files have columns instead).
        labels: The classes (classification) or entity types (NER), in the model's order.
        metric: The headline (default: the kind's first of :data:`OWN_METRICS`).
        hub, hub_config, hub_splits: A Hub dataset's id, config and split names (``train``, ``dev`` -> its
            split; default ``train`` and ``validation``), when the rows come from the Hub.
        no_answers: Span QA with unanswerable questions (SQuAD v2.0).
        test: The task has a labelled test split (``test_file``, or a Hub split named ``test`` in
            ``hub_splits``), scored once with the selected model.
        choices: Multiple choice: the field holding a row's list of choices, or the fields holding one choice
            each (``None``: SWAG's format). ``labels`` then name the choices' positions (default ``0`` ...
            ``N-1`` for N fields; a list field needs them, :class:`~bert_core.finetune.own_task.OwnTask`
            counts a train row's).

    Raises:
        ValueError: a name of the paper's tasks, an unknown kind or metric, labels with a regression, fewer
            than two classes, no entity type, a text pair with NER, ``f1`` with more than two classes.
    """
    if name in TASKS:
        raise ValueError(f"{name!r} is one of the paper's tasks; give the own task another name")
    if kind not in OWN_METRICS:
        raise ValueError(f"kind {kind!r}: an own task is one of {list(OWN_METRICS)}")
    labels = tuple(str(lab) for lab in labels)
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must be distinct, got {list(labels)}")
    if choices is not None and kind != "multiple_choice":
        raise ValueError(f"choices are multiple choice's; a {kind} task has none")
    if labels and (kind in ("regression", "span_qa") or (kind == "multiple_choice" and choices is None)):
        swag = " (SWAG's format numbers its four endings; with choices, labels name their positions)"
        raise ValueError(
            f"a {kind} task has no labels; remove them{swag if kind == 'multiple_choice' else ''}"
        )
    if kind == "multiple_choice":
        labels, choices = _choice_positions(labels, choices, text)
        label = label or ("label" if choices is not None else None)
    if no_answers and kind != "span_qa":
        raise ValueError(f"no_answers is span QA's (unanswerable questions); a {kind} task has none")
    if kind == "classification" and len(labels) < 2:
        raise ValueError(f"a classification task needs two or more labels, got {list(labels)}")
    if kind == "token_classification":
        if not labels or any(not t or t == "O" or t[:2] in ("B-", "I-") for t in labels):
            raise ValueError(
                f"labels of a token_classification task are its entity types (PER, ...), got {list(labels)}"
            )
        if text_pair:
            raise ValueError("a token_classification task reads one word sequence; remove text_pair")
        labels = tag_set(labels)
    default_text, default_label = DEFAULT_FIELDS.get(kind, (None, None))
    text, label = text or default_text, label or default_label
    if text is None and kind in ("classification", "regression"):
        raise ValueError(f"a {kind} task needs the field of its text: set text")
    keys = [k for k in OWN_METRICS[kind] if k != "f1" or kind != "classification" or len(labels) == 2]
    if no_answers:  # the v2.0 scorer's own name, as squad_v2's
        keys = ["exact" if k == "exact_match" else k for k in keys]
    metric = metric or keys[0]
    if metric not in keys:
        raise ValueError(f"metric {metric!r}: a {kind} task with these labels is scored with one of {keys}")
    test = test or (bool(hub) and "test" in (hub_splits or {}))
    evaluated = ("dev", "test") if test else ("dev",)
    return TaskSpec(
        name=name,
        kind=kind,
        labels=labels,
        splits=("train", *evaluated),
        dev_splits=evaluated,
        test_splits=(),
        metric_keys=(metric, *(k for k in keys if k != metric)),
        max_seq_length=384 if kind == "span_qa" else 128,  # the paper's windows for QA
        data_format=OWN_FORMAT if choices is not None else FORMATS.get(kind, OWN_FORMAT),
        hub_path=hub or "",
        hub_config=hub_config,
        hub_splits={**DEFAULT_HUB_SPLITS, **(hub_splits or {})},
        local_files=dict.fromkeys(("train", *evaluated), ""),
        submission_labels=labels,  # prediction files spell the labels as the task's files do
        single_sentence=not text_pair,
        no_answers=no_answers,
        fields={
            k: v
            for k, v in (("text_a", text), ("text_b", text_pair), ("label", label), ("choices", choices))
            if v
        },
        own=True,
    )


def _choice_positions(
    labels: tuple[str, ...], choices: str | list[str] | tuple[str, ...] | None, text: str | None
) -> tuple[tuple[str, ...], str | tuple[str, ...] | None]:
    """A multiple-choice task's labels (its choices' positions) and its choice field or fields."""
    if choices is None:  # SWAG's format
        return MULTIPLE_CHOICE_LABELS, None
    if not text:
        raise ValueError(
            "a multiple_choice task with choices needs the field of its question or context: set text"
        )
    if not isinstance(choices, str):
        choices = tuple(choices)
        if len(choices) < 2 or len(set(choices)) != len(choices):
            raise ValueError(f"choices: two or more distinct fields, one per choice, got {list(choices)}")
        labels = labels or tuple(str(i) for i in range(len(choices)))
        if len(labels) != len(choices):
            raise ValueError(f"labels name the positions of the {len(choices)} choices, got {list(labels)}")
    elif len(labels) < 2:
        raise ValueError(
            f"labels name the positions of the choices in {choices!r} (two or more), got {list(labels)}"
        )
    return labels, choices


def entity_types(spec: TaskSpec) -> tuple[str, ...]:
    """The entity types of an NER task's tags (``B-PER`` ... -> ``PER``), in order."""
    return tuple(t[2:] for t in spec.labels if t.startswith("B-"))


def own_task_json(spec: TaskSpec) -> dict[str, object]:
    """The definition :func:`task_from_json` rebuilds ``spec`` from (a fine-tuned model's ``task.json``)."""
    ner, choices = spec.kind == "token_classification", spec.fields.get("choices")
    swag = spec.kind == "multiple_choice" and choices is None
    return {
        "kind": spec.kind,
        "text": spec.fields.get("text_a"),
        "text_pair": spec.fields.get("text_b"),
        "label": spec.fields.get("label"),
        "labels": [] if swag else list(entity_types(spec) if ner else spec.labels),
        **({"choices": choices if isinstance(choices, str) else list(choices)} if choices else {}),
        "metric": spec.main_metric,
        **(
            {"hub": spec.hub_path, "hub_config": spec.hub_config, "hub_splits": spec.hub_splits}
            if spec.hub_path
            else {}
        ),
        **({"no_answers": True} if spec.no_answers else {}),
        **({"test": True} if "test" in spec.dev_splits else {}),
    }


def task_from_json(task: dict[str, object]) -> TaskSpec:
    """The :class:`TaskSpec` of a fine-tuned model's task JSON: its own task's definition when it has one,
    else the paper's task of that name."""
    own = task.get("own_task")
    if isinstance(own, dict):
        return own_task_spec(str(task["task"]), **own)
    return get_task(str(task["task"]))
