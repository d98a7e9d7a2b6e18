"""The registered versions' MLflow Model: a ``pyfunc`` ``PythonModel`` over :class:`Predictor`.

:func:`save_model` writes an MLflow Model directory with the Hugging Face model directory as its
``hf_model`` artifact and the task JSON as ``task``, an exact signature (the kind's input and output
columns, optional columns marked so; fill-mask's ``top_k`` as a param) and an input example.

The model is self-contained: it is an MLflow "model from code" (:mod:`bert_core.serving.model_code`, a
Python file that MLflow runs on load, so loading never unpickles code), it carries the serving part of
``bert_core`` as its ``code/`` directory (:mod:`bert_core.serving.bundle`), and its ``requirements.txt``
pins every package that code imports to the version installed here. It therefore loads and predicts in an
environment built from the MLflow Model alone (``mlflow models serve``, ``mlflow models build-docker``, a
team's own virtual environment), without this repository.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import pandas as pd

from bert_core.kinds.base import ServingInputError

#: Names of the model's artifacts (``<model>/artifacts/<name>``).
HF_ARTIFACT = "hf_model"
TASK_ARTIFACT = "task.json"
#: The models-from-code file MLflow copies into each model and runs on load.
MODEL_CODE = Path(__file__).resolve().with_name("model_code.py")


class BertPyfunc(mlflow.pyfunc.PythonModel):
    """``predict(DataFrame | list of dicts | dict, params)`` -> DataFrame; bad records raise a 400 error."""

    def load_context(self, context: Any) -> None:
        from bert_core.serving.predictor import Predictor

        self.predictor = Predictor(context.artifacts["hf_model"], context.artifacts["task"])

    def check_record(self, record: dict[str, Any]) -> None:
        """Refuse one record as ``predict`` would, without running the model (batch prediction checks every
        row with it before the first prediction).

        Raises:
            ServingInputError: naming the field and what is wrong.
        """
        self.predictor.check_record(record)

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> Any:
        """The rows MLflow hands over after checking them against the signature (always a DataFrame, whatever
        the caller gave). The hint says so: MLflow infers no schema from it (the signature is the schema)
        and, unlike no hint at all, it does not make MLflow warn on every load."""
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

        try:
            return self.predictor.predict(model_input, params)
        except ServingInputError as err:  # the served model answers 400, with this message
            raise MlflowException(str(err)[:2000], error_code=INVALID_PARAMETER_VALUE) from None


def _mlflow_type(kind: str) -> Any:
    from mlflow.types.schema import Array, DataType

    base, depth = kind.rstrip("[]"), kind.count("[]")
    out: Any = DataType[base]
    for _ in range(depth):
        out = Array(out)
    return out


def signature(component: Any, spec: Any, task: dict[str, Any]) -> Any:
    """The exact MLflow signature of a kind's served model."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    def schema(columns: list[tuple[str, str, bool]]) -> Schema:
        return Schema(
            [ColSpec(_mlflow_type(kind), name, required=required) for name, kind, required in columns]
        )

    params = None
    if task["kind"] == "fill_mask":
        params = ParamSchema([ParamSpec("top_k", "long", int(task.get("top_k") or 5))])
    return ModelSignature(
        schema(component.serving_inputs(spec)), schema(component.serving_outputs(spec)), params
    )


#: The distributions the carried code imports (directly, or through transformers' fast tokenizer).
REQUIREMENTS = ("mlflow", "torch", "transformers", "tokenizers", "safetensors", "numpy", "pandas", "xxhash")


def requirements() -> list[str]:
    """Everything the model's code needs, pinned to the versions installed here.

    A local version label is dropped (``torch==2.13.0``, not ``2.13.0+cpu``): the public version matches
    the CPU and the CUDA builds alike, so an environment built from the model gets the build its index
    offers.
    """
    from importlib.metadata import version

    return [f"{name}=={version(name).split('+')[0]}" for name in REQUIREMENTS]


def save_model(path: str | Path, hf_dir: str | Path, task: dict[str, Any]) -> Path:
    """Write the MLflow Model of ``hf_dir`` (a Hugging Face model directory) and its task JSON to ``path``.

    Raises:
        FileNotFoundError: ``hf_dir`` has no ``config.json``.
    """
    from bert_core.serving.task import get_component

    hf_dir, path = Path(hf_dir), Path(path)
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(f"{hf_dir}: not a Hugging Face model directory (no config.json)")
    component = get_component(task["kind"])
    spec = None
    if task["kind"] != "fill_mask":
        from bert_core.tasks import task_from_json

        spec = task_from_json(task)
    from bert_core.serving.bundle import stage_code

    with tempfile.TemporaryDirectory(prefix="pyfunc-") as tmp:
        staged = Path(tmp) / HF_ARTIFACT  # the artifact keeps its directory name: artifacts/hf_model
        shutil.copytree(hf_dir, staged)
        task_file = Path(tmp) / TASK_ARTIFACT
        task_file.write_text(json.dumps(task, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        mlflow.pyfunc.save_model(
            str(path),
            python_model=str(MODEL_CODE),
            code_paths=[str(stage_code(Path(tmp) / "code"))],
            artifacts={"hf_model": str(staged), "task": str(task_file)},
            signature=signature(component, spec, task),
            input_example=component.serving_example(spec),
            pip_requirements=requirements(),
            metadata={"bert_task": task["task"], "bert_kind": task["kind"]},
        )
    return path
