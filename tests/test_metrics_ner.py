"""NER scores agree with conlleval (the CoNLL Perl script, version 2004-01-26).

The pinned counts are what ``perl conlleval < file`` printed for the same inputs ("processed N tokens with
G phrases; found: P phrases; correct: C" and the per-type lines).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bert_core.metrics import ConllFormatError, conll_file_metrics, ner_metrics, read_conll_eval_file

# IOB1 gold (like eng.*) against IOB2 predictions, with a -DOCSTART- line and a -X- boundary line.
HAND_CASE = """\
-DOCSTART- -X- O O O

U.N. NNP I-NP I-ORG B-ORG
official NN I-NP O O
Ekeus NNP I-NP I-PER B-PER
heads VBZ I-VP O O
for IN I-PP O O
Baghdad NNP I-NP I-LOC B-LOC
. . O O O

Peter NNP I-NP I-PER B-PER
Blackburn NNP I-NP I-PER B-PER
met VBD I-VP O O
Paul NNP I-NP I-PER B-PER
and CC O O O
Mary NNP I-NP B-PER I-PER
in IN I-PP O O
New NNP I-NP I-LOC B-LOC
York NNP I-NP I-LOC I-ORG
-X- -X- -X- O O
European JJ I-NP I-MISC B-MISC
Commission NNP I-NP I-ORG I-ORG
said VBD I-VP O O
Germany NNP I-NP I-LOC I-LOC
German JJ I-NP B-LOC B-MISC
"""
# conlleval: processed 22 tokens with 11 phrases; found: 13 phrases; correct: 8. accuracy: 50.00%
HAND_TOTALS = (22, 11, 13, 8)
HAND_PER_TYPE = {
    "LOC": (2, 4, 3),
    "MISC": (1, 1, 2),
    "ORG": (2, 2, 3),
    "PER": (3, 4, 5),
}  # correct, gold, found
HAND_PRF = (61.54, 72.73, 66.67)


def _counts(m):
    return (m["n_tokens"], m["n_gold"], m["n_pred"], m["n_correct"])


def _per_type(m):
    return {t: (v["n_correct"], v["n_gold"], v["n_pred"]) for t, v in m["per_type"].items()}


def test_hand_case_matches_conlleval(tmp_path):
    path = tmp_path / "hand.txt"
    path.write_text(HAND_CASE)
    m = conll_file_metrics(path)
    assert _counts(m) == HAND_TOTALS
    assert _per_type(m) == HAND_PER_TYPE
    assert (m["precision"], m["recall"], m["f1"]) == pytest.approx(HAND_PRF, abs=0.005)
    assert m["accuracy"] == pytest.approx(50.0)
    assert m["per_type"]["LOC"]["f1"] == pytest.approx(57.14, abs=0.005)
    assert m["precision"] == 100 * 8 / 13 and m["recall"] == 100 * 8 / 11


def _random_case(seed=2024):
    rng = random.Random(seed)
    tags = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG", "B-MISC-X", "I-MISC-X"]
    gold, pred = [], []
    for _ in range(20):
        n = rng.randint(1, 15)
        gold.append([rng.choice(tags) for _ in range(n)])
        pred.append([rng.choice(tags) for _ in range(n)])
    return gold, pred


def test_random_tag_soup_matches_conlleval():
    # Ill-formed sequences (I- after another type, B- after I- ...) and a type with a hyphen.
    m = ner_metrics(*_random_case())
    assert _counts(m) == (170, 123, 107, 22)
    assert _per_type(m) == {"LOC": (7, 35, 28), "MISC-X": (5, 32, 34), "ORG": (1, 16, 12), "PER": (9, 40, 33)}
    assert m["accuracy"] == pytest.approx(15.88, abs=0.005)


def _testb_eval_file(shared_data: Path, out: Path, perturb: bool) -> Path:
    """eng.testb gold (IOB1) against the IOB2 copy's tags as predictions, optionally perturbed."""
    gold = (shared_data / "conll2003" / "eng.testb").read_text().split("\n")
    iob2 = (shared_data / "conll2003" / "iob2" / "test.txt").read_text().split("\n")
    lines, j = [], 0
    for g, p in zip(gold, iob2):
        if not g:
            lines.append("")
            continue
        g, p = g.split(" "), p.split(" ")
        pred = p[3]
        if g[0] != "-DOCSTART-":
            j += 1
            if perturb and j % 11 == 0:
                pred = "O" if pred != "O" else "I-MISC"
            elif perturb and j % 13 == 0 and pred != "O":
                pred = pred[:2] + "PER"
        lines.append(f"{g[0]} {g[3]} {pred}")
    out.write_text("\n".join(lines))
    return out


def test_iob1_gold_and_its_iob2_conversion_have_the_same_entities(shared_data, tmp_path):
    m = conll_file_metrics(_testb_eval_file(shared_data, tmp_path / "same.txt", perturb=False))
    assert m["n_gold"] == m["n_pred"] == m["n_correct"] == 5648
    assert m["f1"] == 100.0


def test_perturbed_test_set_matches_conlleval(shared_data, tmp_path):
    m = conll_file_metrics(_testb_eval_file(shared_data, tmp_path / "perturbed.txt", perturb=True))
    # conlleval: processed 46666 tokens with 5648 phrases; found: 8967 phrases; correct: 4495.
    assert _counts(m) == (46666, 5648, 8967, 4495)
    assert _per_type(m) == {
        "LOC": (1342, 1668, 1417),
        "MISC": (497, 702, 4057),
        "ORG": (1257, 1661, 1518),
        "PER": (1399, 1617, 1975),
    }
    assert (m["precision"], m["recall"], m["f1"], m["accuracy"]) == pytest.approx(
        (50.13, 79.59, 61.51, 79.79), abs=0.005
    )


def test_no_entities_gives_zeros_not_errors():
    m = ner_metrics([["O", "O"]], [["O", "O"]])
    assert (m["precision"], m["recall"], m["f1"], m["per_type"]) == (0.0, 0.0, 0.0, {})
    assert m["accuracy"] == 100.0


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 gold sentences but 1"):
        ner_metrics([["O"], ["O"]], [["O"]])
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1"):
        ner_metrics([["O", "O"]], [["O"]])


def test_bad_eval_file_lines_name_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("EU B-ORG B-ORG\nrejects O\n")
    with pytest.raises(
        ConllFormatError, match=r"bad\.txt:2: expected a token followed by gold and predicted"
    ):
        read_conll_eval_file(path)
    path.write_text("EU NNP B-ORG B-ORG\nrejects O O\n")
    with pytest.raises(ConllFormatError, match=r"bad\.txt:2: 3 fields but earlier lines have 4"):
        read_conll_eval_file(path)
    with pytest.raises(ConllFormatError, match="no such file"):
        read_conll_eval_file(tmp_path / "absent.txt")
