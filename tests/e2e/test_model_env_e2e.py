"""A registered model loads and predicts in an environment built only from what its MLflow Model declares.

A virtual environment outside the repository gets the model's own ``requirements.txt`` (pip, with the
machine's usual index and wheels) and nothing of this project. In it, with ``MLFLOW_TRACKING_URI`` set,
``mlflow.pyfunc.load_model("models:/<name>@<alias>")`` loads every kind and the pretrained fill-mask model
and predicts what the project's own environment predicts. The same environment fails to load a copy of a
model without its ``code/`` directory: the carried code is what makes it load. ``mlflow models
generate-dockerfile`` writes a Dockerfile that installs only MLflow and the model's declared requirements.

The environment is cached by the hash of the requirements and the Python version under
``$BERT_MODEL_ENV_CACHE`` (default ``~/.cache/bert-pipeline/model-envs``): the first run builds it (pip
resolving MLflow's dependencies takes minutes), later runs reuse it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from serving_models import REQUESTS, SERVED, alias, register_all

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1200
LOAD_TIMEOUT_S = 300

LOAD = """
import json, sys
import mlflow
out = {}
for name, uri, requests in json.loads(sys.argv[1]):
    model = mlflow.pyfunc.load_model(uri)
    out[name] = [model.predict(r).to_dict(orient="records") for r in requests]
import bert_core
out["_bert_core"] = bert_core.__file__
print("RESULT" + json.dumps(out))
"""


def _requests(task: str) -> list[list[dict]]:
    return [REQUESTS[task], REQUESTS["conll2003_words"]] if task == "conll2003" else [REQUESTS[task]]


def _jobs() -> list[tuple[str, str, list]]:
    return [(name, f"models:/{name}@{alias(name)}", _requests(task)) for name, task in SERVED.items()]


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a process that knows nothing of this repository or its virtual environment."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env.update(HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true", **extra)
    return env


def _close(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[str, Path]:
    """(tracking URI, root): every served kind registered in a fresh store."""
    import mlflow

    root = tmp_path_factory.mktemp("model-env")
    uri = f"sqlite:///{root}/mlflow.db"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        register_all(root / "hf")
    finally:
        mlflow.set_tracking_uri(previous)
    return uri, root


@pytest.fixture(scope="module")
def requirements(store) -> str:
    """The one ``requirements.txt`` every registered version declares."""
    import mlflow

    uri, root = store
    mlflow.set_tracking_uri(uri)
    texts = set()
    for name, _, _ in _jobs():
        model_dir = mlflow.artifacts.download_artifacts(
            f"models:/{name}@{alias(name)}", dst_path=str(root / "download" / name)
        )
        texts.add((Path(model_dir) / "requirements.txt").read_text(encoding="utf-8"))
    assert len(texts) == 1, texts
    return texts.pop()


@pytest.fixture(scope="module")
def model_python(requirements) -> Path:
    """The Python of a virtual environment holding exactly the models' requirements (cached, see above)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    key = hashlib.sha256(f"{version}\n{requirements}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("BERT_MODEL_ENV_CACHE") or Path.home() / ".cache/bert-pipeline/model-envs")
    venv = cache / key
    python = venv / "bin" / "python"
    if not (venv / "built.json").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f"{key}.building-", dir=cache))
        try:
            started = time.monotonic()
            subprocess.run([sys.executable, "-m", "venv", str(building)], check=True, timeout=300)
            (building / "requirements.txt").write_text(requirements, encoding="utf-8")
            proc = subprocess.run(
                [str(building / "bin" / "python"), "-m", "pip", "install", "-q", "-r", "requirements.txt"],
                cwd=building,
                env=_clean_env(),
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            seconds = round(time.monotonic() - started, 1)
            (building / "built.json").write_text(json.dumps({"seconds": seconds}), encoding="utf-8")
            # Renamed into place whole (a killed build leaves no half environment; a concurrent build that
            # finished first wins and this one is dropped); only ``bin/python -m ...`` is used, which does
            # not depend on the directory's name.
            with contextlib.suppress(OSError):
                os.replace(building, venv)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return python


def _run(python: Path, code: str, *args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=LOAD_TIMEOUT_S,
    )


def test_the_environment_has_nothing_of_the_project(model_python, tmp_path, record_property):
    built = json.loads((model_python.parents[1] / "built.json").read_text(encoding="utf-8"))
    record_property("model_env_build_seconds", built["seconds"])  # the first build's, reused since
    print(f"model environment {model_python.parents[1]} built in {built['seconds']} s")
    proc = _run(model_python, "import bert_core", cwd=tmp_path, env=_clean_env())
    assert proc.returncode != 0 and "No module named 'bert_core'" in proc.stderr
    for package in ("prefect", "dvc", "great_expectations", "datasets"):
        proc = _run(model_python, f"import {package}", cwd=tmp_path, env=_clean_env())
        assert proc.returncode != 0, f"{package} is installed in the model's environment"


def test_every_registered_model_predicts_as_in_the_project(store, model_python, tmp_path):
    import mlflow

    uri, _ = store
    mlflow.set_tracking_uri(uri)
    expected = {}
    for name, model_uri, requests in _jobs():
        model = mlflow.pyfunc.load_model(model_uri)
        expected[name] = [model.predict(r).to_dict(orient="records") for r in requests]
    expected = json.loads(json.dumps(expected, default=lambda v: v.tolist()))
    proc = _run(
        model_python, LOAD, json.dumps(_jobs()), cwd=tmp_path, env=_clean_env(MLFLOW_TRACKING_URI=uri)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))[len("RESULT") :])
    assert "/code/bert_core/" in got.pop("_bert_core")
    for name in expected:
        assert _close(got[name], expected[name]), (name, got[name], expected[name])


def test_a_model_without_its_code_does_not_load(store, requirements, model_python, tmp_path):
    """The control: the same model directory less its ``code/`` fails where the complete one loads."""
    _, root = store
    complete = root / "download" / "bert-sst2"
    stripped = tmp_path / "bert-sst2-without-code"
    shutil.copytree(complete, stripped, ignore=shutil.ignore_patterns("code"))
    load = "import sys, mlflow; mlflow.pyfunc.load_model(sys.argv[1]); print('LOADED')"
    ok = _run(model_python, load, str(complete), cwd=tmp_path, env=_clean_env())
    assert ok.returncode == 0 and "LOADED" in ok.stdout, ok.stderr[-3000:]
    bad = _run(model_python, load, str(stripped), cwd=tmp_path, env=_clean_env())
    assert bad.returncode != 0 and "No module named 'bert_core'" in bad.stderr, bad.stderr[-3000:]


def test_the_generated_dockerfile_installs_only_what_the_model_declares(store, model_python, tmp_path):
    uri, _ = store
    out = tmp_path / "docker"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlflow",
            "models",
            "generate-dockerfile",
            "-m",
            "models:/bert-sst2@champion",
            "-d",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_clean_env(MLFLOW_TRACKING_URI=uri),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    dockerfile = (out / "Dockerfile").read_text(encoding="utf-8")
    copies = [line.split()[1] for line in dockerfile.splitlines() if line.startswith(("COPY", "ADD"))]
    assert copies == ["model_dir"], dockerfile
    pips = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert all(p.strip().startswith("RUN pip install mlflow==") for p in pips), pips
    assert "_install_pyfunc_deps('/opt/ml/model'" in dockerfile  # the model's own requirements
    for word in ("bert_core", "bert-pipeline", "prefect", str(REPO)):
        assert word not in dockerfile
    context = out / "model_dir"
    assert (context / "code" / "bert_core" / "serving" / "predictor.py").is_file()
    assert "import cloudpickle" not in (context / "model_code.py").read_text(encoding="utf-8")
    assert not (context / "python_model.pkl").exists()  # a model from code: loading unpickles nothing
    load = (
        "import sys, mlflow; m = mlflow.pyfunc.load_model(sys.argv[1]); print(m.predict([{'text': 'fine.'}]))"
    )
    ran = _run(model_python, load, str(context), cwd=tmp_path, env=_clean_env())
    assert ran.returncode == 0 and "label" in ran.stdout, ran.stderr[-3000:]
