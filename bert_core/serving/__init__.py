"""Registered models as MLflow Models: a ``pyfunc`` model that wraps ``bert_core`` (docs/serving.md).

A registered version's ``model`` artifact is an MLflow Model directory::

    MLmodel, python_model.pkl, requirements.txt, input_example.json, serving_input_example.json, ...
    artifacts/hf_model/   the Hugging Face model directory (AutoModelFor*.from_pretrained loads it)
    artifacts/task.json   what serving needs besides the weights (:func:`serving_task`)

- :mod:`~bert_core.serving.task`: the task JSON (task, kind, labels, lengths, SQuAD v2.0 null threshold).
- :mod:`~bert_core.serving.predictor`: :class:`Predictor`, the prediction path (validation, batching, the
  kind's encoding and post-processing); no MLflow needed.
- :mod:`~bert_core.serving.pyfunc`: the ``PythonModel`` and :func:`save_model` (signature, input example).
- :mod:`~bert_core.serving.fill_mask`: the pretrained model's fill-mask (the kinds serve the tasks).

Loading: ``mlflow.pyfunc.load_model("models:/bert-sst2@champion").predict(frame)``.
"""

from __future__ import annotations

from bert_core.serving.task import SERVING, fill_mask_task, get_component, serving_task

__all__ = ["SERVING", "fill_mask_task", "get_component", "serving_task"]
