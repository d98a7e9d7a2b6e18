"""The prediction path of a served model: validate the request's records, run the kind's encoding, the
model (length-sorted, dynamically padded batches, no autograd) and the kind's post-processing.

:class:`Predictor` needs no MLflow: the ``pyfunc`` model (:mod:`bert_core.serving.pyfunc`) wraps it, and
the benchmark (``bench/bench_predict.py``) times it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_core.kinds.base import ServingInputError
from bert_core.serving.task import DEFAULT_MAX_TEXT_CHARS, get_component

#: Overrides the device (``cpu``, ``cuda``, ``cuda:1``); default: CUDA when available.
DEVICE_ENV = "BERT_SERVING_DEVICE"


@dataclass(frozen=True)
class ServingSettings:
    """The :class:`bert_core.kinds.base.KindSettings` a served model was fine-tuned with."""

    max_seq_length: int | None = None
    doc_stride: int = 128
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30


class NonFiniteOutputError(ValueError):
    """The model produced NaN or infinite outputs: its weights are damaged; no prediction is returned."""


class _Checked(Exception):
    """Raised by :meth:`Predictor.check_record`'s stand-in for the model: the record passed every check."""


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


class Predictor:
    """A served model: its Hugging Face directory and task JSON (:func:`bert_core.serving.serving_task`).

    Args:
        hf_dir: The Hugging Face model directory (weights, config, tokenizer).
        task: The task JSON (a dict, or the path of ``task.json``).
        device: Default: ``$BERT_SERVING_DEVICE``, else CUDA when available, else CPU.
    """

    def __init__(
        self, hf_dir: str | Path, task: Mapping[str, Any] | str | Path, *, device: str | None = None
    ):
        import torch

        from bert_core.finetune.inference import load_tokenizer

        if not isinstance(task, Mapping):
            task = json.loads(Path(task).read_text(encoding="utf-8"))
        self.task = dict(task)
        self.component = get_component(self.task["kind"])
        if self.task["kind"] == "fill_mask":
            self.spec = None
        else:
            from bert_core.tasks import task_from_json

            self.spec = task_from_json(self.task)
        fields = ServingSettings.__dataclass_fields__
        self.settings = ServingSettings(**{k: v for k, v in self.task.items() if k in fields})
        self.max_text_chars = int(self.task.get("max_text_chars") or DEFAULT_MAX_TEXT_CHARS)
        self.batch_size = int(self.task.get("batch_size") or 32)
        self.inputs = self.component.serving_inputs(self.spec)
        self.outputs = self.component.serving_outputs(self.spec)
        device = device or os.environ.get(DEVICE_ENV) or ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(device)
        self.hf_dir = Path(hf_dir)
        self.model = self.component.model_class.from_pretrained(hf_dir)
        self.model.eval().to(self.device)
        longest = int(getattr(self.model.config, "max_position_embeddings", 512))
        if not self.settings.max_seq_length or self.settings.max_seq_length > longest:
            self.settings = ServingSettings(**{**self.settings.__dict__, "max_seq_length": longest})
        self.tokenizer = load_tokenizer(hf_dir, self.model.config.vocab_size)

    def _run(self, features: list[dict[str, Any]]) -> list[Any]:
        """The model's outputs per feature; refused when any is NaN or infinite.

        Raises:
            NonFiniteOutputError: naming the model directory: a NaN logit would otherwise become a label
                (argmax of NaN is 0) with a null score.
        """
        import numpy as np
        import torch

        from bert_core.finetune.inference import predict

        with torch.inference_mode():
            outputs = predict(self.model, features, batch_size=self.batch_size, device=self.device)
        bad = next((i for i, out in enumerate(outputs) if not np.isfinite(out).all()), None)
        if bad is not None:
            raise NonFiniteOutputError(
                f"model {self.hf_dir} produced NaN or infinite outputs (first for input feature {bad}); its "
                "weights are damaged. Check it with `python -m flows.checkpoints check "
                f"{self.hf_dir}`, then restore it (`dvc checkout` / `dvc pull`) or register it again"
            )
        return outputs

    # -- input
    def records(self, data: Any) -> list[dict[str, Any]]:
        """Validated records from a pandas DataFrame, a list of dicts or one dict.

        Raises:
            ServingInputError: a missing required column, an empty or over-long text, a value of the wrong
                type; the message names the record (0-based) and the field.
        """
        import pandas as pd

        if isinstance(data, pd.DataFrame):
            columns = [str(c) for c in data.columns]
            rows = [dict(zip(columns, values)) for values in zip(*(data[c].tolist() for c in data.columns))]
            rows = rows if columns else [{} for _ in range(len(data))]
        elif isinstance(data, Mapping):
            rows = [dict(data)]
        elif isinstance(data, list | tuple) and all(isinstance(r, Mapping) for r in data):
            rows = [dict(r) for r in data]
        else:
            raise ServingInputError(
                f"expected a table with the columns {self._column_names()} (a pandas DataFrame, a list of "
                f"records or one record), got {type(data).__name__}"
            )
        if not rows:  # also what MLflow's schema check leaves of a table of none of our (optional) columns
            raise ServingInputError(
                f"no records: give at least one record with the columns {self._column_names()}"
            )
        names = [name for name, _, _ in self.inputs]
        present = set().union(*(r.keys() for r in rows))
        missing = [name for name, _, required in self.inputs if required and name not in present]
        if missing:
            raise ServingInputError(
                f"missing column(s) {missing}; this model reads {self._column_names()}, got "
                f"{sorted(map(str, present))[:20]}"
            )
        if not any(name in present for name in names):
            raise ServingInputError(
                f"none of the columns {self._column_names()} given, got {sorted(map(str, present))[:20]}"
            )
        return [self._record(i, row) for i, row in enumerate(rows)]

    def _column_names(self) -> str:
        return ", ".join(
            f"{name} ({kind}{'' if required else ', optional'})" for name, kind, required in self.inputs
        )

    def _record(self, i: int, row: Mapping[str, Any]) -> dict[str, Any]:
        record = {}
        for name, kind, required in self.inputs:
            value = row.get(name)
            if not isinstance(value, str) and hasattr(value, "tolist"):
                value = value.tolist()  # numpy arrays after MLflow's schema enforcement
            if _missing(value):
                if required:
                    raise ServingInputError(f"record {i}: field {name!r} is missing or null")
                continue
            if kind == "string":
                self._check_text(i, name, value)
            elif kind == "string[]":
                if not isinstance(value, list | tuple) or not value:
                    raise ServingInputError(f"record {i}: field {name!r} must be a non-empty list of strings")
                for j, item in enumerate(value):
                    self._check_text(i, f"{name}[{j}]", item)
                if sum(len(v) for v in value) > self.max_text_chars:
                    raise ServingInputError(
                        f"record {i}: field {name!r} has more than {self.max_text_chars} characters in all; "
                        "shorten it or split the request"
                    )
                value = list(value)
            record[name] = value
        return record

    def _check_text(self, i: int, name: str, value: Any) -> None:
        if not isinstance(value, str):
            raise ServingInputError(
                f"record {i}: field {name!r} must be a string, got {type(value).__name__}"
            )
        if not value.strip():
            raise ServingInputError(f"record {i}: field {name!r} is empty")
        if len(value) > self.max_text_chars:
            raise ServingInputError(
                f"record {i}: field {name!r} has {len(value)} characters, more than this model accepts "
                f"({self.max_text_chars}, max_text_chars in the model's task.json); shorten or split it"
            )

    def check_record(self, record: Mapping[str, Any]) -> None:
        """Refuse one record as :meth:`predict` would, without running the model.

        The input checks of :meth:`records` run, then the kind's ``serve``, whose own checks of the records
        (a kind's impossible record, fill-mask's ``[MASK]``) come before its first call of the model (the
        contract of :meth:`bert_core.kinds.base.Component.serve`); the model is replaced by a stand-in that
        stops there, so a record costs its tokenisation at most.

        Raises:
            ServingInputError: what :meth:`predict` would raise, without the record number.
        """

        def stop(features: list[dict[str, Any]]) -> list[Any]:
            raise _Checked

        try:
            records = self.records([dict(record)])
            self.component.serve(self.spec, records, self.tokenizer, stop, self.settings, dict(self.task))
        except _Checked:
            return
        except ServingInputError as err:
            raise ServingInputError(re.sub(r"^record 0: ", "", str(err))) from None

    # -- prediction
    def predict_records(self, data: Any, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """One output dict per input record (columns :attr:`outputs`)."""
        records = self.records(data)
        options = {**self.task, **(params or {})}
        return self.component.serve(self.spec, records, self.tokenizer, self._run, self.settings, options)

    def predict(self, data: Any, params: Mapping[str, Any] | None = None) -> Any:
        """A pandas DataFrame with one row per input record (columns :attr:`outputs`)."""
        import pandas as pd

        out = self.predict_records(data, params)
        return pd.DataFrame({name: [r[name] for r in out] for name, _, _ in self.outputs})
