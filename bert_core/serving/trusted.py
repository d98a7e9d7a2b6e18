"""MLflow Models are loaded only as models from code: nothing pickled is ever unpickled.

MLflow loads a ``PythonModel`` saved as an object by unpickling its ``python_model.pkl`` (cloudpickle), and
other flavours' loaders unpickle their own files; unpickling runs whatever code the pickle names, and MLflow
allows it by default (``MLFLOW_ALLOW_PICKLE_DESERIALIZATION``). A version this project registers is a *model
from code* instead (:mod:`bert_core.serving.pyfunc`): its ``MLmodel`` names a Python file (``model_code.py``)
that MLflow runs on load. That is source a reviewer can read, carried with the model; a pickle is an opaque
byte stream, and a replaced one cannot be told from the original by looking at the directory.

So every entry point that loads a model goes through :func:`fetch_model` first: ``python -m flows.predict``
(:func:`load_model`) and ``make serve-model`` (``python -m bert_core.serving.trusted serve``). It resolves the model to local files (a registry or run URI is downloaded once, into a directory
that is then the one loaded, so what was checked is what runs), reads its ``MLmodel`` with a YAML parser
that builds no objects, and refuses it, naming the file, unless:

- the ``python_function`` flavour is there and its ``loader_module`` is MLflow's models-from-code loader
  (:data:`CODE_LOADERS`): any other loader (``mlflow.sklearn``, ``mlflow.pytorch``, a module of the
  directory's choosing) would load the model its own way, pickles included;
- its ``model_code_path`` names a ``.py`` file present in the directory (MLflow runs that file);
- it has no ``python_model`` entry, the pickled ``PythonModel`` of a model saved as an object.

The load then runs with ``MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false`` (:func:`pickle_refused`; ``make
serve-model`` sets it for the server it starts), so MLflow itself would refuse a pickled ``PythonModel``
should a directory get past the check.

What this does not do: a model from code runs its code file on load, as any model from code does; the file is
not compared with the project's own ``model_code.py``, so the toy models of the tests and another project's
models from code load too. The weights a registered version carries are verified against their checksums
when they load (:mod:`bert_core.integrity`). Loading with MLflow directly (``mlflow.pyfunc.load_model``,
``mlflow models serve``) bypasses this check; ``python -m bert_core.serving.trusted check <model>`` runs it
alone.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: MLflow's loaders of a model from code (``mlflow.pyfunc.model``'s loader, which MLflow names for a
#: ``PythonModel``, also runs the code file and unpickles nothing when the flavour has a ``model_code_path``).
CODE_LOADERS = ("mlflow.pyfunc.loaders.code_model", "mlflow.pyfunc.model")
#: MLflow's switch for unpickling a ``PythonModel``; set to ``false`` while a model loads.
PICKLE_ENV = "MLFLOW_ALLOW_PICKLE_DESERIALIZATION"

_WHAT_TO_DO = (
    "only models from code are loaded (their MLmodel names a .py file that MLflow runs; nothing is "
    "unpickled). Register the model again from the pipeline (`dvc repro`), or save yours as a model from code "
    "(mlflow.pyfunc.save_model(python_model='<file>.py')); nothing was loaded"
)


class UntrustedModelError(ValueError):
    """A model directory would load by unpickling (or is not an MLflow Model a model from code can be)."""


class ModelLoadError(ValueError):
    """A model cannot be fetched or loaded (an unknown name or alias, a broken directory)."""


def _refuse(where: str | Path, why: str) -> UntrustedModelError:
    return UntrustedModelError(f"refusing to load {where}: {why}; {_WHAT_TO_DO}")


def check_model_dir(model_dir: str | Path, name: str | None = None) -> Path:
    """Check that the MLflow Model in ``model_dir`` loads as a model from code; return its code file.

    Reads ``MLmodel`` only (``yaml.safe_load``); imports and unpickles nothing. ``name`` is what messages
    call the model (the URI a downloaded copy came from; default: the directory).

    Raises:
        UntrustedModelError: no ``MLmodel``, not YAML, or not a model from code (see the module docstring);
            the message names the file and what it holds instead.
    """
    import yaml

    model_dir = Path(model_dir)
    mlmodel = model_dir / "MLmodel"
    if not mlmodel.is_file():
        raise _refuse(name or model_dir, "it has no MLmodel file, so it is not an MLflow Model")
    where = mlmodel if name is None else f"{name} (its MLmodel)"
    try:
        meta = yaml.safe_load(mlmodel.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise _refuse(where, f"not a valid MLmodel file ({first})") from None
    flavors = meta.get("flavors") if isinstance(meta, dict) else None
    pyfunc = flavors.get("python_function") if isinstance(flavors, dict) else None
    if not isinstance(pyfunc, dict):
        names = sorted(flavors) if isinstance(flavors, dict) else []
        raise _refuse(where, f"it has no python_function flavour (flavours: {names or 'none'})")
    loader = pyfunc.get("loader_module")
    if loader not in CODE_LOADERS:
        raise _refuse(
            where,
            f"its python_function flavour loads with {loader!r}, not MLflow's models-from-code loader "
            f"({CODE_LOADERS[0]}); that loader may unpickle files of the model",
        )
    if "python_model" in pyfunc:
        raise _refuse(
            where,
            f"its python_function flavour holds a pickled PythonModel (python_model: "
            f"{pyfunc['python_model']!r}), which loading would unpickle",
        )
    code = pyfunc.get("model_code_path")
    if not isinstance(code, str) or not code:
        raise _refuse(where, "its python_function flavour names no model code file (model_code_path)")
    code_file = model_dir / Path(code).name  # where MLflow looks for it
    if code_file.suffix != ".py":
        raise _refuse(where, f"its model code file {code_file.name!r} is not a Python source file (.py)")
    if not code_file.is_file():
        raise _refuse(where, f"its model code file {code_file.name!r} is missing")
    return code_file


def fetch_model(model_uri: str, scratch: str | Path) -> Path:
    """The checked local MLflow Model directory of ``model_uri``.

    ``model_uri`` is a local directory (an MLflow Model, checked in place; or a stage's Hugging Face
    directory, whose MLflow Model is written under ``scratch`` the way its stage registers it,
    :mod:`bert_core.serving.local`) or an MLflow URI (``models:/``, ``runs:/``, ...), downloaded under
    ``scratch`` against the current tracking store. Load the returned directory, not ``model_uri``.

    Raises:
        UntrustedModelError: see :func:`check_model_dir`.
        bert_core.serving.local.ModelDirectoryError: a local directory that is no model.
        bert_core.tracking.TrackingUnavailable: an http(s) tracking server that does not answer.
        Exception: what MLflow raises when the URI does not resolve (unknown name, version or alias).
    """
    from bert_core.serving.local import is_local_model, mlflow_model_dir

    if is_local_model(model_uri):
        path = mlflow_model_dir(Path(model_uri.removeprefix("file://")).expanduser(), scratch)
        check_model_dir(path)
    else:
        import mlflow

        from bert_core.tracking import check_tracking_server, tracking_uri

        # seconds, not MLflow's minutes of retries; and no empty store made at a mistyped path
        check_tracking_server(tracking_uri(), reading=True)
        path = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=str(scratch)))
        check_model_dir(path, name=model_uri)
    return path


def load_model(model_uri: str) -> Any:
    """Load ``model_uri`` with ``mlflow.pyfunc.load_model`` after :func:`fetch_model` has checked it, with
    :func:`pickle_refused`. An MLflow URI is resolved against the project's tracking store
    (``MLFLOW_TRACKING_URI``, else the repository's ``mlflow.db``). The fetched copy is removed when the
    returned model is (a model may read its files after loading).

    Raises:
        UntrustedModelError: the model would load by unpickling; nothing was loaded.
        ModelLoadError: the model cannot be fetched or loaded; the message says what to check.
    """
    import shutil
    import weakref

    import mlflow

    from bert_core.serving.local import ModelDirectoryError, is_local_model, is_uri
    from bert_core.tracking.run import TrackingUnavailable, tracking_uri

    local = is_local_model(model_uri)
    if not local and not is_uri(model_uri):  # a path: MLflow would try it as an artifact URI, saying so
        where = Path(model_uri.removeprefix("file://")).expanduser()
        raise ModelLoadError(
            f"model {model_uri!r}: {where} is not a directory. Give an existing model directory (an MLflow "
            "Model, or models/finetuned/<task>, models/pretrained) or a registry URI (models:/<name>@<alias>, "
            "models:/<name>/<version>, runs:/<run id>/model)"
        )
    uri = None if local else tracking_uri()
    if uri is not None:
        mlflow.set_tracking_uri(uri)
    scratch = tempfile.mkdtemp(prefix="load-model-")
    try:
        path = fetch_model(model_uri, scratch)
        with pickle_refused():
            model = mlflow.pyfunc.load_model(str(path))
    except BaseException as err:
        shutil.rmtree(scratch, ignore_errors=True)
        if isinstance(err, UntrustedModelError) or not isinstance(err, Exception):
            raise
        if isinstance(err, ModelDirectoryError | TrackingUnavailable):  # their message says what to do
            raise ModelLoadError(str(err)) from None
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        if local:
            where = str(Path(model_uri.removeprefix("file://")).expanduser())
            raise ModelLoadError(f"cannot load the model directory {where!r}: {first}") from None
        raise ModelLoadError(
            f"cannot load model {model_uri!r} (tracking store {uri}): {first}. Check the name, version or "
            "alias (the MLflow UI, `make ui`, lists the registered models), and MLFLOW_TRACKING_URI; or give "
            "a model directory (an MLflow Model, or models/finetuned/<task>, models/pretrained)"
        ) from None
    weakref.finalize(model, shutil.rmtree, scratch, True)
    return model


@contextlib.contextmanager
def pickle_refused() -> Iterator[None]:
    """``MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false`` for the block (MLflow reads it when a model loads)."""
    before = os.environ.get(PICKLE_ENV)
    os.environ[PICKLE_ENV] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PICKLE_ENV, None)
        else:
            os.environ[PICKLE_ENV] = before


def main(argv: list[str] | None = None) -> int:
    """``python -m bert_core.serving.trusted check <model>``: check a model (exit 0 or 1, one line);
    ``... serve <model> [mlflow models serve options]``: check it, then replace this process with
    ``mlflow models serve -m <the checked directory> <options>`` (``make serve-model``)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bert_core.serving.trusted", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="check that a model loads as a model from code")
    check.add_argument("model", help="models:/<name>@<alias>, runs:/<run>/model or a model directory")
    serve = sub.add_parser("serve", help="check a model, then run `mlflow models serve` on it")
    serve.add_argument("model", help="models:/<name>@<alias>, runs:/<run>/model or a model directory")
    serve.add_argument("mlflow_args", nargs=argparse.REMAINDER, help="options of `mlflow models serve`")
    args = parser.parse_args(argv)

    import shutil

    from bert_core.serving.local import ModelDirectoryError, is_local_model

    if not is_local_model(args.model):
        import mlflow

        from bert_core.tracking.run import tracking_uri

        mlflow.set_tracking_uri(tracking_uri())
    # A registry or run URI is downloaded here and, for `serve`, stays until the temporary directory is
    # cleared, as `mlflow models serve -m models:/...` leaves its own download (the server reads it).
    scratch = tempfile.mkdtemp(prefix=f"{args.command}-model-")
    try:
        path = fetch_model(args.model, scratch)
        code = check_model_dir(path).name
    except Exception as err:
        shutil.rmtree(scratch, ignore_errors=True)
        if isinstance(err, UntrustedModelError | ModelDirectoryError):
            print(f"error: {err}", file=sys.stderr)
        else:  # the URI does not resolve: MLflow's message, first line
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            print(f"error: cannot fetch model {args.model!r}: {first}", file=sys.stderr)
        return 1
    if args.command == "check" or not any(Path(scratch).iterdir()):
        shutil.rmtree(scratch, ignore_errors=True)
    if args.command == "check":
        print(f"{args.model}: a model from code (its MLmodel runs {code}); it loads without unpickling")
        return 0
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", str(path), *args.mlflow_args]
    print(f"{args.model}: checked (a model from code); serving {path}", file=sys.stderr, flush=True)
    os.execve(sys.executable, cmd, {**os.environ, PICKLE_ENV: "false"})
    return 0  # pragma: no cover (execve does not return)


if __name__ == "__main__":
    raise SystemExit(main())
