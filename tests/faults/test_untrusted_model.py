"""A model that would load by unpickling is refused by every entry point that loads one, and its pickle is
never unpickled: ``python -m flows.predict`` (a directory or a registry URI) and ``make serve-model``
(``python -m bert_core.serving.trusted serve``). The project's own registered models (models from code)
still load, predict and serve.

The pickled model is a real MLflow Model saved with a ``PythonModel`` object whose ``python_model.pkl`` is
then replaced by a pickle that creates a sentinel file when it is unpickled (what a tampered or foreign
directory could do with any code): the sentinel must never appear.
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from .conftest import PY, REPO_ROOT, base_env, free_port, run_cmd, wait_http

pytestmark = pytest.mark.faults


class _Sentinel:
    """Unpickling this creates ``path`` (``open(path, "w")``): proof that the pickle ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A SQLite store holding ``bert-sst2@champion`` (this project's model from code) and
    ``evil@champion`` (the pickled model); the pickled directory; the sentinel path."""
    import mlflow
    from mlflow import MlflowClient
    from serving_models import build_model, task_json

    from bert_core.serving import mlflow_model
    from bert_core.tracking import register

    root = tmp_path_factory.mktemp("untrusted")
    sentinel = root / "UNPICKLED"
    evil = root / "evil-model"

    class Echo(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return model_input

    mlflow.pyfunc.save_model(str(evil), python_model=Echo())
    assert (evil / "python_model.pkl").is_file()
    (evil / "python_model.pkl").write_bytes(pickle.dumps(_Sentinel(sentinel)))

    uri = f"sqlite:///{root}/mlflow.db"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        mlflow.set_experiment("untrusted")
        hf = build_model("sst2", root / "finetuned" / "sst2")
        (hf / "task.json").write_text(json.dumps(task_json("sst2")), encoding="utf-8")
        with mlflow.start_run() as run:
            pass
        register(
            hf,
            name="bert-sst2",
            run_id=run.info.run_id,
            alias="champion",
            save_model=mlflow_model(task_json("sst2")),
        )
        with mlflow.start_run() as run:
            mlflow.log_artifacts(str(evil), artifact_path="model")
        version = mlflow.register_model(f"runs:/{run.info.run_id}/model", "evil")
        MlflowClient().set_registered_model_alias("evil", "champion", version.version)
    finally:
        mlflow.set_tracking_uri(previous)
    assert not sentinel.exists()
    runs_uri = f"runs:/{run.info.run_id}/model"
    return {"uri": uri, "root": root, "evil": evil, "sentinel": sentinel, "hf": hf, "runs_uri": runs_uri}


def _predict(store, tmp_path: Path, model: str, **env: str) -> subprocess.CompletedProcess:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": 1, "text": "a fine film"}) + "\n", encoding="utf-8")
    cmd = [PY, "-m", "flows.predict", "--no-prefect", "--model", model]
    cmd += ["--input", str(src), "--output", str(tmp_path / "out.jsonl")]
    return run_cmd(cmd, cwd=tmp_path, env=base_env(MLFLOW_TRACKING_URI=store["uri"], **env), timeout=300)


def _refused(res: subprocess.CompletedProcess, store, prefix: str) -> None:
    assert res.returncode == 1, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{prefix}refusing to load "), res.stderr[-3000:]
    assert "MLmodel): its python_function flavour holds a pickled PythonModel (python_model: " in last or (
        "/MLmodel: its python_function flavour holds a pickled PythonModel (python_model: " in last
    )
    assert "Traceback" not in res.stderr
    assert not store["sentinel"].exists(), "the pickle was unpickled"


@pytest.mark.parametrize("allow", ["", "true"], ids=["default", "pickles allowed in the environment"])
def test_predict_refuses_a_pickled_model_directory_without_unpickling_it(store, tmp_path, allow):
    env = {"MLFLOW_ALLOW_PICKLE_DESERIALIZATION": allow} if allow else {}
    res = _predict(store, tmp_path, str(store["evil"]), **env)
    _refused(res, store, "predict failed: UntrustedModelError: ")
    assert f"refusing to load {store['evil']}/MLmodel" in res.stderr
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("uri", ["models:/evil@champion", "runs"], ids=["registered version", "run artifact"])
def test_predict_refuses_a_registered_or_logged_pickled_model(store, tmp_path, uri):
    """The URI is downloaded first; the downloaded copy is what is checked (and would be loaded)."""
    uri = store["runs_uri"] if uri == "runs" else uri
    res = _predict(store, tmp_path, uri)
    _refused(res, store, "predict failed: UntrustedModelError: ")
    assert f"refusing to load {uri} (its MLmodel): its python_function flavour" in res.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_serve_model_refuses_a_pickled_model_before_serving(store, tmp_path):
    port = free_port()
    for model in (str(store["evil"]), "models:/evil@champion"):
        cmd = [PY, "-m", "bert_core.serving.trusted", "serve", model]
        cmd += ["--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]
        res = run_cmd(cmd, cwd=tmp_path, env=base_env(MLFLOW_TRACKING_URI=store["uri"]), timeout=120)
        _refused(res, store, "error: ")


def test_make_serve_model_goes_through_the_check():
    """The recipe runs the checking wrapper, never ``mlflow models serve`` on the URI directly."""
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\nserve-model:", 1)[1].split("\n\n", 1)[0]
    assert "-m bert_core.serving.trusted serve" in recipe and '"$(MODEL_URI)"' in recipe
    assert "mlflow models serve" not in recipe


def _edited(store, tmp_path: Path, edit) -> Path:
    """A copy of the project's own MLflow Model with its MLmodel changed by ``edit(meta, dir)``."""
    import mlflow

    mlflow.set_tracking_uri(store["uri"])
    model = Path(
        mlflow.artifacts.download_artifacts("models:/bert-sst2@champion", dst_path=str(tmp_path / "m"))
    )
    meta = yaml.safe_load((model / "MLmodel").read_text())
    edit(meta["flavors"]["python_function"], model)
    (model / "MLmodel").write_text(yaml.safe_dump(meta))
    return model


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda f, d: f.update(loader_module="mlflow.sklearn"), "loads with 'mlflow.sklearn', not MLflow's"),
        (lambda f, d: f.update(python_model="python_model.pkl"), "holds a pickled PythonModel"),
        (lambda f, d: f.update(model_code_path="model.pkl"), "'model.pkl' is not a Python source file"),
        (lambda f, d: (d / "model_code.py").unlink(), "model_code.py' is missing"),
        (lambda f, d: f.pop("model_code_path"), "names no model code file"),
    ],
    ids=[
        "another loader",
        "a python_model entry",
        "a code file that is no .py",
        "no code file",
        "no code path",
    ],
)
def test_every_way_out_of_models_from_code_is_refused(store, tmp_path, edit, message):
    from bert_core.serving.trusted import UntrustedModelError, check_model_dir

    model = _edited(store, tmp_path, edit)
    with pytest.raises(UntrustedModelError, match=rf"refusing to load {model}/MLmodel: .*{message}"):
        check_model_dir(model)
    with pytest.raises(UntrustedModelError, match="it has no MLmodel file"):
        check_model_dir(store["hf"].parent)


def test_the_projects_own_model_loads_from_the_registry_and_from_a_directory(store, tmp_path):
    import mlflow

    (tmp_path / "a").mkdir()
    by_uri = _predict(store, tmp_path / "a", "models:/bert-sst2@champion")
    assert by_uri.returncode == 0, by_uri.stderr[-3000:]
    mlflow.set_tracking_uri(store["uri"])
    local = mlflow.artifacts.download_artifacts("models:/bert-sst2@champion", dst_path=str(tmp_path / "m"))
    (tmp_path / "b").mkdir()
    by_dir = _predict(store, tmp_path / "b", local)
    assert by_dir.returncode == 0, by_dir.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "a" / "out.jsonl").read_text().splitlines()]
    assert rows == [json.loads(line) for line in (tmp_path / "b" / "out.jsonl").read_text().splitlines()]
    assert rows[0]["id"] == 1 and rows[0]["label"] in ("negative", "positive")
    check = run_cmd(
        [PY, "-m", "bert_core.serving.trusted", "check", "models:/bert-sst2@champion"],
        cwd=tmp_path,
        env=base_env(MLFLOW_TRACKING_URI=store["uri"]),
        timeout=120,
    )
    assert check.returncode == 0 and "a model from code (its MLmodel runs model_code.py)" in check.stdout, (
        check.stderr
    )


def test_serve_model_serves_the_projects_own_model(store, tmp_path, procs):
    """``make serve-model``'s command on the registered model: checked, then served; answers a request."""
    port = free_port()
    log = tmp_path / "serve.log"
    cmd = [PY, "-m", "bert_core.serving.trusted", "serve", "models:/bert-sst2@champion"]
    cmd += ["--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]
    proc = procs.start(cmd, log=log, cwd=tmp_path, env=base_env(MLFLOW_TRACKING_URI=store["uri"]))
    wait_http(f"http://127.0.0.1:{port}/ping", timeout_s=240, proc=proc, log=log)
    body = json.dumps({"dataframe_records": [{"text": "a gripping film"}]}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        answer = json.loads(resp.read())
    assert resp.status == 200 and answer["predictions"][0]["label"] in ("negative", "positive"), answer
    served = log.read_text().split("checked (a model from code); serving ", 1)[1].split("\n", 1)[0]
    procs.kill_all()
    shutil.rmtree(served)  # the download the server read (kept by design while it serves)
