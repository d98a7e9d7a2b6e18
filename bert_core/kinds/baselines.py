"""Trivial baselines for the classification, regression, NER and multiple-choice kinds.

A fine-tuned score means little without the score of something simple trained on the same rows: each
baseline here is fitted on exactly the training rows the fine-tuning used (the task's ``train_limit``
applied) and scored with the task's official metric on exactly the evaluated rows, so the report can put it
beside the model's score (:meth:`bert_core.kinds.base.TaskKind.baselines`; SQuAD's are in
:mod:`bert_core.kinds.squad_baselines`).

* ``majority`` (classification, SWAG): the most frequent training label for every row
  (``DummyClassifier``); ``mean`` (regression, STS-B): the mean training score. A constant prediction has
  no correlation with the gold scores, so its Pearson and Spearman are 0 here (the convention
  scikit-learn's ``matthews_corrcoef`` follows for a constant prediction), where the metric itself is
  undefined.
* ``tfidf_logreg`` (classification) / ``tfidf_ridge`` (regression): TF-IDF of word 1- and 2-grams with a
  logistic regression (ridge regression for scores). A sentence pair gets one vectorizer per side, stacked
  side by side, so a word means something different in the premise and in the hypothesis. The
  regularisation strength is chosen by 3-fold cross-validation on the training rows (never on the
  evaluated rows: a baseline tuned on them would be flattered); above :data:`CV_MAX_ROWS` training rows
  the library default is kept, which matters little with that much data and saves a dozen fits.
* ``word_overlap`` (sentence pairs: STS-B, MRPC, RTE, ...): how much the two sides share, as two numbers
  (the cosine of their TF-IDF vectors, and the share of their word types in common), into a linear or
  logistic regression. What a bag of words per side cannot see: the relation between the sides, which
  is most of what paraphrase and similarity tasks score (on STS-B's dev split, fitted on the full training
  split, it reaches Pearson 69 and Spearman 67, where ``tfidf_ridge`` stays near 0).
* ``majority`` (NER): the most frequent training tag (``O``) on every word, which finds no entity (F1 0).
* ``lexicon`` (NER): the CoNLL-2003 shared task's baseline (Tjong Kim Sang and De Meulder 2003, §4): the
  entity phrases of the training rows that were seen with a single type are tagged wherever they occur,
  left to right, the longest phrase first; phrases seen with two types are skipped.
* ``tfidf_ending`` (SWAG): a logistic regression on the TF-IDF of an ending alone (gold ending or not),
  the best-scored ending chosen. The context is left out on purpose: it is the same for the four endings,
  so in a linear model it cannot change their order.

Every fitted model has a fixed ``random_state`` and bounded cost (:data:`MAX_FEATURES` per vectorizer,
:data:`MAX_ITER` solver iterations), so the same rows always give the same numbers.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from bert_core.kinds.base import numeric_metrics

log = logging.getLogger(__name__)

#: Vocabulary cap of each TF-IDF vectorizer (the most frequent n-grams): bounds memory and fit time on
#: the large GLUE training sets (MNLI, QQP) without hurting the small ones, whose vocabularies are smaller.
MAX_FEATURES = 100_000
#: Solver iterations of the logistic regressions.
MAX_ITER = 1_000
RANDOM_STATE = 0
#: The regularisation grids searched by cross-validation (logistic ``C``, ridge ``alpha``).
C_GRID = (0.1, 1.0, 10.0, 100.0)
ALPHA_GRID = (0.1, 1.0, 10.0)
CV_FOLDS = 3
#: Cross-validate only between these training-row counts (fewer: folds too small to choose from).
CV_MIN_ROWS, CV_MAX_ROWS = 100, 50_000

Row = Mapping[str, Any]
Baselines = dict[str, dict[str, float]]


def _vectorizer() -> Any:
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(ngram_range=(1, 2), max_features=MAX_FEATURES)


def _text_pipeline(estimator: Any, pairs: bool) -> Any:
    """TF-IDF of ``text_a`` (and of ``text_b`` beside it, for pairs) into ``estimator``."""
    from sklearn.compose import ColumnTransformer
    from sklearn.pipeline import make_pipeline

    columns = [("text_a", _vectorizer(), "text_a")]
    if pairs:
        columns.append(("text_b", _vectorizer(), "text_b"))
    return make_pipeline(ColumnTransformer(columns), estimator)


def _word_overlap(estimator: Any) -> Any:
    """:class:`OverlapFeatures` of a pair's two sides into ``estimator``."""
    from sklearn.pipeline import make_pipeline

    return make_pipeline(OverlapFeatures(), estimator)


class OverlapFeatures:
    """A pair's ``text_a`` and ``text_b`` -> (the cosine of their TF-IDF vectors, the share of their word
    types in common), the TF-IDF (unigrams) fitted on both sides of the training pairs: a step of a
    scikit-learn pipeline (``fit``/``transform``; it has no parameters to search)."""

    def fit(self, x: Any, y: Any = None) -> OverlapFeatures:
        self.vectorizer_ = _vectorizer().set_params(ngram_range=(1, 1))
        self.vectorizer_.fit([*x["text_a"], *x["text_b"]])
        return self

    def transform(self, x: Any) -> np.ndarray:
        a, b = (self.vectorizer_.transform(x[side]) for side in ("text_a", "text_b"))
        cosine = np.asarray(a.multiply(b).sum(axis=1)).ravel()  # rows are L2-normalised
        words = self.vectorizer_.build_analyzer()
        shared = [(set(words(ta)), set(words(tb))) for ta, tb in zip(x["text_a"], x["text_b"], strict=True)]
        jaccard = np.array([len(wa & wb) / max(len(wa | wb), 1) for wa, wb in shared])
        return np.column_stack([cosine, jaccard])


def _tuned(pipeline: Any, y: Sequence[Any], *, regression: bool) -> Any:
    """``pipeline`` with its regularisation chosen by cross-validation on its training rows ``y`` (the
    module docstring), or as it is where the rows are too few or too many to search."""
    from sklearn.model_selection import GridSearchCV

    if not CV_MIN_ROWS <= len(y) <= CV_MAX_ROWS:
        return pipeline
    if regression:
        return GridSearchCV(pipeline, {"ridge__alpha": list(ALPHA_GRID)}, cv=CV_FOLDS)
    if min(Counter(y).values()) < CV_FOLDS:  # stratified folds need every class in each
        return pipeline
    return GridSearchCV(pipeline, {"logisticregression__C": list(C_GRID)}, cv=CV_FOLDS)


def _texts(rows: Sequence[Row]) -> Any:
    import pandas as pd

    return pd.DataFrame(
        {"text_a": [str(r["text_a"]) for r in rows], "text_b": [str(r.get("text_b") or "") for r in rows]}
    )


def _fitted(task: str, name: str, fit: Callable[[], Any]) -> Any:
    """``fit()``, or ``None`` with a warning when the training rows cannot fit it (e.g. a single class, or
    no word at all): a baseline must never cost the fine-tuning run that computes it."""
    try:
        return fit()
    except ValueError as err:
        log.warning("%s: baseline %s skipped: the training rows cannot fit it (%s)", task, name, err)
        return None


def sequence_baselines(
    spec: Any,
    train_rows: Sequence[Row],
    rows: Sequence[Row],
    *,
    label_of: Callable[[Row], Any],
    regression: bool,
) -> Baselines:
    """``majority``/``mean``, ``tfidf_logreg``/``tfidf_ridge`` and, for pairs, ``word_overlap`` of a
    GLUE-style task.

    Args:
        spec: The task (:func:`bert_core.metrics.spec_metrics` scores with its metrics).
        train_rows: The fine-tuning's training rows (``text_a``, ``text_b``, ``label``); unlabelled ones
            are left out.
        rows: The evaluated rows, all labelled (else no baseline is scored).
        label_of: A row's label as the metric reads it (class index, or float score), ``None`` if none.
        regression: Scores (STS-B) rather than classes.

    Returns:
        ``{name: metrics}`` on the 0-100 scale; empty when either side has no labelled rows.
    """
    from sklearn.dummy import DummyClassifier, DummyRegressor
    from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge

    from bert_core.metrics import spec_metrics

    task = spec.name
    train = [(r, label_of(r)) for r in train_rows]
    train = [(r, y) for r, y in train if y is not None]
    gold = [label_of(r) for r in rows]
    if not train or not rows or any(y is None for y in gold):
        return {}
    x_train, y_train, x_eval = _texts([r for r, _ in train]), [y for _, y in train], _texts(rows)
    pairs = any(r.get("text_b") not in (None, "") for r, _ in train)
    if regression:
        models = {
            "mean": DummyRegressor(strategy="mean"),
            "tfidf_ridge": _tuned(_text_pipeline(Ridge(), pairs), y_train, regression=True),
        }
    else:
        logreg = LogisticRegression(max_iter=MAX_ITER, random_state=RANDOM_STATE)
        models = {
            "majority": DummyClassifier(strategy="most_frequent"),
            "tfidf_logreg": _tuned(_text_pipeline(logreg, pairs), y_train, regression=False),
        }
    if pairs:
        overlap = (
            LinearRegression()
            if regression
            else LogisticRegression(max_iter=MAX_ITER, random_state=RANDOM_STATE)
        )
        models["word_overlap"] = _word_overlap(overlap)
    out: Baselines = {}
    for name, model in models.items():
        fitted = _fitted(task, name, lambda m=model: m.fit(x_train, y_train))
        if fitted is None:
            continue
        preds = fitted.predict(x_eval)
        scores = spec_metrics(spec, preds.tolist(), gold)
        if name == "mean":  # a constant: correlation 0, not undefined (the module docstring)
            scores = {k: 0.0 if np.isnan(v) else v for k, v in scores.items()}
        out[name] = numeric_metrics(scores)
    return out


# ---------------------------------------------------------------------- NER
def entity_lexicon(train_rows: Sequence[Row]) -> dict[tuple[str, ...], str]:
    """Entity phrase (its words) -> type, for the phrases of the training rows seen with a single type.

    Chunks are read as the metric reads them (seqeval's conlleval rules: IOB1 and IOB2 alike); a phrase
    tagged with two types anywhere in the training rows is ambiguous and left out.
    """
    from seqeval.metrics.sequence_labeling import get_entities

    types: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for row in train_rows:
        tags = row.get("tags")
        if tags is None:
            continue
        tokens = [str(t) for t in row["tokens"]]
        for etype, start, end in get_entities([str(t) for t in tags]):
            types[tuple(tokens[start : end + 1])].add(etype)
    return {phrase: next(iter(seen)) for phrase, seen in types.items() if len(seen) == 1}


def lexicon_tags(tokens: Sequence[str], lexicon: Mapping[tuple[str, ...], str]) -> list[str]:
    """IOB2 tags of ``tokens``: left to right, the longest lexicon phrase starting at each word is tagged
    with its type and skipped over; a word that starts no phrase is ``O``."""
    longest = max(map(len, lexicon), default=0)
    words = [str(t) for t in tokens]
    tags = ["O"] * len(words)
    i = 0
    while i < len(words):
        for length in range(min(longest, len(words) - i), 0, -1):
            etype = lexicon.get(tuple(words[i : i + length]))
            if etype is not None:
                tags[i : i + length] = [f"B-{etype}"] + [f"I-{etype}"] * (length - 1)
                i += length
                break
        else:
            i += 1
    return tags


def ner_baselines(train_rows: Sequence[Row], rows: Sequence[Row]) -> Baselines:
    """``majority`` (the most frequent training tag everywhere) and ``lexicon`` (CoNLL-2003's baseline),
    scored with conlleval's entity-level metric (:func:`bert_core.metrics.ner_metrics`).

    Args:
        train_rows: The fine-tuning's training rows (``tokens``, ``tags``).
        rows: The evaluated rows, all tagged (else no baseline is scored).

    Returns:
        ``{name: {precision, recall, f1, accuracy}}`` on the 0-100 scale.
    """
    from bert_core.metrics import ner_metrics

    tagged = [r for r in train_rows if r.get("tags") is not None]
    if not tagged or not rows or any(r.get("tags") is None for r in rows):
        return {}
    # most_common keeps the first seen of equal counts: deterministic for the same rows
    majority = Counter(str(t) for r in tagged for t in r["tags"]).most_common(1)[0][0]
    lexicon = entity_lexicon(tagged)
    gold = [[str(t) for t in r["tags"]] for r in rows]
    predicted = {
        "majority": [[majority] * len(r["tokens"]) for r in rows],
        "lexicon": [lexicon_tags(r["tokens"], lexicon) for r in rows],
    }
    return {name: numeric_metrics(ner_metrics(gold, tags)) for name, tags in predicted.items()}


# ---------------------------------------------------------------------- multiple choice
def multiple_choice_baselines(spec: Any, train_rows: Sequence[Row], rows: Sequence[Row]) -> Baselines:
    """``majority`` (the most frequent training label) and ``tfidf_ending`` of a SWAG-style task.

    Args:
        spec: The task (scored by :func:`bert_core.metrics.spec_metrics`: accuracy).
        train_rows: The fine-tuning's training rows (``endings``, ``label``).
        rows: The evaluated rows, all labelled (else no baseline is scored).

    Returns:
        ``{name: {"accuracy": ...}}`` on the 0-100 scale.
    """
    from sklearn.dummy import DummyClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    from bert_core.metrics import spec_metrics

    task = spec.name

    def label(row: Row) -> int | None:
        value = row.get("label")
        return None if value is None or value == "" or int(value) < 0 else int(value)

    train = [r for r in train_rows if label(r) is not None]
    if not train or not rows or any(label(r) is None for r in rows):
        return {}
    gold = [label(r) for r in rows]
    out: Baselines = {}
    y_train = [label(r) for r in train]
    majority = DummyClassifier(strategy="most_frequent").fit(np.zeros((len(train), 1)), y_train)
    out["majority"] = numeric_metrics(
        spec_metrics(spec, majority.predict(np.zeros((len(rows), 1))).tolist(), gold)
    )

    endings = [str(e) for r in train for e in r["endings"]]
    is_gold = [int(i == label(r)) for r in train for i in range(len(r["endings"]))]
    ranker = make_pipeline(_vectorizer(), LogisticRegression(max_iter=MAX_ITER, random_state=RANDOM_STATE))
    fitted = _fitted(task, "tfidf_ending", lambda: ranker.fit(endings, is_gold))
    if fitted is not None:
        probs = fitted.predict_proba([str(e) for r in rows for e in r["endings"]])[:, 1]  # one call: fast
        ends = np.cumsum([len(r["endings"]) for r in rows])
        preds = [int(np.argmax(p)) for p in np.split(probs, ends[:-1])]
        out["tfidf_ending"] = numeric_metrics(spec_metrics(spec, preds, gold))
    return out
