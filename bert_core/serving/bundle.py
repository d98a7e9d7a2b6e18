"""The code a registered model carries (its ``code/`` directory): the part of ``bert_core`` that serving
imports, whose imports need only the model's declared requirements (torch, transformers, safetensors,
numpy, pandas, mlflow).

The list is explicit so that what travels with a model is reviewable and small: no stage code, no params
(pydantic, YAML), no data checks (Great Expectations), no orchestration (Prefect, DVC). Package
``__init__`` files marked as stubs are written as a docstring only, because the project's own ``__init__``
imports modules serving does not need (``bert_core.finetune`` re-exports its pydantic params).
``tests/test_serving.py`` loads a model with those packages blocked; ``tests/e2e/test_serving_e2e.py``
loads every kind in a virtual environment built from the model's ``requirements.txt`` alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

#: ``bert_core`` modules (paths relative to the package) copied into a model's ``code/bert_core``.
SERVING_MODULES: tuple[str, ...] = (
    "__init__.py",
    "atomic.py",
    "checks.py",
    "config.py",
    "constants.py",
    "device.py",
    "hf.py",
    "integrity.py",
    "masked_lm.py",
    "model.py",
    "owned.py",
    "progress.py",
    "unpad.py",
    "finetune/collate.py",
    "finetune/inference.py",
    "kinds/__init__.py",
    "kinds/base.py",
    "kinds/multiple_choice.py",
    "kinds/sequence.py",
    "kinds/span_qa.py",
    "kinds/squad_post.py",
    "kinds/task_json.py",
    "kinds/token_classification.py",
    "serving/__init__.py",
    "serving/fill_mask.py",
    "serving/predictor.py",
    "serving/pyfunc.py",
    "serving/task.py",
    "tasks/__init__.py",
    "tasks/base.py",
    "tasks/conll.py",
    "tasks/glue.py",
    "tasks/loader.py",
    "tasks/own.py",
    "tasks/registry.py",
    "tasks/squad.py",
    "tasks/swag.py",
    "tasks/table.py",
)

#: Packages whose ``__init__`` is written as a stub (their modules are imported by full name).
STUB_PACKAGES: tuple[str, ...] = ("finetune",)

_PACKAGE = Path(__file__).resolve().parent.parent


def stage_code(dest: str | Path) -> Path:
    """Write the serving part of ``bert_core`` to ``dest/bert_core``; return that directory (the model's
    ``code_paths`` entry)."""
    root = Path(dest) / "bert_core"
    for rel in SERVING_MODULES:
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_PACKAGE / rel, target)
    for package in STUB_PACKAGES:
        (root / package).mkdir(parents=True, exist_ok=True)
        doc = f'"""``bert_core.{package}``, the modules a served model needs (see bert_core.serving.bundle)."""\n'
        (root / package / "__init__.py").write_text(doc, encoding="utf-8")
    return root
