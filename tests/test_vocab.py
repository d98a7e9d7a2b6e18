"""Stage `vocab`: WordPiece on a real corpus sample, BERT's special layout, HF loading, checks, errors."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bert_core.checks import validate
from bert_core.constants import REPO_ROOT
from bert_core.corpus import CorpusParams, build_corpus
from bert_core.params import ParamsError, parse_params
from bert_core.vocab import (
    VocabError,
    VocabParams,
    read_vocab,
    special_layout,
    train_vocab,
    vocab_checks,
)
from bert_core.vocab.wordpiece import count_words, learn_wordpiece

RELEASED = "checkpoints/bert-base-uncased/vocab.txt"
TEXT = "The Café in Zürich served 1,234 coffees; HELLO world!"


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("vocab-corpus")
    params = CorpusParams.model_validate(
        {
            "sources": [{"name": "hub", "kind": "hf", "path": "x"}],
            "local_sources": [
                {
                    "name": "gutenberg",
                    "kind": "text",
                    "path": "corpus/gutenberg/pg2*.txt",
                    "max_bytes": 400_000,
                },
                {
                    "name": "wikipedia",
                    "kind": "jsonl",
                    "path": "corpus/wikipedia/wiki_00.jsonl",
                    "id_field": "id",
                    "title_field": "title",
                    "max_documents": 250,
                },
            ],
            "heldout": {"fraction": 0.05, "max_documents": 20},
        }
    )
    build_corpus(params, tmp / "corpus", data_root=shared_data, workers=1)
    return tmp / "corpus"


@pytest.fixture(scope="module")
def uncased(corpus, shared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("vocab") / "vocab"
    params = VocabParams(vocab_size=3000)
    stats = train_vocab(
        params, corpus, out, reference_vocab=shared_data / RELEASED, report_dir=out.parent / "r"
    )
    return params, out, stats


def test_layout_matches_the_released_vocab(shared_data):
    released = read_vocab(shared_data / RELEASED)
    assert len(released) == 30522
    layout = special_layout(VocabParams().unused_slots)
    assert len(layout) == 999 and released[: len(layout)] == layout
    assert [released.index(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [
        0,
        100,
        101,
        102,
        103,
    ]
    df, checks = vocab_checks(released, 30522, 994)
    assert validate(df, "vocab", checks).success


def test_trained_vocab_files_and_layout(uncased):
    params, out, stats = uncased
    assert sorted(p.name for p in out.iterdir()) == [
        ".bert-output",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    tokens = read_vocab(out / "vocab.txt")
    assert len(tokens) == stats.vocab_size == 3000
    n_unused = round(994 * 3000 / 30522)  # 98: all before [UNK], so [UNK] sits at 99
    assert params.unused_slots == n_unused == 98
    assert tokens[: n_unused + 5] == [
        "[PAD]",
        *[f"[unused{i}]" for i in range(98)],
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
    ]
    assert len(set(tokens)) == len(tokens) and all(tokens)
    assert stats.check_report.success and (out.parent / "r" / "index.html").is_file()
    assert stats.continuation_pieces > 100


def test_loads_in_transformers_and_tokenizers(uncased):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, BertTokenizerFast

    _, out, _ = uncased
    fast = BertTokenizerFast.from_pretrained(str(out))
    auto = AutoTokenizer.from_pretrained(str(out))
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = fast(TEXT)["input_ids"]
    assert auto(TEXT)["input_ids"] == ids == raw.encode(TEXT).ids
    assert ids[0] == fast.cls_token_id == 100 and ids[-1] == fast.sep_token_id == 101
    assert (fast.pad_token_id, fast.unk_token_id, fast.mask_token_id) == (0, 99, 102)
    assert len(fast) == 3000
    # Uncased: lower-cased, accents stripped.
    assert fast("CAFÉ zürich")["input_ids"] == fast("cafe zurich")["input_ids"]
    assert fast.unk_token_id not in ids
    assert fast.decode(fast("the coffee")["input_ids"], skip_special_tokens=True) == "the coffee"


def test_heldout_metrics_next_to_the_released_vocab(uncased):
    _, _, stats = uncased
    m = stats.as_metrics()
    ours, ref = m["heldout"], m["reference_bert_base_uncased"]
    assert ours["sentences"] > 100 and ours["words"] == ref["words"] > 1000
    assert 0.0 <= ours["unk_rate"] < 0.01 and 0.0 <= ref["unk_rate"] < 0.01
    # A 3,000-entry vocab splits words more often than the released 30,522-entry one.
    assert ours["subwords_per_word"] > ref["subwords_per_word"] > 1.0
    assert m["sample_documents"] > 0 and m["sample_bytes"] > 0 and m["sample_fraction"] == 1.0


def test_cased_option_and_bounded_sample(corpus, tmp_path):
    from transformers import BertTokenizerFast

    params = VocabParams(vocab_size=1500, lowercase=False, sample_max_bytes=100_000)
    stats = train_vocab(params, corpus, tmp_path / "cased", reference_vocab=None)
    assert stats.sample_bytes <= 100_000 and stats.sample_fraction < 1.0 and stats.reference is None
    tok = BertTokenizerFast.from_pretrained(str(tmp_path / "cased"))
    assert tok("Hello")["input_ids"] != tok("hello")["input_ids"]
    assert json.loads((tmp_path / "cased" / "tokenizer_config.json").read_text())["do_lower_case"] is False
    # The sample is a seeded hash of doc_id and the merges break ties by a total order: same bytes again.
    again = train_vocab(params, corpus, tmp_path / "again", reference_vocab=None)
    assert (again.sample_documents, again.sample_bytes) == (stats.sample_documents, stats.sample_bytes)
    for name in ("vocab.txt", "tokenizer.json"):
        assert (tmp_path / "cased" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()


def test_checks_catch_broken_vocabs(shared_data):
    good = read_vocab(shared_data / RELEASED)
    no_mask = [("[MSK]" if t == "[MASK]" else t) for t in good]
    dup = [*good[:-1], good[2000]]
    empty = [*good[:-1], ""]
    for tokens, failing in (
        (no_mask, {"expect_column_pair_values_to_be_equal", "expect_column_distinct_values_to_contain_set"}),
        (dup, {"expect_column_values_to_be_unique"}),
        (empty, {"expect_column_value_lengths_to_be_between"}),
        (good[:-5], {"expect_table_row_count_to_equal"}),
    ):
        df, checks = vocab_checks(tokens, 30522, 994)
        report = validate(df, "vocab", checks)
        assert {r.name.split("(")[0] for r in report.failed} == failing


def test_errors_leave_no_output(corpus, tmp_path):
    out = tmp_path / "vocab"
    out.mkdir()
    (out / "vocab.txt").write_text("previous\n")
    with pytest.raises(VocabError, match=r"fewer than vocab\.vocab_size=200000; lower vocab_size"):
        train_vocab(VocabParams(vocab_size=200_000), corpus, out)
    assert (out / "vocab.txt").read_text() == "previous\n"
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    with pytest.raises(FileNotFoundError, match="is not a built corpus"):
        train_vocab(VocabParams(vocab_size=1000), tmp_path / "nope", tmp_path / "v2")
    with pytest.raises(FileNotFoundError, match="reference vocab"):
        train_vocab(VocabParams(vocab_size=1000), corpus, tmp_path / "v3", reference_vocab=tmp_path / "x.txt")


def test_bad_params():
    with pytest.raises(ParamsError, match=r"'vocab\.vocab_size' = 50"):
        parse_params({"vocab_size": 50}, VocabParams, where="params/vocab.yaml", prefix="vocab")
    with pytest.raises(ParamsError, match="unused slots"):
        parse_params({"vocab_size": 1000, "num_unused": 600}, VocabParams, prefix="vocab")
    with pytest.raises(ParamsError, match=r"unknown key 'vocab\.size'"):
        parse_params({"size": 1000}, VocabParams, prefix="vocab")


# --- reproducibility --------------------------------------------------------------------------------------
#: Trains a vocab in a fresh interpreter: argv = corpus dir, out dir, VocabParams as JSON.
_TRAIN = (
    "import json, sys\n"
    "from bert_core.vocab import VocabParams, train_vocab\n"
    "train_vocab(VocabParams.model_validate_json(sys.argv[3]), sys.argv[1], sys.argv[2])\n"
)


def _synthetic_documents(n_docs: int = 300, seed: int = 7) -> list[dict]:
    """Seeded pseudo-text full of ties: a small lexicon of syllable words, many equally frequent pairs.

    The rarer letters (Greek) appear a handful of times each, so a small ``limit_alphabet`` cuts between
    characters of equal count too.
    """
    rng = random.Random(seed)
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    syllables = [c + v for c in consonants for v in vowels]
    lexicon = sorted({"".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(900)})
    rare = [ch + rng.choice(vowels) for ch in "αβγδεζηθικλμνξπρστυφχψω"]
    docs = []
    for d in range(n_docs):
        sentences = []
        for _ in range(rng.randint(3, 8)):
            words = rng.choices(lexicon, k=rng.randint(6, 14))
            if rng.random() < 0.05:
                words.append(rng.choice(rare))
            sentences.append(" ".join(words).capitalize() + ".")
        docs.append({"id": f"d{d}", "title": f"Doc {d}", "text": " ".join(sentences)})
    return docs


@pytest.fixture(scope="module")
def synthetic_corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synthetic-root")
    (root / "corpus").mkdir()
    with (root / "corpus" / "synthetic.jsonl").open("w", encoding="utf-8") as f:
        for doc in _synthetic_documents():
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    params = CorpusParams.model_validate(
        {
            "sources": [{"name": "hub", "kind": "hf", "path": "x"}],
            "local_sources": [
                {
                    "name": "synthetic",
                    "kind": "jsonl",
                    "path": "corpus/synthetic.jsonl",
                    "id_field": "id",
                    "title_field": "title",
                },
            ],
            "heldout": {"fraction": 0.05, "max_documents": 10},
        }
    )
    build_corpus(params, root / "built", data_root=root, workers=1)
    return root / "built"


def test_word_counts_are_the_pre_tokenizers():
    from collections import Counter

    from tokenizers import normalizers, pre_tokenizers

    texts = [TEXT, "Ünïcode  spaces\tand\u00a0nbsp, 中文字 (CJK) don't-stop", "x" * 150]
    norm = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    pre = pre_tokenizers.BertPreTokenizer()
    expected = Counter(w for t in texts for w, _ in pre.pre_tokenize_str(norm.normalize_str(t)))
    assert count_words([texts[:2], texts[2:]], norm, pre) == dict(expected)


def test_merges_break_ties_by_count_then_strings():
    counts = {"cd": 3, "ab": 3, "dcd": 3, "bx": 4, "abx": 4}
    tokens = learn_wordpiece(counts, vocab_size=20, special_tokens=["[UNK]"])
    # Specials, the alphabet, the "##" pieces, then merges: a+##b (7); a tie at 4, ab+##x before b+##x
    # ("ab" < "b"); then three at 3: ##c+##d, c+##d, d+##c, and d+##cd once ##cd exists ("#" < "c" < "d").
    assert tokens == [
        "[UNK]",
        "a",
        "b",
        "c",
        "d",
        "x",
        "##b",
        "##c",
        "##d",
        "##x",
        "ab",
        "abx",
        "bx",
        "##cd",
        "cd",
        "dcd",
    ]
    assert learn_wordpiece(dict(reversed(counts.items())), vocab_size=20, special_tokens=["[UNK]"]) == tokens
    assert learn_wordpiece(counts, vocab_size=12, special_tokens=["[UNK]"]) == tokens[:12]
    assert learn_wordpiece(counts, vocab_size=20, min_frequency=4) == tokens[1:13]
    # limit_alphabet keeps the most frequent characters, equal counts by code point: "d" goes.
    assert learn_wordpiece({"ab": 2, "cd": 2}, vocab_size=9, limit_alphabet=3) == ["a", "b", "c", "##b", "ab"]


def _train_in_processes(
    corpus: Path, out: Path, params: VocabParams, envs: list[dict[str, str]]
) -> list[Path]:
    """Train the same vocab once per ``envs`` entry, each in its own interpreter (run side by side)."""
    outs, procs = [], []
    for i, extra in enumerate(envs):
        outs.append(out / f"run{i}")
        env = {**os.environ, **extra}
        cmd = [sys.executable, "-c", _TRAIN, str(corpus), str(outs[-1]), params.model_dump_json()]
        procs.append(subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    return outs


def _assert_identical(outs: list[Path]) -> None:
    for name in ("vocab.txt", "tokenizer.json"):
        first = (outs[0] / name).read_bytes()
        for other in outs[1:]:
            if (other / name).read_bytes() != first:
                a, b = read_vocab(outs[0] / "vocab.txt"), read_vocab(other / "vocab.txt")
                diff = [(i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y][:5]
                pytest.fail(
                    f"{name} differs between {outs[0].name} and {other.name}; first vocab diffs {diff}"
                )


#: Different hash seeds (Python's and, per process, the Rust hash maps'), one and two counting threads.
_ENVS = [
    {"PYTHONHASHSEED": "0", "RAYON_NUM_THREADS": "1"},
    {"PYTHONHASHSEED": "1", "RAYON_NUM_THREADS": "2"},
    {"PYTHONHASHSEED": "2", "RAYON_NUM_THREADS": "2"},
]


def test_same_corpus_same_vocab_bytes_across_processes(synthetic_corpus, tmp_path):
    # limit_alphabet below the number of distinct characters: the cut falls between equal counts too.
    params = VocabParams(vocab_size=1200, num_unused=10, limit_alphabet=30, eval_max_sentences=200)
    outs = _train_in_processes(synthetic_corpus, tmp_path, params, _ENVS)
    _assert_identical(outs)
    assert len(read_vocab(outs[0] / "vocab.txt")) == 1200


@pytest.mark.slow
def test_default_profile_vocab_is_reproducible(shared_data, tmp_path):
    """The default profile's corpus and vocab params, trained three times: the same bytes each time."""
    from bert_core.params import load_params

    corpus_params = load_params(REPO_ROOT / "params" / "corpus.yaml", "corpus", CorpusParams)
    build_corpus(corpus_params, tmp_path / "corpus", data_root=shared_data, workers=1)
    params = load_params(REPO_ROOT / "params" / "vocab.yaml", "vocab", VocabParams)
    outs = _train_in_processes(tmp_path / "corpus", tmp_path, params, _ENVS)
    _assert_identical(outs)


def test_the_reference_vocab_is_skipped_at_once_when_the_hub_is_out_of_reach(monkeypatch):
    """Offline (or no network), the released vocab to compare with is skipped in seconds with a warning,
    not after the download task's retries (42 s)."""
    from flows import vocab as vocab_flow

    def download(repo_id):
        raise AssertionError("a download was tried while offline")

    monkeypatch.delenv("BERT_DATA_ROOT", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    warned: list[str] = []
    monkeypatch.setattr(vocab_flow, "_download_reference", download)
    monkeypatch.setattr(vocab_flow.log, "warning", lambda msg, *args: warned.append(msg % args))
    assert vocab_flow.reference_vocab(VocabParams(vocab_size=1000)) is None
    assert warned == [
        "could not fetch google-bert/bert-base-uncased/vocab.txt (HF_HUB_OFFLINE is set); comparison "
        "metrics skipped"
    ]
