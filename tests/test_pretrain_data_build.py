"""The builder end to end on generated corpora: statistics, checks, determinism, provenance, errors."""

from __future__ import annotations

import filecmp
import json
import logging
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from bert_core.checks import DataCheckError
from bert_core.constants import REPO_ROOT as REPO
from bert_core.params import ParamsError, load_params, parse_params
from bert_core.pretrain_data.build import build_pretrain_data
from bert_core.pretrain_data.params import PretrainDataParams
from bert_core.pretrain_data.plan import plan_tasks
from bert_core.pretrain_data.storage import InstanceStore
from bert_core.pretrain_data.testing import make_synthetic_inputs, write_corpus


def params(**kw) -> PretrainDataParams:
    base = dict(
        dupe_factor=2,
        num_workers=1,
        window_tokens=5_000,
        min_window_docs=16,
        task_bytes=100_000,
        check_sample=50_000,
    )
    base.update(kw)
    return PretrainDataParams(**base)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_synthetic_inputs(tmp_path_factory.mktemp("pd-inputs"))


@pytest.fixture(scope="module")
def built(inputs, tmp_path_factory):
    corpus, vocab = inputs
    out = tmp_path_factory.mktemp("pd-out") / "pretrain_data"
    result = build_pretrain_data(
        params(track_docs=True),
        corpus_dir=corpus,
        vocab_dir=vocab,
        output_dir=out,
        report_dir=out.parent / "rep",
    )
    return out, result


def original_ids(rows: dict) -> np.ndarray:
    labels = rows["labels"]
    return np.where(labels != -100, labels, rows["ids"])


def test_outputs_layout_index_and_checks(built, inputs):
    out, result = built
    for phase, t, max_pred in (("seq128", 128, 20), ("seq512", 512, 80)):
        for split in ("train", "heldout"):
            d = out / phase / split
            index = json.loads((d / "index.json").read_text())
            assert index["max_seq_length"] == t and index["max_predictions_per_seq"] == max_pred
            assert (d / "vocab.txt").read_bytes() == (inputs[1] / "vocab.txt").read_bytes()
            vocab_lines = (d / "vocab.txt").read_text().splitlines()
            assert index["token_dtype"] == "uint16" and index["vocab_size"] == len(vocab_lines)
            store = InstanceStore(d)
            assert len(store) == index["num_instances"] > 0
            m = result.metrics[phase][split]
            assert m["instances"] == len(store) and m["tokens"] == index["num_tokens"]
            assert 0 <= m["padding_share"] < 1 and 0 < m["truncated_share"] < 1
            assert abs(m["is_next_share"] - 0.5) < 0.01
            assert abs(m["mask_share"] - 0.8) < 0.02 and abs(m["keep_share"] - 0.1) < 0.02
    assert [r.success for r in result.reports] == [True] * 4, [r.summary() for r in result.reports]
    assert (out.parent / "rep" / "seq128-train" / "index.html").is_file()
    # dupe passes of the train split vs one pass of heldout (same corpus size would give ~2x)
    assert (
        result.metrics["seq128"]["train"]["instances"] > 2 * result.metrics["seq128"]["heldout"]["instances"]
    )


def test_masked_share_and_no_special_masked(built):
    out, _ = built
    store = InstanceStore(out / "seq128" / "train")
    rows = store.gather(np.arange(len(store)))
    chosen = rows["labels"] != -100
    sp = store.index["special_token_ids"]
    assert not np.isin(rows["labels"][chosen], list(sp.values())).any()
    eligible = rows["lengths"] - 3
    long = eligible >= 64
    share = chosen.sum(1)[long].sum() / eligible[long].sum()
    assert abs(share - 0.15) < 0.005
    assert chosen.sum(1).max() <= 20


def test_notnext_b_really_comes_from_another_document(built, inputs):
    """Re-tokenise the corpus and find A and B (untruncated instances) in the recorded documents."""
    from tokenizers import Tokenizer

    out, _ = built
    corpus, vocab = inputs
    tok = Tokenizer.from_file(str(vocab / "tokenizer.json"))
    store = InstanceStore(out / "seq128" / "train")
    docs_of_task = []
    for shard in store.index["shards"]:
        rows = []
        for f, a, b in shard["corpus_rows"]:
            rows += pq.read_table(corpus / "train" / f).column("sentences").to_pylist()[a:b]
        docs_of_task.append(
            [
                " ".join(str(i) for e in tok.encode_batch(d, add_special_tokens=False) for i in e.ids)
                for d in rows
            ]
        )
    checked = {True: 0, False: 0}
    for s, shard in enumerate(store.shards):
        idx = store.cum[s] + np.arange(min(shard.n, 400))
        rows = store.gather(idx)
        ids = original_ids(rows)
        for i in range(len(idx)):
            la, n = rows["len_a"][i], rows["lengths"][i]
            a_doc, b_doc = rows["docs"][i]
            a = " ".join(map(str, ids[i, 1 : 1 + la]))
            b = " ".join(map(str, ids[i, la + 2 : n - 1]))
            text = docs_of_task[s]
            assert a in text[a_doc] and b in text[b_doc]
            not_next = bool(rows["nsp"][i])
            assert (a_doc != b_doc) == not_next
            if not not_next:  # IsNext: B follows A in the same document (truncation may cut a gap)
                assert text[a_doc].index(b) > text[a_doc].index(a)
            checked[not_next] += 1
    assert min(checked.values()) > 300


def test_same_bytes_with_one_or_two_workers(built, inputs, tmp_path):
    corpus, vocab = inputs
    out2 = tmp_path / "two"
    build_pretrain_data(
        params(track_docs=True, num_workers=2),
        corpus_dir=corpus,
        vocab_dir=vocab,
        output_dir=out2,
        run_checks=False,
    )
    files = sorted(p.relative_to(built[0]) for p in built[0].rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(out2) for p in out2.rglob("*") if p.is_file())
    assert len(files) > 20
    _, mismatch, errors = filecmp.cmpfiles(built[0], out2, [str(f) for f in files], shallow=False)
    assert mismatch == [] and errors == []


def test_seed_changes_the_output_and_dynamic_mode_stores_unmasked(inputs, tmp_path, caplog):
    corpus, vocab = inputs
    kw = dict(corpus_dir=corpus, vocab_dir=vocab, run_checks=False)
    caplog.set_level(logging.INFO, "bert_core")
    built = build_pretrain_data(params(phases=["seq128"], seed=1), output_dir=tmp_path / "a", **kw)
    train = built.metrics["seq128"]["train"]
    said = f"pretrain_data seq128: {train['instances']:,} train instances ({train['tokens']:,} tokens, mean length"
    assert sum(m.startswith(said) for m in caplog.messages) == 1, caplog.messages  # one summary per phase
    build_pretrain_data(params(phases=["seq128"], seed=2, masking="dynamic"), output_dir=tmp_path / "b", **kw)
    a = (tmp_path / "a/seq128/train/shard-00000.tokens.bin").read_bytes()
    b = (tmp_path / "b/seq128/train/shard-00000.tokens.bin").read_bytes()
    assert a != b
    assert not (tmp_path / "b/seq512").exists()  # a profile may build one phase
    dyn = InstanceStore(tmp_path / "b/seq128/train")
    assert dyn.index["masking"] == "dynamic" and not list((tmp_path / "b/seq128/train").glob("*.mlm_*"))
    mask_id = dyn.index["special_token_ids"]["[MASK]"]
    assert not (dyn.gather(np.arange(len(dyn)))["ids"] == mask_id).any()
    assert InstanceStore(tmp_path / "b/seq128/heldout").index["masking"] == "static"  # fixed eval masks


def test_memory_is_bounded_by_the_window(inputs, tmp_path):
    """Windows are cut by tokens: a smaller window_tokens gives more windows; instances stay the same kind."""
    corpus, vocab = inputs
    kw = dict(corpus_dir=corpus, vocab_dir=vocab, run_checks=False)
    r = build_pretrain_data(params(phases=["seq128"], window_tokens=2_000), output_dir=tmp_path / "o", **kw)
    assert r.metrics["seq128"]["train"]["windows"] >= 20


def test_failed_check_leaves_no_output(inputs, tmp_path):
    """Google's NSP rule on one-sentence documents gives only NotNext: the critical NSP check refuses it."""
    corpus = tmp_path / "corpus"
    docs = [[f"w{i} w{i + 1} ."] for i in range(300)]
    write_corpus(corpus, "train", docs)
    write_corpus(corpus, "heldout", docs[:50])
    out = tmp_path / "out"
    with pytest.raises(DataCheckError, match="is_next"):
        build_pretrain_data(
            params(phases=["seq128"], nsp_balance=False),
            corpus_dir=corpus,
            vocab_dir=inputs[1],
            output_dir=out,
        )
    assert not out.exists() and list(tmp_path.iterdir()) == [corpus]


# ---- bad input ----------------------------------------------------------------------------------------


def _build(corpus, vocab, out, **kw):
    return build_pretrain_data(
        params(**kw), corpus_dir=corpus, vocab_dir=vocab, output_dir=out, run_checks=False
    )


def test_empty_corpus(inputs, tmp_path):
    vocab = inputs[1]
    (tmp_path / "c1" / "train").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"empty corpus.*no part-"):
        _build(tmp_path / "c1", vocab, tmp_path / "o")
    write_corpus(tmp_path / "c2", "train", [])
    with pytest.raises(ValueError, match=r"empty corpus.*hold no document"):
        _build(tmp_path / "c2", vocab, tmp_path / "o")
    with pytest.raises(FileNotFoundError, match="heldout"):
        write_corpus(tmp_path / "c3", "train", [["w1 w2 ."], ["w3 w4 ."]])
        _build(tmp_path / "c3", vocab, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_one_document_corpus(inputs, tmp_path):
    write_corpus(tmp_path / "c", "train", [["w1 w2 .", "w3 w4 ."]])
    write_corpus(tmp_path / "c", "heldout", [["w1 w2 ."], ["w5 ."]])
    with pytest.raises(ValueError, match=r"single document.*at least two"):
        _build(tmp_path / "c", inputs[1], tmp_path / "o")


def test_documents_without_tokens_are_dropped_and_reported(inputs, tmp_path):
    write_corpus(tmp_path / "c", "train", [["w1 w2 ."], ["", ""], []])
    write_corpus(tmp_path / "c", "heldout", [["w1 w2 ."], ["w5 ."]])
    with pytest.raises(ValueError, match="fewer than two non-empty documents"):
        _build(tmp_path / "c", inputs[1], tmp_path / "o")


def test_bad_corpus_schema(inputs, tmp_path):
    import pyarrow as pa

    (tmp_path / "c" / "train").mkdir(parents=True)
    pq.write_table(pa.table({"text": ["a", "b"]}), tmp_path / "c" / "train" / "part-00000.parquet")
    with pytest.raises(ValueError, match=r"part-00000.parquet.*'sentences'"):
        _build(tmp_path / "c", inputs[1], tmp_path / "o")


def test_vocab_errors(inputs, tmp_path):
    corpus, vocab = inputs
    bad = tmp_path / "v"
    bad.mkdir()
    lines = (vocab / "vocab.txt").read_text().splitlines()
    (bad / "vocab.txt").write_text("\n".join(t for t in lines if t != "[MASK]") + "\n")
    with pytest.raises(ValueError, match=r"no \[MASK\] entry"):
        _build(corpus, bad, tmp_path / "o")
    with pytest.raises(FileNotFoundError, match="vocab stage"):
        _build(corpus, tmp_path / "missing", tmp_path / "o")
    (bad / "vocab.txt").write_text("\n".join(lines[:-1]) + "\n")  # one entry fewer than tokenizer.json
    (bad / "tokenizer.json").write_bytes((vocab / "tokenizer.json").read_bytes())
    with pytest.raises(ValueError, match=r"tokenizer.json has .* tokens but"):
        _build(corpus, bad, tmp_path / "o")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"masked_lm_prob": 1.5}, "masked_lm_prob' = 1.5: Input should be less than or equal to 1"),
        ({"masked_lm_prob": 0}, "masked_lm_prob' = 0: Input should be greater than 0"),
        (
            {
                "phase_specs": {"seq1024": {"max_seq_length": 1024, "max_predictions_per_seq": 160}},
                "phases": ["seq1024"],
            },
            "max_seq_length = 1024 exceeds max_position_embeddings = 512",
        ),
        ({"phases": ["seq256"]}, r"phases \['seq256'\] have no entry in phase_specs"),
        (
            {"phase_specs": {"s": {"max_seq_length": 16, "max_predictions_per_seq": 20}}, "phases": ["s"]},
            "maskable",
        ),
        ({"dupe_factor": 0}, "dupe_factor' = 0"),
        ({"masking": "sometimes"}, "masking' = 'sometimes'"),
        ({"dupe_factr": 3}, "unknown key 'pretrain_data.dupe_factr'"),
    ],
)
def test_bad_params(override, message):
    with pytest.raises(ParamsError, match=message):
        parse_params(override, PretrainDataParams, where="params/pretrain_data.yaml", prefix="pretrain_data")


def test_shipped_params_file_parses():
    p = load_params(REPO / "params" / "pretrain_data.yaml", "pretrain_data", PretrainDataParams)
    assert p.phase_specs["seq128"].max_predictions_per_seq == 40  # 30% masking (the paper's 20 at 15%)
    assert p.phase_specs["seq512"].max_predictions_per_seq == 80
    assert (p.phases, p.masked_lm_prob, p.random_next_prob) == (["seq128"], 0.3, 0.0)


def test_plan_cuts_the_document_stream_into_tasks_by_bytes(tmp_path):
    """Tasks are runs of documents of about ``task_bytes`` across shard boundaries, two documents at least."""
    small, big = ["w1 ."], ["x" * 100]
    for i, docs in enumerate([[small] * 3, [big], [small] * 5]):
        write_corpus(tmp_path / f"c{i}", "train", docs)
        (tmp_path / "all" / "train").mkdir(parents=True, exist_ok=True)
        (tmp_path / f"c{i}" / "train" / "part-00000.parquet").rename(
            tmp_path / "all" / "train" / f"part-{i:05d}.parquet"
        )
    tasks = plan_tasks(tmp_path / "all", "train", task_bytes=10)
    assert [t.num_rows for t in tasks] == [3, 2, 4]
    assert [[(Path(f).name, a, b) for f, a, b in t.segments] for t in tasks] == [
        [("part-00000.parquet", 0, 3)],
        [("part-00001.parquet", 0, 1), ("part-00002.parquet", 0, 1)],
        [("part-00002.parquet", 1, 5)],
    ]
    assert len(plan_tasks(tmp_path / "all", "train", task_bytes=10**9)) == 1


def test_checks_catch_a_damaged_output(built, tmp_path):
    """The row-level expectations fail on a broken layout and on an id beyond the vocabulary."""
    import shutil

    from bert_core.pretrain_data.checks import check_output

    d = tmp_path / "d"
    shutil.copytree(built[0] / "seq128" / "heldout", d)
    tokens = np.memmap(d / "shard-00000.tokens.bin", dtype=np.uint16, mode="r+")
    offsets = np.fromfile(d / "shard-00000.offsets.bin", dtype=np.int64)
    tokens[offsets[0]] = 7  # [CLS] of instance 0 replaced
    tokens[offsets[1] + 3] = 60000  # an id beyond the vocabulary in instance 1
    tokens.flush()
    del tokens
    report, _ = check_output(d, sample_size=10**6, seed=0)
    failed = " ".join(r.name for r in report.failed_critical)
    assert "layout_ok" in failed and "max_id" in failed
    with pytest.raises(DataCheckError, match="layout_ok"):
        report.raise_for_critical()
