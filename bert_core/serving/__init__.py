"""Registered models as MLflow Models: a ``pyfunc`` model that wraps ``bert_core`` (docs/serving.md).

A registered version's ``model`` artifact is an MLflow Model directory::

    MLmodel, model_code.py, requirements.txt, python_env.yaml, input_example.json, ...
    code/bert_core/       the serving part of bert_core (:mod:`~bert_core.serving.bundle`)
    artifacts/hf_model/   the Hugging Face model directory (AutoModelFor*.from_pretrained loads it)
    artifacts/task.json   what serving needs besides the weights (:func:`serving_task`)

- :mod:`~bert_core.serving.task`: the task JSON (task, kind, labels, lengths, SQuAD v2.0 null threshold).
- :mod:`~bert_core.serving.predictor`: :class:`Predictor`, the prediction path (validation, batching, the
  kind's encoding and post-processing); no MLflow needed.
- :mod:`~bert_core.serving.pyfunc`: the ``PythonModel`` and :func:`save_model` (signature, input example,
  pinned requirements); :mod:`~bert_core.serving.model_code`, the models-from-code file that MLflow runs on
  load; :mod:`~bert_core.serving.bundle`, the code a model carries.
- :mod:`~bert_core.serving.local`: a local model directory (MLflow Model, or a stage's Hugging Face directory).
- :mod:`~bert_core.serving.fill_mask`: the pretrained model's fill-mask (the kinds serve the tasks).

Loading: ``mlflow.pyfunc.load_model("models:/bert-sst2@champion").predict(frame)``, in any environment
built from the model's ``requirements.txt`` (the project need not be installed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bert_core.serving.task import SERVING, fill_mask_task, get_component, serving_task


def mlflow_model(task: Mapping[str, Any]) -> Callable[[Path, Path], Path]:
    """``save_model(hf_dir, dest)`` for :func:`bert_core.tracking.register`: writes the MLflow Model of a
    Hugging Face directory with this task JSON (:func:`bert_core.serving.pyfunc.save_model`)."""

    def save(hf_dir: Path, dest: Path) -> Path:
        from bert_core.serving.pyfunc import save_model

        return save_model(dest, hf_dir, dict(task))

    return save


__all__ = ["SERVING", "fill_mask_task", "get_component", "mlflow_model", "serving_task"]
