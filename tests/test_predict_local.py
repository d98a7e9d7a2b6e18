"""``python -m flows.predict`` on a stage's own Hugging Face model directory (``models/finetuned/<task>``,
``models/pretrained``) predicts exactly what the registered version of the same directory predicts; a
directory that names no task is refused with a message that says what to give instead.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serving_models import REQUESTS, build_model, task_json

from bert_core.serving.batch import BatchPredictionError, load_model
from bert_core.serving.local import ModelDirectoryError, hf_task
from flows import predict  # imports Prefect, which configures logging: at collection, not inside a test


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[str, dict[str, Path]]:
    """A fine-tuned directory with its task.json (as the finetune stage writes it) and a pretrained one
    (no task.json: the config's pretraining head says fill-mask), each also registered."""
    import mlflow

    from bert_core.serving import mlflow_model
    from bert_core.tracking import register

    root = tmp_path_factory.mktemp("local-models")
    uri = f"sqlite:///{root}/mlflow.db"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    dirs = {
        "sst2": build_model("sst2", root / "finetuned" / "sst2"),
        "fill_mask": build_model("fill_mask", root / "pretrained"),
    }
    (dirs["sst2"] / "task.json").write_text(json.dumps(task_json("sst2")), encoding="utf-8")
    try:
        mlflow.set_experiment("local-models")
        for task, name, alias in (
            ("sst2", "bert-sst2", "champion"),
            ("fill_mask", "bert-pretrained", "newest"),
        ):
            with mlflow.start_run() as run:
                pass
            register(
                dirs[task],
                name=name,
                run_id=run.info.run_id,
                alias=alias,
                save_model=mlflow_model(task_json(task)),
            )
    finally:
        mlflow.set_tracking_uri(previous)
    return uri, dirs


def _main(monkeypatch, tracking_uri: str, model: str, rows: list[dict], out: Path) -> list[dict]:
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}  # main() installs its own
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setattr(logging.getLogger("bert_core"), "level", logging.getLogger("bert_core").level)
    src = out.with_suffix(".in.jsonl")
    src.write_text("".join(json.dumps({"id": i, **r}) + "\n" for i, r in enumerate(rows)), encoding="utf-8")
    try:
        rc = predict.main(["--model", model, "--input", str(src), "--output", str(out), "--no-prefect"])
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert rc == 0
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize(
    ("task", "uri"), [("sst2", "models:/bert-sst2@champion"), ("fill_mask", "models:/bert-pretrained@newest")]
)
def test_a_stage_directory_predicts_as_its_registered_version(task, uri, models, tmp_path, monkeypatch):
    tracking, dirs = models
    registered = _main(monkeypatch, tracking, uri, REQUESTS[task], tmp_path / "registered.jsonl")
    local = _main(monkeypatch, tracking, str(dirs[task]), REQUESTS[task], tmp_path / "local.jsonl")
    assert local == registered
    assert list(local[0]) == [
        "id",
        *(["label", "score", "probabilities"] if task == "sst2" else ["tokens", "scores"]),
    ]


def test_an_mlflow_model_directory_loads_as_is(models, tmp_path, monkeypatch):
    import mlflow

    tracking, _ = models
    mlflow.set_tracking_uri(tracking)
    local = mlflow.artifacts.download_artifacts("models:/bert-sst2@champion", dst_path=str(tmp_path / "m"))
    registered = _main(
        monkeypatch, tracking, "models:/bert-sst2@champion", REQUESTS["sst2"], tmp_path / "a.jsonl"
    )
    assert _main(monkeypatch, tracking, local, REQUESTS["sst2"], tmp_path / "b.jsonl") == registered


def test_the_task_of_a_directory_comes_from_its_task_json_then_card_then_config(models, tmp_path):
    _, dirs = models
    assert hf_task(dirs["sst2"]) == task_json("sst2")
    assert hf_task(dirs["fill_mask"])["kind"] == "fill_mask"
    card = tmp_path / "card"
    build_model("stsb", card)
    (card / "README.md").write_text(
        "---\nlibrary_name: transformers\ntags: [bert, stsb, regression]\n---\n\n# bert-stsb\n\n"
        "### Params (`params/finetune.yaml`)\n\n```yaml\nmax_seq_length: 64\n```\n",
        encoding="utf-8",
    )
    task = hf_task(card)
    assert (task["task"], task["kind"], task["max_seq_length"]) == ("stsb", "regression", 64)


def test_a_directory_without_a_task_is_refused_clearly(tmp_path):
    bare = build_model("sst2", tmp_path / "bare")
    with pytest.raises(
        ModelDirectoryError, match=r"bare: cannot tell which task .*no task\.json.*finetune stage"
    ):
        hf_task(bare)
    with pytest.raises(BatchPredictionError, match=r"cannot tell which task"):
        load_model(str(bare))
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        BatchPredictionError, match=r"empty: neither an MLflow Model \(no MLmodel file\) nor a Hugging Face"
    ):
        load_model(str(tmp_path / "empty"))


def test_a_stage_directory_exports_as_an_mlflow_model_to_serve(models, tmp_path, capsys):
    import mlflow

    from bert_core.serving import local

    _, dirs = models
    assert local.main([str(dirs["sst2"]), str(tmp_path / "served")]) == 0
    assert "mlflow models serve -m" in capsys.readouterr().out
    exported = mlflow.pyfunc.load_model(str(tmp_path / "served"))
    direct = load_model(str(dirs["sst2"]))
    assert exported.predict(REQUESTS["sst2"]).equals(direct.predict(REQUESTS["sst2"]))
    assert local.main([str(dirs["sst2"]), str(tmp_path / "served")]) == 1
    assert "give a new directory" in capsys.readouterr().err


def test_the_run_forms_model_path_is_relative_to_the_repository():
    from bert_core.constants import REPO_ROOT

    assert predict._model_path("models:/bert-sst2@champion") == "models:/bert-sst2@champion"
    assert predict._model_path("docs") == str(REPO_ROOT / "docs")  # a directory in the repository
    assert predict._model_path("models/finetuned/not-there") == "models/finetuned/not-there"  # load says why
