"""Serving a model directory the pipeline wrote: an MLflow Model directory, or a stage's Hugging Face
directory (``models/finetuned/<task>``, ``models/pretrained``) turned into the same MLflow Model that the
stage registers, so that it predicts exactly what the registered version predicts.

The task of a Hugging Face directory is read from the directory itself, in this order:

1. ``task.json``: the serving task JSON (:func:`bert_core.serving.serving_task`), which the finetune stage
   writes next to the weights: exact (lengths, labels, SQuAD v2.0's tuned null threshold);
2. the model card (``README.md``) front matter: ``pipeline_tag: fill-mask`` (the pretrain stage's card)
   gives fill-mask; a fine-tuned card's ``tags`` name its task, and the card's ``Params`` block its
   settings. A directory written before ``task.json`` existed takes this path: its SQuAD v2.0 null
   threshold is not in the card, so ``null_threshold`` stays unset (a warning says so);
3. ``config.json`` ``architectures`` naming a pretraining or masked-LM head: fill-mask.

Anything else is refused with a message naming the directory and what it lacks.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: The serving task JSON inside a Hugging Face model directory (same content as the MLflow artifact).
TASK_FILE = "task.json"
_FILL_MASK_ARCHITECTURES = {"BertForPreTraining", "BertForMaskedLM"}


class ModelDirectoryError(ValueError):
    """A local model directory is neither an MLflow Model nor a Hugging Face directory with a known task."""


def is_uri(model_uri: str) -> bool:
    """Whether ``model_uri`` is an MLflow URI with a scheme other than ``file:`` (``models:/``, ``runs:/``)."""
    return bool(re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", model_uri)) and not model_uri.startswith("file:")


def is_local_model(model_uri: str) -> bool:
    """Whether ``model_uri`` names an existing local directory (not ``models:/``, ``runs:/``, ...)."""
    return not is_uri(model_uri) and Path(model_uri.removeprefix("file://")).expanduser().is_dir()


def _card_params(body: str) -> dict[str, Any] | None:
    import yaml

    match = re.search(r"### Params \(`[^`]*`\)\s*```yaml\n(.*?)```", body, re.S)
    if not match:
        return None
    data = yaml.safe_load(match.group(1))
    return data if isinstance(data, dict) else None


def hf_task(hf_dir: str | Path) -> dict[str, Any]:
    """The serving task JSON of a stage's Hugging Face model directory (see the module docstring).

    Raises:
        ModelDirectoryError: no ``config.json``, or nothing in the directory names its task.
    """
    from bert_core.serving.task import fill_mask_task

    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise ModelDirectoryError(
            f"{hf_dir}: neither an MLflow Model (no MLmodel file) nor a Hugging Face model directory (no "
            "config.json); give a registry URI (models:/bert-sst2@champion), an MLflow Model directory, or a "
            "directory a stage wrote (models/finetuned/<task>, models/pretrained)"
        )
    task_file = hf_dir / TASK_FILE
    if task_file.is_file():
        try:
            task = json.loads(task_file.read_text(encoding="utf-8"))
        except ValueError as err:
            raise ModelDirectoryError(
                f"{task_file}: not valid JSON ({err}); re-run the stage that wrote it"
            ) from None
        if not isinstance(task, dict) or "kind" not in task or "task" not in task:
            raise ModelDirectoryError(f"{task_file}: a task JSON needs the keys 'task' and 'kind'")
        return task
    card = hf_dir / "README.md"
    if card.is_file():
        task = _task_from_card(card)
        if task is not None:
            return task
    try:
        config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    except ValueError as err:
        raise ModelDirectoryError(f"{hf_dir / 'config.json'}: not valid JSON ({err})") from None
    if _FILL_MASK_ARCHITECTURES & set(config.get("architectures") or []):
        return fill_mask_task()
    raise ModelDirectoryError(
        f"{hf_dir}: cannot tell which task this model serves: no {TASK_FILE}, no model card (README.md) naming "
        f"a task, and config.json architectures {config.get('architectures')} are not a pretraining head. "
        f"Re-run its finetune stage (which writes {TASK_FILE}) or use its registered version (models:/bert-<task>@champion)"
    )


def _task_from_card(card: Path) -> dict[str, Any] | None:
    from bert_core.modelcard import parse_front_matter
    from bert_core.serving.task import fill_mask_task, serving_task
    from bert_core.tasks import TASKS, get_task

    try:
        meta, body = parse_front_matter(card.read_text(encoding="utf-8"))
    except ValueError:
        return None
    if meta.get("pipeline_tag") == "fill-mask":
        return fill_mask_task()
    names = [tag for tag in meta.get("tags") or [] if tag in TASKS]
    if len(names) != 1:
        return None
    from bert_core.finetune.params import FinetuneParams, TaskSettings

    spec = get_task(names[0])
    card_params = _card_params(body)
    try:
        settings = (
            TaskSettings.model_validate(card_params) if card_params else FinetuneParams().for_task(spec.name)
        )
    except ValueError as err:
        raise ModelDirectoryError(
            f"{card}: the Params block does not validate as fine-tuning settings ({str(err).splitlines()[0]})"
        ) from None
    task = serving_task(spec, settings)
    log.warning(
        "%s: no %s; task %r read from the model card (its Params block)%s",
        card.parent,
        TASK_FILE,
        spec.name,
        "; the SQuAD v2.0 null threshold is not in the card (null_threshold unset)"
        if spec.kind == "span_qa"
        else "",
    )
    return task


def mlflow_model_dir(model_dir: str | Path, scratch: str | Path) -> Path:
    """The MLflow Model directory for a local model directory: itself when it has an ``MLmodel`` file,
    else the MLflow Model of the Hugging Face directory (written under ``scratch``, the same as the stage
    registers).

    Raises:
        ModelDirectoryError: see :func:`hf_task`.
    """
    model_dir = Path(model_dir).expanduser()
    if (model_dir / "MLmodel").is_file():
        return model_dir
    from bert_core.serving.pyfunc import save_model

    task = hf_task(model_dir)
    return save_model(Path(scratch) / "mlflow-model", model_dir, task)


def main(argv: list[str] | None = None) -> int:
    """``python -m bert_core.serving.local <model dir> <dest>``: write the MLflow Model of a stage's model
    directory to ``dest`` (then ``mlflow models serve -m <dest>`` serves it)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m bert_core.serving.local", description=main.__doc__)
    parser.add_argument("model_dir", help="models/finetuned/<task> or models/pretrained")
    parser.add_argument("dest", help="where the MLflow Model goes (must not exist or be empty)")
    args = parser.parse_args(argv)
    from mlflow.exceptions import MlflowException

    from bert_core.serving.pyfunc import save_model

    try:
        path = save_model(args.dest, args.model_dir, hf_task(args.model_dir))
    except ModelDirectoryError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except MlflowException as err:  # dest exists and is not empty
        print(f"error: {str(err).splitlines()[0]}; give a new directory as dest", file=sys.stderr)
        return 1
    print(
        f"wrote the MLflow Model of {args.model_dir} to {path}; serve it with: mlflow models serve -m {path}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
