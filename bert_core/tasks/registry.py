"""The downstream tasks of the BERT paper: what each one is, where its data lives and how it is scored.

One :class:`TaskSpec` per task. The label list is the single source of truth for label indices: every loader
maps its source's labels (TSV strings, Hub ``ClassLabel`` ints) onto it, the model's output index ``i`` means
``labels[i]``, and test predictions go to the GLUE leaderboard as ``submission_labels[i]``.

The label order follows the Hugging Face Hub copies (``nyu-mll/glue`` ``ClassLabel`` names, HF
``conll2003`` tags), so Hub and local files give the same indices.

The headline metric of a task is the first of its ``metric_keys`` (:attr:`TaskSpec.main_metric`), here and
nowhere else. :mod:`bert_core.metrics` computes the metric dicts; this package never imports it (the
dependency runs the other way: ``python -m bert_core.metrics glue`` reads gold files through it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

CONLL_TAGS: tuple[str, ...] = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
MNLI_LABELS: tuple[str, ...] = ("entailment", "neutral", "contradiction")


@dataclass(frozen=True)
class DevSplit:
    """A stand-in for a missing official train file: two disjoint halves of the official dev file, by article.

    The first ``train_articles`` articles of the dev file are trained on, the last ``eval_articles``
    evaluated on; the file must hold exactly ``train_articles + eval_articles`` articles (the official
    file does), so the halves never share an article (questions about one paragraph never straddle them).
    Data-limited runs only (``finetune.tasks.<task>.dev_split: true``): the scores are not official dev
    scores, and :mod:`bert_core.tasks.datasource` refuses the option when the official train file exists.

    Attributes:
        train_articles: Articles 1..N of the dev file, the training half.
        eval_articles: The last M articles, the evaluated half.
    """

    train_articles: int
    eval_articles: int

    @property
    def total(self) -> int:
        return self.train_articles + self.eval_articles


#: ``data_format`` of an own task's named-field files (:mod:`bert_core.tasks.table`); own QA and multiple
#: choice read SQuAD's and SWAG's formats.
OWN_FORMAT = "table"


@dataclass(frozen=True)
class TaskSpec:
    """Everything the pipeline needs to know about one downstream task.

    Attributes:
        name: Registry key (``"mnli"``).
        kind: How the model reads and answers it: a key of :data:`bert_core.kinds.KINDS`
            (``classification``, ``regression``, ``span_qa``, ``multiple_choice``, ``token_classification``).
        labels: Label names; index ``i`` is class ``i`` (empty for regression and span QA; the IOB2 tag set
            for token classification; ``("0", "1", "2", "3")`` for SWAG's endings).
        splits: Split names :func:`~bert_core.tasks.load_task_split` accepts.
        dev_splits: The labelled evaluation splits; the first selects models, the others (MNLI's mismatched
            half, CoNLL-2003's or an own task's labelled test set) are scored once, with the selected model.
        test_splits: Unlabelled test splits (predictions go to a leaderboard).
        metric_keys: Keys of the metric dict (:mod:`bert_core.metrics` computes it), headline first: the
            first key is :attr:`main_metric`.
        max_seq_length: Default maximum sequence length in WordPiece tokens.
        data_format: The official distribution format, a key of :data:`bert_core.tasks.loader.READERS`
            (``glue``, ``squad``, ``swag``, ``conll``).
        hub_path, hub_config: ``datasets.load_dataset(hub_path, hub_config)``.
        hub_splits: Our split name -> Hub split name (``"dev" -> "validation"``).
        hub_revision: The commit, tag or branch of the Hub dataset read (``None``: its newest); set from the
            params (``finetune.tasks.<task>.hub_revision``, an own task's ``define.hub_revision``).
        local_files: Our split name -> path under the data root, official format.
        submission_files: Test split -> GLUE leaderboard file name (``"MNLI-m.tsv"``).
        submission_labels: How a predicted index is written in the submission (the official label strings;
            empty for STS-B, which writes the float score).
        dev_split: How to split the official dev file into train and evaluation halves when the train file
            is unobtainable (``None``: the task has no such option).
        single_sentence: One text per example (CoLA, SST-2, an own task without ``text_pair``): no
            ``text_b``.
        score_range: The range of a regression task's scores, checked on its rows (STS-B: 0-5).
        no_answers: Span QA with unanswerable questions (SQuAD v2.0): a null answer, its threshold tuned on
            dev, and the v2.0 scorer.
        fields: An own task's file fields (:mod:`bert_core.tasks.own`): ``text_a``, ``text_b``, ``label``
            -> the column or JSON key that holds it; ``choices`` -> the field of a multiple-choice row's
            list of choices, or the fields of its choices.
        own: A task declared in the params (:mod:`bert_core.tasks.own`), not one of the paper's.
    """

    name: str
    kind: str
    labels: tuple[str, ...]
    splits: tuple[str, ...]
    dev_splits: tuple[str, ...]
    test_splits: tuple[str, ...]
    metric_keys: tuple[str, ...]
    max_seq_length: int
    data_format: str
    hub_path: str
    hub_config: str | None
    hub_splits: dict[str, str]
    local_files: dict[str, str]
    submission_files: dict[str, str] = field(default_factory=dict)
    submission_labels: tuple[str, ...] = ()
    dev_split: DevSplit | None = None
    single_sentence: bool = False
    score_range: tuple[float, float] | None = None
    no_answers: bool = False
    fields: dict[str, str | tuple[str, ...]] = field(default_factory=dict)
    own: bool = False
    hub_revision: str | None = None

    def __post_init__(self) -> None:
        missing = set(self.splits) - set(self.local_files)
        assert not missing and set(self.dev_splits) <= set(self.splits), (self.name, missing)

    @property
    def main_metric(self) -> str:
        """The headline metric key (BERT paper, Table 1): fine-tuning selects models on it, MLflow runs
        log it as ``dev.main`` and reports headline it. F1 for QQP, MRPC, SQuAD and CoNLL-2003, Spearman
        for STS-B, Matthews correlation for CoLA, accuracy elsewhere."""
        return self.metric_keys[0]

    @property
    def main_dev_split(self) -> str:
        return self.dev_splits[0]

    def label_index(self, label: str) -> int:
        """Index of ``label`` in :attr:`labels` (raises ``KeyError`` naming the valid labels)."""
        try:
            return self.labels.index(label)
        except ValueError:
            raise KeyError(
                f"{self.name}: unknown label {label!r}; valid labels: {list(self.labels)}"
            ) from None


_GLUE = "nyu-mll/glue"
_GLUE_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


def _glue(
    name: str,
    folder: str,
    labels: tuple[str, ...],
    submission_labels: tuple[str, ...],
    metric_keys: tuple[str, ...],
    submission: str,
    *,
    kind: str = "classification",
) -> TaskSpec:
    return TaskSpec(
        single_sentence=name in ("cola", "sst2"),
        score_range=(0.0, 5.0) if name == "stsb" else None,
        name=name,
        kind=kind,
        labels=labels,
        splits=("train", "dev", "test"),
        dev_splits=("dev",),
        test_splits=("test",),
        metric_keys=metric_keys,
        max_seq_length=128,
        data_format="glue",
        hub_path=_GLUE,
        hub_config=name,
        hub_splits=dict(_GLUE_SPLITS),
        local_files={s: f"glue/{folder}/{s}.tsv" for s in ("train", "dev", "test")},
        submission_files={"test": submission},
        submission_labels=submission_labels,
    )


_BIN = ("0", "1")
_NLI2 = ("entailment", "not_entailment")

# name, folder under glue/, labels, their spelling in the TSVs and submissions, metric keys (headline first).
# The paper's scores are in bert_core/evaluate/references.py.
_GLUE_TABLE: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    ("cola", "CoLA", ("unacceptable", "acceptable"), _BIN, ("matthews_corr",)),
    ("sst2", "SST-2", ("negative", "positive"), _BIN, ("accuracy",)),
    ("mrpc", "MRPC", ("not_equivalent", "equivalent"), _BIN, ("f1", "accuracy")),
    ("stsb", "STS-B", (), (), ("spearman", "pearson")),
    ("qqp", "QQP", ("not_duplicate", "duplicate"), _BIN, ("f1", "accuracy")),
    ("qnli", "QNLI", _NLI2, _NLI2, ("accuracy",)),
    ("rte", "RTE", _NLI2, _NLI2, ("accuracy",)),
    ("wnli", "WNLI", ("not_entailment", "entailment"), _BIN, ("accuracy",)),
)

TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        *(
            _glue(
                name,
                folder,
                labels,
                spelled,
                keys,
                f"{folder}.tsv",
                kind="regression" if name == "stsb" else "classification",
            )
            for name, folder, labels, spelled, keys in _GLUE_TABLE
        ),
        TaskSpec(
            name="mnli",
            kind="classification",
            labels=MNLI_LABELS,
            splits=(
                "train",
                "dev_matched",
                "dev_mismatched",
                "test_matched",
                "test_mismatched",
                "diagnostic",
            ),
            dev_splits=("dev_matched", "dev_mismatched"),
            test_splits=("test_matched", "test_mismatched", "diagnostic"),
            metric_keys=("accuracy",),
            max_seq_length=128,
            data_format="glue",
            hub_path=_GLUE,
            hub_config="mnli",
            hub_splits={
                "train": "train",
                "dev_matched": "validation_matched",
                "dev_mismatched": "validation_mismatched",
                "test_matched": "test_matched",
                "test_mismatched": "test_mismatched",
                "diagnostic": "ax:test",  # another config of nyu-mll/glue
            },
            local_files={
                "train": "glue/MNLI/train.tsv",
                "dev_matched": "glue/MNLI/dev_matched.tsv",
                "dev_mismatched": "glue/MNLI/dev_mismatched.tsv",
                "test_matched": "glue/MNLI/test_matched.tsv",
                "test_mismatched": "glue/MNLI/test_mismatched.tsv",
                "diagnostic": "glue/diagnostic/diagnostic.tsv",
            },
            # The diagnostic set (AX) is predicted by the MNLI model and submitted with the GLUE test files.
            submission_files={
                "test_matched": "MNLI-m.tsv",
                "test_mismatched": "MNLI-mm.tsv",
                "diagnostic": "AX.tsv",
            },
            submission_labels=MNLI_LABELS,
        ),
        TaskSpec(
            name="squad_v1",
            kind="span_qa",
            labels=(),
            splits=("train", "dev"),
            dev_splits=("dev",),
            test_splits=(),
            metric_keys=("f1", "exact_match"),
            max_seq_length=384,
            data_format="squad",
            hub_path="rajpurkar/squad",
            hub_config=None,
            hub_splits={"train": "train", "dev": "validation"},
            local_files={"train": "squad/train-v1.1.json", "dev": "squad/dev-v1.1.json"},
            dev_split=DevSplit(train_articles=24, eval_articles=24),  # dev-v1.1.json: 48 articles
        ),
        TaskSpec(
            name="squad_v2",
            kind="span_qa",
            labels=(),
            splits=("train", "dev"),
            dev_splits=("dev",),
            test_splits=(),
            metric_keys=("f1", "exact"),
            max_seq_length=384,
            data_format="squad",
            hub_path="rajpurkar/squad_v2",
            hub_config=None,
            hub_splits={"train": "train", "dev": "validation"},
            local_files={"train": "squad/train-v2.0.json", "dev": "squad/dev-v2.0.json"},
            no_answers=True,
            dev_split=DevSplit(train_articles=17, eval_articles=18),  # dev-v2.0.json: 35 articles
        ),
        TaskSpec(
            name="swag",
            kind="multiple_choice",
            labels=("0", "1", "2", "3"),
            splits=("train", "dev", "test"),
            dev_splits=("dev",),
            test_splits=("test",),
            metric_keys=("accuracy",),
            max_seq_length=128,
            data_format="swag",
            hub_path="allenai/swag",
            hub_config="regular",
            hub_splits={"train": "train", "dev": "validation", "test": "test"},
            local_files={"train": "swag/train.csv", "dev": "swag/val.csv", "test": "swag/test.csv"},
        ),
        TaskSpec(
            name="conll2003",
            kind="token_classification",
            labels=CONLL_TAGS,
            splits=("train", "dev", "test"),
            dev_splits=("dev", "test"),  # the paper reports both (Table 7); the test set selects nothing
            test_splits=(),
            metric_keys=("f1", "precision", "recall"),
            max_seq_length=128,
            data_format="conll",
            hub_path="lhoestq/conll2003",  # a parquet copy; the canonical script-based one no longer loads
            hub_config=None,
            hub_splits={"train": "train", "dev": "validation", "test": "test"},
            local_files={
                "train": "conll2003/eng.train",
                "dev": "conll2003/eng.testa",
                "test": "conll2003/eng.testb",
            },
        ),
    )
}

#: The GLUE tasks, in the order of the GLUE leaderboard.
GLUE_TASKS: tuple[str, ...] = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")

#: CoNLL-2003 in IOB2 (``iob2/{train,valid,test}.txt``), read when the original ``eng.*`` files are absent.
CONLL_IOB2_FILES = {
    "train": "conll2003/iob2/train.txt",
    "dev": "conll2003/iob2/valid.txt",
    "test": "conll2003/iob2/test.txt",
}


def get_task(name: str) -> TaskSpec:
    """The :class:`TaskSpec` called ``name`` (case-insensitive; ``sst-2``/``sts-b`` spellings accepted).

    Raises:
        KeyError: naming the valid task names.
    """
    key = name.strip().lower().replace("-", "")
    key = {"squad": "squad_v1", "squadv1": "squad_v1", "squadv2": "squad_v2", "conll": "conll2003"}.get(
        key, key
    )
    if key not in TASKS:
        raise KeyError(f"unknown task {name!r}; valid tasks: {', '.join(TASKS)}")
    return TASKS[key]
