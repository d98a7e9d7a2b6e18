"""Registered versions are MLflow Models (bert_core.serving): every kind registers, loads back through
``mlflow.pyfunc.load_model("models:/...@champion")`` in a fresh process and answers as in process; the
signature is exact; the HF directory inside still loads with transformers; bad records are refused clearly.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serving_models import REQUESTS, SERVED, alias, register_all, spec_of, task_json

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> tuple[str, dict[str, Path]]:
    """Every served kind registered once in a store of this module: (tracking URI, name -> HF dir)."""
    import mlflow

    root = tmp_path_factory.mktemp("serving")
    uri = f"sqlite:///{root}/mlflow.db"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        dirs = register_all(root)
    finally:
        mlflow.set_tracking_uri(previous)
    return uri, dirs


@pytest.fixture
def store(registry, monkeypatch) -> dict[str, Path]:
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", registry[0])
    mlflow.set_tracking_uri(registry[0])
    return registry[1]


def _requests(task: str) -> list[list[dict]]:
    return [REQUESTS[task], REQUESTS["conll2003_words"]] if task == "conll2003" else [REQUESTS[task]]


FRESH = """
import json, sys
import mlflow
out = {}
for name, uri, requests in json.loads(sys.argv[1]):
    model = mlflow.pyfunc.load_model(uri)
    out[name] = [model.predict(r).to_dict(orient="records") for r in requests]
out["_modules"] = {m: getattr(mod, "__file__", None) for m, mod in sys.modules.items()
                   if m.split(".")[0] in {"bert_core", "flows", "prefect", "dvc", "great_expectations", "datasets"}}
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def fresh_predictions(registry, tmp_path_factory) -> dict[str, list]:
    """Every registered version loaded by its alias in a fresh Python process, outside the repository and
    without it on ``PYTHONPATH`` (offline): ``bert_core`` can only come from the models' own code."""
    import os

    jobs = [(name, f"models:/{name}@{alias(name)}", _requests(task)) for name, task in SERVED.items()]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(MLFLOW_TRACKING_URI=registry[0], HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-c", FRESH, json.dumps(jobs)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path_factory.mktemp("elsewhere"),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return {**json.loads(line[len("RESULT") :]), "_stderr": proc.stderr}


def test_loading_uses_only_the_models_own_code(fresh_predictions):
    """The loaded code is the model's ``code/bert_core`` (not the project's), it imports nothing of the
    pipeline's orchestration, params or data checks, and carries no module it does not load."""
    from bert_core.serving.bundle import SERVING_MODULES

    modules = fresh_predictions["_modules"]
    outside = {m: f for m, f in modules.items() if not m.startswith("bert_core")}
    assert not outside, outside
    foreign = {m: f for m, f in modules.items() if f and "/code/bert_core/" not in f}
    assert not foreign, foreign
    loaded = {f.split("/code/bert_core/")[1] for f in modules.values() if f}
    assert loaded <= set(SERVING_MODULES) | {"finetune/__init__.py"}
    unused = set(SERVING_MODULES) - loaded
    assert not unused, f"carried but never imported: {sorted(unused)}"


def test_loading_says_nothing_about_predicts_type_hints(fresh_predictions):
    """``predict`` has no type hints on purpose (the saved signature is the schema): MLflow's warning that
    it lacks them would greet every user who loads a model."""
    assert "Add type hints" not in fresh_predictions["_stderr"]


def _close(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("name", list(SERVED))
def test_fresh_process_load_matches_in_process(name, store, fresh_predictions):
    from bert_core.serving.predictor import Predictor

    task = SERVED[name]
    predictor = Predictor(store[name], task_json(task))
    expected = [json.loads(predictor.predict(r).to_json(orient="records")) for r in _requests(task)]
    got = fresh_predictions[name]
    assert _close(got, expected), (got, expected)
    assert all(len(rows) == len(r) for rows, r in zip(got, _requests(task)))


def test_answers_have_the_kinds_shape(store):
    import mlflow

    sst2 = mlflow.pyfunc.load_model("models:/bert-sst2@champion").predict(REQUESTS["sst2"])
    assert set(sst2["label"]) <= {"negative", "positive"}
    assert all(abs(sum(p) - 1) < 1e-6 and len(p) == 2 for p in sst2["probabilities"])
    tickets = mlflow.pyfunc.load_model("models:/bert-tickets@champion").predict(REQUESTS["tickets"])
    assert set(tickets["label"]) <= {"billing", "bug", "other"} and all(
        len(p) == 3 for p in tickets["probabilities"]
    )
    squad = mlflow.pyfunc.load_model("models:/bert-squad_v2@champion").predict(REQUESTS["squad_v2"])
    for record, row in zip(REQUESTS["squad_v2"], squad.to_dict(orient="records")):
        if row["answer"]:
            assert record["context"][row["start"] : row["end"]] == row["answer"]
        else:
            assert row["start"] == row["end"] == -1
    ner = mlflow.pyfunc.load_model("models:/bert-conll2003@champion").predict(REQUESTS["conll2003"])
    assert list(ner["words"][0]) == [
        "EU",
        "rejects",
        "German",
        "call",
        "to",
        "boycott",
        "British",
        "lamb",
        ".",
    ]
    for tags in ner["tags"]:  # IOB2: a chunk starts with B-
        assert all(
            not t.startswith("I-") or (p != "O" and p[2:] == t[2:]) for p, t in zip(["O", *tags], tags)
        )
    fill = mlflow.pyfunc.load_model("models:/bert-pretrained@newest")
    out = fill.predict(REQUESTS["fill_mask"], params={"top_k": 3})
    assert [len(t) for t in out["tokens"]] == [1, 2] and all(len(k) == 3 for t in out["tokens"] for k in t)


def test_signature_input_example_and_hf_directory(store, tmp_path):
    import mlflow
    from mlflow.models import Model
    from transformers import (
        AutoModelForMaskedLM,
        AutoModelForQuestionAnswering,
        AutoModelForSequenceClassification,
    )

    from bert_core.kinds import get_kind

    for name, task in SERVED.items():
        local = Path(
            mlflow.artifacts.download_artifacts(
                f"models:/{name}@{alias(name)}", dst_path=str(tmp_path / name)
            )
        )
        meta = Model.load(str(local / "MLmodel"))
        inputs = meta.signature.inputs.to_dict()
        assert meta.saved_input_example_info is not None
        if task != "fill_mask":
            expected = get_kind(spec_of(task)).serving_inputs(spec_of(task))
            assert [(c["name"], c.get("required", True)) for c in inputs] == [(n, r) for n, _, r in expected]
        assert json.loads((local / "artifacts" / "task.json").read_text())["kind"] == task_json(task)["kind"]
        assert (local / "artifacts" / "hf_model" / "config.json").is_file()
    hf = tmp_path / "bert-sst2" / "artifacts" / "hf_model"
    assert AutoModelForSequenceClassification.from_pretrained(hf).config.id2label == {
        0: "negative",
        1: "positive",
    }
    AutoModelForQuestionAnswering.from_pretrained(tmp_path / "bert-squad_v2" / "artifacts" / "hf_model")
    AutoModelForMaskedLM.from_pretrained(tmp_path / "bert-pretrained" / "artifacts" / "hf_model")


def test_registry_source_still_resolves_to_the_hf_directory(store, tmp_path):
    """Fine-tuning from ``models:/bert-pretrained@newest`` reads the HF directory inside the MLflow Model."""
    from bert_core.tracking import fingerprint, resolve_model_source

    resolved = resolve_model_source("models:/bert-pretrained@newest", tmp_path)
    assert resolved.path.name == "hf_model" and (resolved.path / "config.json").is_file()
    assert resolved.info["sha"] == fingerprint(store["bert-pretrained"])


def test_squad_v2_answers_empty_below_its_null_threshold(store):
    from bert_core.serving.predictor import Predictor

    records = REQUESTS["squad_v2"]
    always = Predictor(store["bert-squad_v2"], {**task_json("squad_v2"), "null_threshold": 1e9})
    never = Predictor(store["bert-squad_v2"], {**task_json("squad_v2"), "null_threshold": -1e9})
    assert all(a for a in always.predict(records)["answer"])
    assert list(never.predict(records)["answer"]) == ["", ""]
    assert list(never.predict(records)["start"]) == [-1, -1]


def test_long_context_is_read_with_the_doc_stride(store):
    from bert_core.serving.predictor import Predictor

    predictor = Predictor(store["bert-squad_v2"], {**task_json("squad_v2"), "null_threshold": 1e9})
    context = " ".join(f"sentence {i} about the stadium." for i in range(300))  # ~9,000 characters
    row = predictor.predict([{"question": "Where?", "context": context}]).iloc[0]
    assert row["answer"] and context[row["start"] : row["end"]] == row["answer"]


@pytest.mark.parametrize(
    ("name", "records", "message"),
    [
        ("bert-sst2", [{"sentence": "no text column"}], "missing column(s) ['text']"),
        ("bert-sst2", [{"text": "   "}], "record 0: field 'text' is empty"),
        ("bert-sst2", [{"text": "ok"}, {"text": 3}], "record 1: field 'text' must be a string"),
        ("bert-sst2", [{"text": "x" * 100_001}], "record 0: field 'text' has 100001 characters"),
        ("bert-squad_v2", [{"question": "Why?", "context": "y" * 100_000}], "more than this model accepts"),
        ("bert-squad_v2", [{"question": "Why?"}], "missing column(s) ['context']"),
        ("bert-swag", [{"context": "c", "endings": ["only one"]}], "needs at least 2 endings"),
        ("bert-swag", [{"context": "c", "endings": ["a", ""]}], "field 'endings[1]' is empty"),
        ("bert-conll2003", [{"sentence": "x"}], "none of the columns"),
        ("bert-pretrained", [{"text": "no mask here"}], "has no [MASK]"),
    ],
)
def test_bad_records_are_refused_naming_record_and_field(store, name, records, message):
    from bert_core.kinds.base import ServingInputError
    from bert_core.serving.predictor import Predictor

    predictor = Predictor(store[name], task_json(SERVED[name]))
    with pytest.raises(ServingInputError) as err:
        predictor.predict(records)
    assert message in str(err.value) and len(str(err.value)) < 600


def test_pyfunc_refuses_bad_records_as_invalid_parameter(store):
    import mlflow
    from mlflow.exceptions import MlflowException

    model = mlflow.pyfunc.load_model("models:/bert-pretrained@newest")
    with pytest.raises(MlflowException) as err:
        model.predict([{"text": "no mask"}])
    assert err.value.get_http_status_code() == 400 and "has no [MASK]" in err.value.message
    with pytest.raises(MlflowException) as err:
        model.predict([{"text": "a [MASK]"}], params={"top_k": 0})
    assert err.value.get_http_status_code() == 400 and "top_k" in err.value.message


def test_batches_do_not_change_answers(store):
    """A record gets the same answer alone or in a batch with others (pairs and single texts apart)."""
    from bert_core.serving.predictor import Predictor

    predictor = Predictor(store["bert-sst2"], task_json("sst2"))
    batch = predictor.predict(REQUESTS["sst2"])
    for i, record in enumerate(REQUESTS["sst2"]):
        alone = predictor.predict([record]).iloc[0]
        assert np.allclose(alone["probabilities"], batch.iloc[i]["probabilities"], atol=1e-6)
