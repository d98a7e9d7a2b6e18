"""Data checks (Great Expectations, via :mod:`bert_core.checks`) on a sample of a built output.

The sample goes through the loader's own batch construction (:func:`.loader.build_batch`), so the checks
see exactly what the model will see, dynamic masks included (epoch 0). One row per instance:

* layout: ``[CLS]`` at 0, ``[SEP]`` after A and at the end, segment ids 0 up to the first ``[SEP]`` and 1
  after, attention on the real tokens only; A and B non-empty; length <= ``max_seq_length``;
* ids: every input id and label < ``vocab_size``; no special position or special token ever predicted;
  at most ``max_predictions_per_seq`` predictions;
* statistics, each centred on what the generator guarantees for *this* output, never on a bare
  parameter a correct build need not hit:

  - masked share of the eligible tokens +- 0.5 point, measured on instances with at least 64 eligible
    tokens, centred on the mean of ``num_to_predict(n) / n`` over those instances (the count is
    ``round(n * masked_lm_prob)``: 10 of 70 is 14.3%, so the centre is not ``masked_lm_prob`` itself);
  - the [MASK]/random/unchanged split +- 1 point each, centred on the output's ``mask_split`` (80/10/10
    unless the params chose another);
  - the IsNext share +- 1 point around ``1 - expected_not_next_share`` from ``index.json``: with
    ``nsp_balance`` the NotNext share is ``max(random_next_prob, forced share)`` (forced: single-sentence
    chunks, which cannot be IsNext; the builder balances the whole output, :mod:`.build`), without it
    Google's rule gives ``forced + random_next_prob * (1 - forced)``. When that differs from
    ``random_next_prob`` an advisory check at ``1 - random_next_prob`` flags it in the report;
  - NSP must stay learnable: a critical check fails an output where either label is under
    :data:`MIN_NSP_LABEL_SHARE` of the instances (unless ``random_next_prob`` itself asks for that), as
    a classifier that always answers the majority label would then be right most of the time.

Small outputs: the shares of an output are themselves random (each prediction's 80/10/10 draw, each
pair's NSP label), so a few thousand predictions cannot be held to +-1 point. Each statistical check is
therefore critical at ``+-max(tolerance, 3 standard errors of the share in this sample)``, and, when the
noise band is the wider one, repeated at the exact tolerance as an advisory (reported, not fatal). On the
real corpus's samples (50,000 instances) three standard errors are below the tolerances, so the critical
bounds are exactly the ones above; a gross error (e.g. no NotNext at all) fails at any size.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from bert_core.constants import IGNORE_INDEX
from bert_core.pretrain_data.loader import build_batch, masking_spec
from bert_core.pretrain_data.masking import eligible_positions, num_to_predict
from bert_core.pretrain_data.storage import InstanceStore

LONG_ENOUGH = 64  # eligible tokens for an instance to count in the masked-share check
MIN_NSP_LABEL_SHARE = 0.2  # below it for IsNext or NotNext, NSP mostly teaches the label prior
CHUNK = 2048


def _features(store: InstanceStore, idx: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """Per-instance features of the instances ``idx`` (what the frame's columns hold)."""
    spec, cont = masking_spec(store.data_dir, store.index)
    sp = store.index["special_token_ids"]
    specials = np.array(sorted(sp.values()))
    b = build_batch(store, idx, seed=seed, epoch=0, spec=spec, continuation=cont)
    ids, labels, types, att = b["input_ids"], b["labels"], b["token_type_ids"], b["attention_mask"]
    n, t = ids.shape
    chosen = labels != IGNORE_INDEX
    original = np.where(chosen, labels, ids)
    length = att.sum(1)
    rows = np.arange(n)
    # segment A = tokens before the first [SEP] of the *unmasked* ids; recomputed here, not read from storage
    sep = original == sp["[SEP]"]
    first_sep = np.where(sep.any(1), sep.argmax(1), 0)
    len_a = first_sep - 1
    pos = np.arange(t)[None, :]
    expected_types = (pos > first_sep[:, None]) & (pos < length[:, None])
    layout_ok = (
        (original[:, 0] == sp["[CLS]"])
        & (first_sep >= 2)
        & (original[rows, np.maximum(length - 1, 0)] == sp["[SEP]"])
        & (first_sep < length - 2)
        & (types == expected_types).all(1)
        & (att == (pos < length[:, None])).all(1)
    )
    layout_ok &= np.where(pos >= length[:, None], original == sp["[PAD]"], True).all(1)
    structural = (
        (pos == 0) | (pos == first_sep[:, None]) | (pos == length[:, None] - 1) | (pos >= length[:, None])
    )
    special_masked = (chosen & (structural | np.isin(labels, specials))).sum(1)
    inside = (pos > 0) & (pos < length[:, None] - 1) & (pos != first_sep[:, None])
    literal = [sp[k] for k in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")]  # [UNK] in text is a real token
    stray = (inside & np.isin(original, literal)).sum(1)
    eligible = eligible_positions(original, length, len_a, tuple(specials.tolist())).sum(1)
    n_pred = chosen.sum(1)
    n_mask = (chosen & (ids == sp["[MASK]"])).sum(1)
    n_keep = (chosen & (ids == labels)).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(eligible >= LONG_ENOUGH, n_pred / eligible, np.nan)
        budget = num_to_predict(eligible, spec.masked_lm_prob, spec.max_predictions_per_seq)
        expected_share = np.where(eligible >= LONG_ENOUGH, budget / eligible, np.nan)
        frac = lambda k: np.where(n_pred > 0, k / n_pred, np.nan)  # noqa: E731
        return {
            "length": length,
            "len_a": len_a,
            "len_b": length - len_a - 3,
            "max_id": np.maximum(ids.max(1), labels.max(1)),
            "min_id": np.where(chosen, labels, ids).min(1),
            "layout_ok": layout_ok,
            "special_masked": special_masked,
            "stray_special_tokens": stray,
            "eligible": eligible,
            "predictions": n_pred,
            "masked_share_long": share,
            "expected_share_long": expected_share,
            "mask_frac": frac(n_mask),
            "keep_frac": frac(n_keep),
            "random_frac": frac(n_pred - n_mask - n_keep),
            "n_mask": n_mask,
            "n_keep": n_keep,
            "is_next": 1 - b["next_sentence_label"],
        }


def _share_checks(column: str, target: float, tol: float, sd: float) -> list:
    """Critical at ``target +- max(tol, 3 sd)``; plus an advisory at ``target +- tol`` when noise is wider."""
    import great_expectations as gx

    def between(width: float):
        return gx.expectations.ExpectColumnMeanToBeBetween(
            column=column, min_value=target - width, max_value=target + width
        )

    from bert_core.checks import Check

    band = max(tol, 3 * sd)
    return [Check(between(band))] + ([Check(between(tol), critical=False)] if band > tol else [])


def check_output(data_dir: str | Path, *, sample_size: int, seed: int, report_dir: str | Path | None = None):
    """Validate a sample of one output directory.

    Args:
        data_dir: e.g. ``<out>/seq128/train``.
        sample_size: Instances drawn (uniformly, without replacement; all when fewer).
        seed: Seeds the sample (and the epoch-0 dynamic masks).
        report_dir: Data Docs HTML goes here.

    Returns:
        ``(report, sample_stats)``: the :class:`bert_core.checks.CheckReport` and the sample's statistics.
    """
    import great_expectations as gx
    import pandas as pd

    from bert_core.checks import Check, validate

    store = InstanceStore(data_dir, verify=False)  # its expectations check the ranges
    index = store.index
    n_all = len(store)
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(n_all, size=min(sample_size, n_all), replace=False))
    parts = [_features(store, idx[i : i + CHUNK], seed) for i in range(0, len(idx), CHUNK)]
    df = pd.DataFrame({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})

    spec, _ = masking_spec(store.data_dir, index)  # the split the output was built (or is masked) with
    t, v = index["max_seq_length"], index["vocab_size"]
    p_random = index["params"]["random_next_prob"]
    # what the generator guarantees (build.py); an index without the figure predates it: the parameter
    p_next = 1 - index["stats"].get("expected_not_next_share", p_random)
    n_preds = int(df["predictions"].sum())
    n_long = int(df["masked_share_long"].notna().sum())
    e = gx.expectations
    checks = [
        Check(e.ExpectColumnValuesToBeBetween(column="length", min_value=5, max_value=t)),
        Check(e.ExpectColumnValuesToBeBetween(column="len_a", min_value=1, max_value=t - 4)),
        Check(e.ExpectColumnValuesToBeBetween(column="len_b", min_value=1, max_value=t - 4)),
        Check(e.ExpectColumnValuesToBeInSet(column="layout_ok", value_set=[True])),
        Check(e.ExpectColumnValuesToBeBetween(column="max_id", min_value=0, max_value=v - 1)),
        Check(e.ExpectColumnValuesToBeBetween(column="min_id", min_value=0, max_value=v - 1)),
        Check(e.ExpectColumnValuesToBeBetween(column="special_masked", min_value=0, max_value=0)),
        Check(
            e.ExpectColumnValuesToBeBetween(
                column="predictions", min_value=0, max_value=index["max_predictions_per_seq"]
            )
        ),
        Check(
            e.ExpectColumnValuesToBeBetween(column="stray_special_tokens", min_value=0, max_value=0), False
        ),
    ]
    # statistical checks: the tolerance, widened to 3 standard errors when the sample is too small for it
    inv_k = float((1 / df["predictions"][df["predictions"] > 0]).mean()) if n_preds else 1.0
    n_pred_rows = int((df["predictions"] > 0).sum())
    p_mlm = float(df["expected_share_long"].mean()) if n_long else index["masked_lm_prob"]
    statistical = [
        Check(
            e.ExpectColumnMeanToBeBetween(
                column="masked_share_long", min_value=p_mlm - 0.005, max_value=p_mlm + 0.005
            ),
            critical=n_long >= 100,
        )
    ]
    for col, p in (
        ("mask_frac", spec.mask_prob),
        ("keep_frac", spec.keep_prob),
        ("random_frac", spec.random_prob),
    ):
        # mean of per-instance fractions: Var = p(1-p) * mean(1/k) / n
        sd = math.sqrt(p * (1 - p) * inv_k / max(n_pred_rows, 1))
        statistical += _share_checks(col, p, 0.01, sd)
    sd_next = math.sqrt(p_next * (1 - p_next) / max(len(df), 1))
    statistical += _share_checks("is_next", p_next, 0.01, sd_next)
    if abs(p_next - (1 - p_random)) > 0.01:  # the corpus forces more NotNext than the params ask for
        statistical.append(
            Check(
                e.ExpectColumnMeanToBeBetween(
                    column="is_next", min_value=1 - p_random - 0.01, max_value=1 - p_random + 0.01
                ),
                critical=False,
            )
        )
    lo = min(MIN_NSP_LABEL_SHARE, 1 - p_random)
    hi = max(1 - MIN_NSP_LABEL_SHARE, 1 - p_random)
    checks.append(Check(e.ExpectColumnMeanToBeBetween(column="is_next", min_value=lo, max_value=hi)))
    checks += statistical
    suite = f"pretrain_data.{index['phase']}.{index['split']}"
    report = validate(df, suite, checks, report_dir=report_dir)
    stats: dict[str, Any] = {
        "instances": len(df),
        "long_instances": n_long,
        "predictions": n_preds,
        "masked_share_long": float(df["masked_share_long"].mean()) if n_long else float("nan"),
        "masked_share_all": n_preds / max(int(df["eligible"].sum()), 1),
        "mask_share": float(df["n_mask"].sum() / max(n_preds, 1)),
        "keep_share": float(df["n_keep"].sum() / max(n_preds, 1)),
        "random_share": float((n_preds - df["n_mask"].sum() - df["n_keep"].sum()) / max(n_preds, 1)),
        "is_next_share": float(df["is_next"].mean()),
        "expected_is_next_share": p_next,
        "expected_masked_share_long": p_mlm,
        "advisory_checks": sum(not c.critical for c in statistical),
        "advisory_failed": sum(not r.critical for r in report.failed),
        "failed": len(report.failed),
        "failed_critical": len(report.failed_critical),
    }
    return report, stats
