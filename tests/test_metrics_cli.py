"""``python -m bert_core.metrics``: prints official scores as JSON; bad input names the file and exits 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bert_core.constants import REPO_ROOT as REPO
from bert_core.metrics.__main__ import main

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"


def _run(capsys, *argv: str) -> tuple[int, dict | None, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, (json.loads(out.out) if code == 0 else None), out.err


def test_module_entry_point_scores_squad_v11(shared_data):
    squad = shared_data / "squad"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bert_core.metrics",
            "squad",
            str(squad / "dev-v1.1.json"),
            str(squad / "leaderboard_predictions" / "v1.1" / "logistic_regression_stanford.json"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["exact_match"] == pytest.approx(40.14191106906339, abs=1e-9)
    assert out["f1"] == pytest.approx(50.98153647324461, abs=1e-9)
    assert "13 unanswered question(s) will receive score 0" in proc.stderr


def test_squad_v20_with_na_probs(capsys):
    sq = FIXTURES / "squad"
    code, out, _ = _run(
        capsys,
        "squad",
        str(sq / "dev-v2.0.json"),
        str(sq / "predictions-v2.0.json"),
        "--na-prob-file",
        str(sq / "na-probs-v2.0.json"),
    )
    assert code == 0
    assert {"exact_match", "f1", "HasAns_f1", "NoAns_f1", "best_f1", "best_f1_thresh"} <= set(out)
    assert out["best_f1"] == pytest.approx(64.68253968253968, abs=1e-9)


def test_conll_file(capsys, tmp_path):
    path = tmp_path / "pred.txt"
    path.write_text("EU B-ORG B-ORG\nrejects O O\nGerman B-MISC B-LOC\n\nPeter B-PER B-PER\n")
    code, out, _ = _run(capsys, "conll", str(path))
    assert code == 0
    assert out["n_gold"] == 3 and out["n_correct"] == 2
    assert set(out["per_type"]) == {"LOC", "MISC", "ORG", "PER"}


def test_glue_dev_file(capsys, shared_data, tmp_path):
    gold = shared_data / "glue" / "MRPC" / "dev.tsv"
    labels = [line.split("\t")[0] for line in gold.read_text(encoding="utf-8-sig").splitlines()[1:]]
    pred = tmp_path / "MRPC.tsv"
    pred.write_text("index\tprediction\n" + "".join(f"{i}\t{lab}\n" for i, lab in enumerate(labels)))
    code, out, _ = _run(capsys, "glue", "mrpc", str(gold), str(pred))
    assert code == 0 and out == {"f1": 100.0, "accuracy": 100.0, "total": 408}
    pred.write_text("index\tprediction\n0\tyes\n")
    code, _, err = _run(capsys, "glue", "mrpc", str(gold), str(pred))
    assert code == 2 and "MRPC.tsv:2: unknown label 'yes'" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"data": [', "predictions file is not valid JSON"),
        ('["France"]', "must be a JSON object mapping question id -> answer text"),
        ('{"56ddde6b9a695914005b9628": 3}', "must be a JSON object mapping question id -> answer text"),
    ],
)
def test_bad_squad_predictions(capsys, tmp_path, content, message):
    pred = tmp_path / "pred.json"
    pred.write_text(content)
    code, _, err = _run(capsys, "squad", str(FIXTURES / "squad" / "dev-v2.0.json"), str(pred))
    assert code == 2 and str(pred) in err and message in err


def test_missing_and_malformed_dataset(capsys, tmp_path):
    code, _, err = _run(capsys, "squad", str(tmp_path / "nope.json"), str(tmp_path / "p.json"))
    assert code == 2 and "nope.json: no such dataset file" in err
    bad = tmp_path / "dev.json"
    bad.write_text('{"version": "1.1"}')
    pred = tmp_path / "p.json"
    pred.write_text("{}")
    code, _, err = _run(capsys, "squad", str(bad), str(pred))
    assert code == 2 and "expected an object with a 'data' list" in err


def test_na_probs_on_a_v11_dataset_is_refused(capsys, shared_data, tmp_path):
    na = tmp_path / "na.json"
    na.write_text("{}")
    pred = tmp_path / "p.json"
    pred.write_text("{}")
    code, _, err = _run(
        capsys, "squad", str(shared_data / "squad" / "dev-v1.1.json"), str(pred), "-n", str(na)
    )
    assert code == 2 and "v2.0 datasets only" in err


def test_bad_conll_file(capsys, tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("a O O\nb O\n")
    code, _, err = _run(capsys, "conll", str(path))
    assert code == 2 and "x.txt:2:" in err
