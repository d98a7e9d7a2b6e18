"""Typed params: YAML from ``params/`` parsed once into pydantic models that validate themselves.

Each stage reads one section of one file (``params/<stage>.yaml``, top-level key ``<stage>``) into a
:class:`StrictModel` subclass. Unknown keys, wrong types and out-of-range values raise :class:`ParamsError`
naming the file, the dotted key, the bad value and what would be valid.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)


class ParamsError(ValueError):
    """A params file or value is wrong; the message says where and what is valid."""


class StrictModel(BaseModel):
    """Base for every params model: unknown keys are errors, values are immutable after parsing."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def _format_errors(err: ValidationError, where: str, prefix: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "")
        if e["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key '{key}' (remove it or check its spelling)")
            continue
        got = e.get("input")
        got_s = repr(got) if not isinstance(got, dict) else "a mapping"
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        lines.append(f"{where}: '{key}' = {got_s}: {msg}")
    return "\n".join(lines)


def parse_params(data: Any, model_cls: type[M], *, where: str = "<params>", prefix: str = "") -> M:
    """Validate a mapping into ``model_cls``; raise :class:`ParamsError` with every problem listed."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ParamsError(f"{where}: '{prefix or '<root>'}' must be a mapping, got {type(data).__name__}")
    try:
        return model_cls.model_validate(data)
    except ValidationError as err:
        raise ParamsError(_format_errors(err, where, prefix)) from None


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated in one mapping (as DVC does), naming its line."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key]})", key_node.start_mark
            )
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# YAML 1.2's floats, as DVC reads params and writes `-S` values: ``5e-05`` (no dot before the exponent) is a
# number there, and PyYAML's YAML 1.1 would read it as a string.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML mapping; errors name the file (and line for syntax errors and repeated keys)."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(
            f"{path}: {'a directory, not a params file' if path.is_dir() else 'params file not found'}"
        )
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ParamsError(
            f"{path}:{line}: not UTF-8 (byte {raw[err.start : err.start + 1]!r}); save the params file as UTF-8"
        ) from None
    return parse_yaml(text, path)


def parse_yaml(text: str, path: str | os.PathLike[str]) -> dict[str, Any]:
    """A params file's text as a mapping, read as DVC reads it (YAML 1.2 floats, no repeated key); errors
    name ``path`` (and the line)."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader
    except yaml.constructor.ConstructorError as err:
        if err.problem and err.problem.startswith("duplicate key") and err.problem_mark is not None:
            raise ParamsError(
                f"{path}:{err.problem_mark.line + 1}: {err.problem}; DVC refuses such a file too, keep one"
            ) from None
        raise ParamsError(f"{path}: not valid YAML: {err}") from None
    except yaml.YAMLError as err:  # one line: PyYAML's own message quotes the text and draws a caret
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
        if context and start is not None:
            context += f" (from {start.line + 1}:{start.column + 1})"
        problem = ": ".join(filter(None, (context, getattr(err, "problem", None))))
        raise ParamsError(f"{path}{where}: not valid YAML: {problem or err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ParamsError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def load_params(path: str | os.PathLike[str], section: str, model_cls: type[M]) -> M:
    """Load ``section`` of the YAML file at ``path`` into ``model_cls``.

    Raises:
        ParamsError: the file is missing or not YAML, the section is missing, or a value is invalid.
    """
    data = read_yaml(path)
    if section not in data:
        raise ParamsError(f"{path}: missing top-level section '{section}' (found: {sorted(data)})")
    if data[section] is None:
        raise ParamsError(
            f"{path}:{_key_line(path, section)}: section '{section}' is empty; give its keys (see the committed "
            f"params/ file for the defaults) or remove the section header"
        )
    return parse_params(data[section], model_cls, where=str(path), prefix=section)


def _key_line(path: str | os.PathLike[str], key: str) -> int | str:
    """The line of top-level ``key:`` in the file (for messages), or ``?``."""
    pattern = re.compile(rf"^{re.escape(key)}\s*:")
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if pattern.match(line):
            return number
    return "?"


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings to dotted keys (lists kept as values), e.g. for MLflow params."""
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict | BaseModel):
                out.update(flatten(v, key))
            else:
                out[key] = v
    else:
        out[prefix] = data
    return out


# ------------------------------------------------------------------------ values other libraries refuse
# Checked when the params are parsed, so that a value MLflow or torch would refuse fails in seconds with
# the file and key named, not after training (a registry name) or deep inside a library without a key.


def _mlflow_installed() -> bool:
    """Whether MLflow can be imported. Without it (the library entries run bare, e.g. ``bench/gpu_smoke.py``
    on a machine without the orchestration stack) nothing is registered, so there is no name to refuse."""
    import importlib.util

    return importlib.util.find_spec("mlflow") is not None


def _mlflow_refuses(check: Any, value: str, what: str, suggestion: str) -> None:
    """Run one of MLflow's own validators (``mlflow.utils.validation``), so the rules cannot drift from
    the installed MLflow; its refusal becomes a ``ValueError`` that :func:`parse_params` names the key of."""
    from mlflow.exceptions import MlflowException

    try:
        check(value)
    except MlflowException as err:
        raise ValueError(f"MLflow refuses it as {what}: {err.message} {suggestion}") from None


def mlflow_model_name(value: str) -> str:
    """``value`` if MLflow accepts it as a registered model name (no ``/`` or ``:``, no path tricks)."""
    if not _mlflow_installed():
        return value
    from mlflow.utils.validation import _validate_model_name

    _mlflow_refuses(
        _validate_model_name,
        value,
        "a registered model name",
        "Use letters, digits, '-', '_' and '.' (e.g. '-' where it has '/').",
    )
    return value


def mlflow_alias(value: str) -> str:
    """``value`` if MLflow accepts it as a registered model alias (``[A-Za-z0-9_-]``, not ``latest``/``v<N>``)."""
    if not _mlflow_installed():
        return value
    from mlflow.utils.validation import _validate_model_alias_name, _validate_model_alias_name_reserved

    suggestion = "Use another name, e.g. 'champion' or 'newest' ('latest' and v<N> name versions)."
    _mlflow_refuses(_validate_model_alias_name, value, "a registered model alias", suggestion)
    _mlflow_refuses(_validate_model_alias_name_reserved, value, "a registered model alias", suggestion)
    return value


def check_device(params: Any, *, where: str, key: str = "device") -> None:
    """Refuse ``params.device`` = ``cuda`` / ``cuda:<n>`` on a machine where torch sees no such GPU.

    Not part of the params models (a file is valid or not wherever it is read, e.g. by ``evaluate`` or on
    a laptop preparing a GPU run); the stages call it when they start (``flows.stages.Stage.load_params``).

    Raises:
        ParamsError: naming the file, the key and the GPUs torch sees.
    """
    device = getattr(params, "device", None)
    if not isinstance(device, str) or not device.startswith("cuda"):
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if index < count:
        return
    seen = "no CUDA device (torch.cuda.is_available() is false)" if count == 0 else f"{count} CUDA device(s)"
    raise ParamsError(
        f"{where}: '{key}' = {device!r}: this machine has {seen}; set it to 'auto' (a GPU when there is one) "
        "or 'cpu', or run on a machine with that GPU"
    )
