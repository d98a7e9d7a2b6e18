"""Pair creation, truncation and masking rules, checked statistically on generated windows (no files)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bert_core.pretrain_data.instances import Window, create_pairs, materialize, truncation_pops
from bert_core.pretrain_data.loader import feistel_permute
from bert_core.pretrain_data.masking import (
    MaskingSpec,
    choose_positions,
    eligible_positions,
    mask_with_generator,
    mask_with_hash,
    num_to_predict,
)

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIALS = (PAD, UNK, CLS, SEP, MASK)
V = 1000
CONT = np.zeros(V, bool)
CONT[900:] = True  # ids 900.. are "##" continuation pieces


def make_window(n_docs: int, seed: int = 0, sents=(1, 12), sent_len=(1, 40)) -> Window:
    """Documents of random sentences; token ids 10..899 (words) with some 900.. (continuations)."""
    rng = np.random.default_rng(seed)
    lens, per_doc = [], []
    for _ in range(n_docs):
        k = int(rng.integers(sents[0], sents[1] + 1))
        per_doc.append(k)
        lens += rng.integers(sent_len[0], sent_len[1] + 1, k).tolist()
    n_tok = int(sum(lens))
    tokens = rng.integers(10, 900, n_tok).astype(np.int32)
    cont = rng.random(n_tok) < 0.2
    tokens[cont] = rng.integers(900, V, int(cont.sum()))
    return Window(
        tokens=tokens,
        sent_starts=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
        doc_sents=np.concatenate([[0], np.cumsum(per_doc)]).astype(np.int64),
        doc_rows=np.arange(n_docs, dtype=np.int64),
    )


def google_truncate(la: int, lb: int, max_tokens: int) -> tuple[int, int]:
    """Google's truncate_seq_pair loop, counting removals."""
    pa = pb = 0
    while la + lb > max_tokens:
        if la > lb:
            la, pa = la - 1, pa + 1
        else:
            lb, pb = lb - 1, pb + 1
    return pa, pb


def test_truncation_pops_equal_googles_loop():
    rng = random.Random(0)
    for _ in range(3000):
        la, lb, m = rng.randint(1, 300), rng.randint(1, 300), rng.randint(2, 300)
        assert truncation_pops(la, lb, m) == google_truncate(la, lb, m), (la, lb, m)


def pairs_for(window, seed=0, **kw):
    args = dict(max_seq_length=128, short_seq_prob=0.1, random_next_prob=0.5, nsp_balance=True)
    args.update(kw)
    return create_pairs(window, rng=random.Random(seed), **args)


def test_pairs_fit_and_segments_are_whole_sentences():
    w = make_window(400)
    p = pairs_for(w)
    starts = set(w.sent_starts.tolist())
    assert (p.a_len >= 1).all() and (p.b_len >= 1).all()
    assert (p.a_len + p.b_len <= 125).all()
    untouched = ~p.truncated
    assert untouched.mean() > 0.3
    for i in np.flatnonzero(untouched):
        a0, a1 = p.a_start[i], p.a_start[i] + p.a_len[i]
        b0, b1 = p.b_start[i], p.b_start[i] + p.b_len[i]
        assert {a0, a1, b0, b1} <= starts  # runs of whole sentences
        if not p.random_next[i]:
            assert b0 == a1  # IsNext: B continues A
    _, lengths = materialize(w.tokens, p, 128, CLS, SEP, PAD)
    assert (lengths <= 128).all()


def test_notnext_b_comes_from_another_document_and_isnext_from_the_same():
    w = make_window(300)
    p = pairs_for(w, seed=1)
    assert (p.b_doc[p.random_next] != p.a_doc[p.random_next]).all()
    assert (p.b_doc[~p.random_next] == p.a_doc[~p.random_next]).all()
    doc_of_token = np.repeat(np.arange(w.num_docs), np.diff(w.sent_starts[w.doc_sents]))
    assert (doc_of_token[p.b_start] == p.b_doc).all() and (doc_of_token[p.a_start] == p.a_doc).all()


def test_unused_sentences_are_put_back():
    """Without truncation, every sentence is in exactly one A or IsNext-B segment (Google's ``i -= unused``)."""
    w = make_window(200, sent_len=(1, 8), sents=(1, 10))
    p = pairs_for(w, max_seq_length=512, short_seq_prob=0.0)
    assert not p.truncated.any()
    covered = np.zeros(len(w.tokens), int)
    for i in range(len(p)):
        covered[p.a_start[i] : p.a_start[i] + p.a_len[i]] += 1
        if not p.random_next[i]:
            covered[p.b_start[i] : p.b_start[i] + p.b_len[i]] += 1
    assert (covered == 1).all()


def test_nsp_balance_and_googles_rule():
    w = make_window(3000, seed=2)
    balanced = pairs_for(w, seed=3)
    assert abs(balanced.random_next.mean() - 0.5) < 0.005
    google = pairs_for(w, seed=3, nsp_balance=False)
    # single-sentence chunks are forced to NotNext: Google's share is above one half on short documents
    assert google.random_next.mean() > 0.52


def test_short_target_probability_is_per_document():
    w = make_window(4000, seed=4, sents=(1, 3))
    p = pairs_for(w, seed=5, short_seq_prob=0.1)
    first_of_doc = np.r_[True, p.a_doc[1:] != p.a_doc[:-1]]
    share = p.short_target[first_of_doc].mean()
    assert abs(share - 0.1) < 0.02


def test_truncation_removes_front_and_back():
    """Two-sentence documents: A is always one whole sentence before truncation, so the removed tokens
    can be split into front and back; each side gets about half (Google's per-token coin)."""
    w = make_window(600, seed=6, sent_len=(60, 200), sents=(2, 2))
    p = pairs_for(w, seed=7)
    assert p.truncated.mean() > 0.8
    s = np.searchsorted(w.sent_starts, p.a_start, side="right") - 1
    front = p.a_start - w.sent_starts[s]
    back = w.sent_starts[s + 1] - (p.a_start + p.a_len)
    assert (front >= 0).all() and (back >= 0).all()
    assert front.sum() > 1000
    assert abs(front.sum() / (front.sum() + back.sum()) - 0.5) < 0.03


def test_layout_of_materialized_rows():
    w = make_window(50, seed=8)
    p = pairs_for(w, seed=9)
    ids, lengths = materialize(w.tokens, p, 128, CLS, SEP, PAD)
    rows = np.arange(len(p))
    assert (ids[:, 0] == CLS).all()
    assert (ids[rows, p.a_len + 1] == SEP).all() and (ids[rows, lengths - 1] == SEP).all()
    i = int(np.argmax(p.a_len))
    assert (ids[i, 1 : 1 + p.a_len[i]] == w.tokens[p.a_start[i] : p.a_start[i] + p.a_len[i]]).all()
    assert (ids[np.arange(128)[None, :] >= lengths[:, None]] == PAD).all()


def spec(whole_word=False, max_pred=20):
    return MaskingSpec(0.15, max_pred, V, MASK, SPECIALS, whole_word)


def _instances(n=4000, seed=10):
    w = make_window(n // 2, seed=seed)
    p = pairs_for(w, seed=seed)
    ids, lengths = materialize(w.tokens, p, 128, CLS, SEP, PAD)
    return ids, lengths, p.a_len


def test_num_to_predict_formula():
    n = np.array([0, 1, 2, 3, 10, 100, 125, 509, 1000])
    assert num_to_predict(n, 0.15, 20).tolist() == [0, 1, 1, 1, 2, 15, 19, 20, 20]
    assert num_to_predict(n, 0.15, 80).tolist()[-2:] == [76, 80]


@pytest.mark.parametrize("whole_word", [False, True])
def test_masking_statistics(whole_word):
    ids, lengths, len_a = _instances()
    masked, chosen = mask_with_generator(
        ids, lengths, len_a, spec(whole_word), np.random.default_rng(0), CONT
    )
    eligible = eligible_positions(ids, lengths, len_a, SPECIALS)
    assert not (chosen & ~eligible).any()  # never a special position or token
    k = num_to_predict(eligible.sum(1), 0.15, 20)
    got = chosen.sum(1)
    if whole_word:
        assert (got <= k).all() and (got >= k - 3).mean() > 0.95
    else:
        assert (got == k).all()
    long = eligible.sum(1) >= 64
    assert abs(got[long].sum() / eligible[long].sum() - 0.15) < 0.005
    orig, new = ids[chosen], masked[chosen]
    assert abs((new == MASK).mean() - 0.8) < 0.01
    assert abs((new == orig).mean() - 0.1) < 0.01
    assert abs(((new != MASK) & (new != orig)).mean() - 0.1) < 0.01
    assert (masked[~chosen] == ids[~chosen]).all()


def test_whole_word_masking_takes_whole_words():
    ids, lengths, len_a = _instances(2000, seed=11)
    eligible = eligible_positions(ids, lengths, len_a, SPECIALS)
    _, chosen = mask_with_generator(ids, lengths, len_a, spec(True), np.random.default_rng(1), CONT)
    cont = eligible & CONT[ids]
    cont[:, 1:] &= eligible[:, :-1]
    cont[:, 0] = False
    # a continuation piece is chosen exactly when the piece before it is
    assert (chosen[:, 1:][cont[:, 1:]] == chosen[:, :-1][cont[:, 1:]]).all()
    assert chosen[:, 1:][cont[:, 1:]].sum() > 100
    # and token-level masking does split words
    _, tok = mask_with_generator(ids, lengths, len_a, spec(False), np.random.default_rng(1), CONT)
    assert (tok[:, 1:][cont[:, 1:]] != tok[:, :-1][cont[:, 1:]]).any()


def test_choose_positions_is_uniform_over_eligible():
    n, t = 20000, 10
    eligible = np.ones((n, t), bool)
    eligible[:, 0] = False
    chosen = choose_positions(np.random.default_rng(0).random((n, t)), eligible, np.full(n, 3))
    freq = chosen[:, 1:].mean(0)
    assert np.allclose(freq, 3 / 9, atol=0.015) and not chosen[:, 0].any()


def test_hash_masking_depends_on_seed_epoch_and_instance_only():
    ids, lengths, len_a = _instances(400, seed=12)
    inst = np.arange(len(ids)) + 1000
    a = mask_with_hash(ids, lengths, len_a, spec(), inst, seed=1, epoch=0)[1]
    b = mask_with_hash(ids[::-1], lengths[::-1], len_a[::-1], spec(), inst[::-1], seed=1, epoch=0)[1]
    assert (a == b[::-1]).all()  # order/batching does not matter
    c = mask_with_hash(ids, lengths, len_a, spec(), inst, seed=1, epoch=1)[1]
    assert (a != c).any(axis=1).mean() > 0.9  # a fresh mask each epoch
    masked, chosen = mask_with_hash(ids, lengths, len_a, spec(), inst, seed=1, epoch=2)
    assert abs((masked[chosen] == MASK).mean() - 0.8) < 0.03


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_feistel_is_a_permutation(n):
    p = feistel_permute(np.arange(n), n, np.uint64(12345))
    assert sorted(p.tolist()) == list(range(n))
    if n >= 64:
        assert (p != np.arange(n)).mean() > 0.9
        q = feistel_permute(np.arange(n), n, np.uint64(54321))
        assert (p != q).mean() > 0.9
