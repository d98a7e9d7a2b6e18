"""NSP balance over the whole output: a task full of forced NotNext, the corpora where balance is
impossible, worker-count independence, and one phase built alone equal to the same phase built beside
another."""

from __future__ import annotations

import filecmp
import json
import logging

import numpy as np
import pyarrow.parquet as pq
import pytest

from bert_core.checks import DataCheckError
from bert_core.pretrain_data.build import build_pretrain_data, nsp_tolerance, plan_nsp_compensation
from bert_core.pretrain_data.params import PretrainDataParams
from bert_core.pretrain_data.testing import make_synthetic_inputs, write_corpus


def params(**kw) -> PretrainDataParams:
    base = dict(
        phases=["seq128"],
        dupe_factor=2,
        num_workers=1,
        window_tokens=5_000,
        min_window_docs=16,
        task_bytes=40_000,
        check_sample=50_000,
    )
    return PretrainDataParams(**(base | kw))


def long_sentence_doc(n_sentences: int, seed: int) -> list[str]:
    """A document whose every sentence is longer than a seq128 instance: each chunk is one sentence,
    forced to NotNext."""
    rng = np.random.default_rng(seed)
    return [" ".join(f"w{i}" for i in rng.integers(0, 400, 140)) + " ." for _ in range(n_sentences)]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("nsp-in")
    corpus, vocab = make_synthetic_inputs(root / "base", n_train=400, n_heldout=60)
    docs = pq.read_table(corpus / "train" / "part-00000.parquet").column("sentences").to_pylist()
    docs += pq.read_table(corpus / "train" / "part-00001.parquet").column("sentences").to_pylist()
    heldout = pq.read_table(corpus / "heldout" / "part-00000.parquet").column("sentences").to_pylist()
    return docs, heldout, vocab


@pytest.fixture(scope="module")
def book_corpus(synthetic, tmp_path_factory):
    """A "book" of 150 over-long sentences first (its task is all forced NotNext), then ordinary documents."""
    docs, heldout, vocab = synthetic
    root = tmp_path_factory.mktemp("nsp-book")
    write_corpus(root, "train", [long_sentence_doc(150, 0), *docs], docs_per_shard=150)
    write_corpus(root, "heldout", heldout)
    return root, vocab


def _shard_notnext(d, shard: str) -> float:
    return float(np.fromfile(d / f"{shard}.nsp.bin", dtype=np.uint8).mean())


def test_a_task_of_forced_notnext_is_balanced_by_the_others(book_corpus, tmp_path):
    corpus, vocab = book_corpus
    r = build_pretrain_data(params(), corpus_dir=corpus, vocab_dir=vocab, output_dir=tmp_path / "one")
    assert not any(rep.failed_critical for rep in r.reports), [rep.summary() for rep in r.reports]
    m = r.metrics["seq128"]["train"]
    d = tmp_path / "one" / "seq128" / "train"
    index = json.loads((d / "index.json").read_text())
    assert _shard_notnext(d, "shard-00000") > 0.7  # the book's task cannot balance itself
    assert m["nsp_tasks_rerun"] >= 1 and m["nsp_balanced"]
    assert abs(m["nsp_residual"]) <= nsp_tolerance(len(index["shards"]))
    assert abs(m["is_next_share"] - 0.5) <= nsp_tolerance(len(index["shards"])) / m["instances"]
    assert m["expected_not_next_share"] == 0.5 and m["forced_not_next_share"] < 0.5
    nsp = np.concatenate([np.fromfile(d / f"{s['name']}.nsp.bin", dtype=np.uint8) for s in index["shards"]])
    assert len(nsp) == m["instances"] and int(nsp.sum()) == round(m["instances"] * (1 - m["is_next_share"]))

    # the same bytes with two workers (re-runs included)
    build_pretrain_data(
        params(num_workers=2),
        corpus_dir=corpus,
        vocab_dir=vocab,
        output_dir=tmp_path / "two",
        run_checks=False,
    )
    files = sorted(str(p.relative_to(tmp_path / "one")) for p in (tmp_path / "one").rglob("*") if p.is_file())
    assert files == sorted(
        str(p.relative_to(tmp_path / "two")) for p in (tmp_path / "two").rglob("*") if p.is_file()
    )
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "one", tmp_path / "two", files, shallow=False)
    assert mismatch == [] and errors == []


def test_without_balance_the_check_follows_googles_rule(book_corpus, tmp_path):
    corpus, vocab = book_corpus
    r = build_pretrain_data(
        params(nsp_balance=False, dupe_factor=1),
        corpus_dir=corpus,
        vocab_dir=vocab,
        output_dir=tmp_path / "o",
    )
    assert not any(rep.failed_critical for rep in r.reports), [rep.summary() for rep in r.reports]
    m = r.metrics["seq128"]["train"]
    forced = m["forced_not_next_share"]
    assert m["expected_not_next_share"] == pytest.approx(forced + 0.5 * (1 - forced))
    assert m["is_next_share"] < 0.45 and m["nsp_tasks_rerun"] == 0


def test_one_phase_alone_equals_that_phase_beside_another(book_corpus, tmp_path):
    """Seeds are keyed by phase name and every phase has its own NSP counter and balance rounds, so the
    phase list changes nothing in a phase's shards."""
    corpus, vocab = book_corpus
    kw = dict(run_checks=False, corpus_dir=corpus, vocab_dir=vocab)
    both = build_pretrain_data(
        params(phases=["seq128", "seq512"], dupe_factor=1), output_dir=tmp_path / "both", **kw
    )
    alone = build_pretrain_data(params(dupe_factor=1), output_dir=tmp_path / "alone", **kw)
    assert both.metrics["seq128"]["train"]["nsp_tasks_rerun"] >= 1
    for split in ("train", "heldout"):
        a, b = tmp_path / "alone" / "seq128" / split, tmp_path / "both" / "seq128" / split
        files = sorted(p.name for p in a.iterdir() if p.name != "index.json")
        assert files == sorted(p.name for p in b.iterdir() if p.name != "index.json")
        _, mismatch, errors = filecmp.cmpfiles(a, b, files, shallow=False)
        assert mismatch == [] and errors == []
        ia, ib = (json.loads((x / "index.json").read_text()) for x in (a, b))
        ia["params"].pop("phases"), ib["params"].pop("phases")
        assert ia == ib
        ma, mb = alone.metrics["seq128"][split], both.metrics["seq128"][split]
        ma.pop("disk_bytes"), mb.pop("disk_bytes")  # index.json lists the phases
        assert ma == mb


@pytest.fixture(scope="module")
def forced_corpus(synthetic, tmp_path_factory):
    """Documents of over-long sentences among ordinary ones: about two thirds of the seq128 instances are
    forced NotNext, more than random_next_prob."""
    docs, heldout, vocab = synthetic
    root = tmp_path_factory.mktemp("nsp-forced")
    mixed = [d for k, doc in enumerate(docs[:200]) for d in (doc, long_sentence_doc(4, k))]
    write_corpus(root, "train", mixed)
    write_corpus(
        root, "heldout", [d for k, doc in enumerate(heldout) for d in (doc, long_sentence_doc(4, k))]
    )
    return root, vocab


def test_balance_out_of_reach_warns_and_passes(forced_corpus, tmp_path, caplog):
    corpus, vocab = forced_corpus
    with caplog.at_level(logging.WARNING, logger="bert_core.pretrain_data.build"):
        r = build_pretrain_data(params(), corpus_dir=corpus, vocab_dir=vocab, output_dir=tmp_path / "o")
    m = r.metrics["seq128"]["train"]
    forced = m["forced_not_next_share"]
    assert 0.5 < forced < 0.8, forced
    assert m["expected_not_next_share"] == forced
    assert abs(1 - m["is_next_share"] - forced) < 0.01  # every chunk with a choice went IsNext
    assert any("seq128/train" in rec.message and f"{forced:.4f}" in rec.message for rec in caplog.records)
    assert not any(rep.failed_critical for rep in r.reports), [rep.summary() for rep in r.reports]
    train = r.reports[0]
    assert any(not res.critical for res in train.failed)  # the advisory at random_next_prob is reported


def test_an_output_nsp_cannot_learn_from_fails(synthetic, tmp_path):
    """Every chunk a single sentence: no IsNext at all; training NSP on it would be wrong."""
    _, _, vocab = synthetic
    corpus = tmp_path / "c"
    write_corpus(corpus, "train", [long_sentence_doc(4, k) for k in range(40)])
    write_corpus(corpus, "heldout", [long_sentence_doc(4, k) for k in range(40, 50)])
    with pytest.raises(DataCheckError, match="is_next"):
        build_pretrain_data(params(), corpus_dir=corpus, vocab_dir=vocab, output_dir=tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_compensation_plan():
    p = 0.5
    s = lambda n, r, f: {"instances": n, "random_next": r, "forced_random": f}  # noqa: E731
    # the first task is 40 NotNext over; the second has 30 choices to give, the third the rest
    stats = [s(100, 90, 90), s(100, 50, 10), s(100, 50, 10)]
    assert plan_nsp_compensation(stats, [0.0, 0.0, 0.0], p) == {1: 40.0}
    stats = [s(100, 90, 90), s(100, 50, 20), s(100, 50, 10)]
    assert plan_nsp_compensation(stats, [0.0, 0.0, 0.0], p) == {1: 30.0, 2: 10.0}
    # within rounding: nothing to do; too few NotNext: lean the other way
    assert plan_nsp_compensation([s(100, 51, 0), s(100, 50, 0)], [0.0, 0.0], p) == {}
    assert plan_nsp_compensation([s(100, 40, 0), s(100, 50, 0)], [0.0, 5.0], p) == {0: -10.0}
    # no choice left anywhere: nothing to re-run
    assert plan_nsp_compensation([s(100, 90, 90), s(100, 50, 50)], [0.0, 0.0], p) == {}
