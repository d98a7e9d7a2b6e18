"""Params overrides: dotted keys into params files, and DVC's ``-S`` value syntax both ways.

An override set maps a params file to dotted keys and their values (:data:`Overrides`), e.g.
``{"params/pretrain.yaml": {"pretrain.model.preset": "base"}}``. Values use DVC's ``-S`` syntax, which is
Hydra's override grammar; DVC parses it with Hydra's ``OverridesParser`` (``dvc/utils/hydra.py``), and so do
we: :func:`parse_value` is that parser and :func:`format_value` is Hydra's own rendering of a parsed value,
so a value survives the round trip through ``dvc exp run -S`` without a grammar of our own. Used by
:mod:`flows.profiles` and the pipeline flow's inputs (:mod:`flows._inputs`).
"""

from __future__ import annotations

import functools
from typing import Any

Overrides = dict[str, dict[str, Any]]
"""``{params file (repo-relative): {dotted key: value}}``."""


class ProfileError(ValueError):
    """A profile or an override is wrong; the message names the file and key and what to do."""


# ---------------------------------------------------------------------------------------- dotted keys


MISSING = object()


def _child(node: Any, part: str) -> Any:
    if isinstance(node, dict):
        return node.get(part, MISSING)
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    return MISSING


def get_dotted(data: dict[str, Any], key: str) -> Any:
    """``data['a'][0]['b']`` for ``'a.0.b'`` (list items by index, as in ``-S``); a sentinel when absent."""
    node: Any = data
    for part in key.split("."):
        node = _child(node, part)
        if node is MISSING:
            return MISSING
    return node


def has_dotted(data: dict[str, Any], key: str) -> bool:
    return get_dotted(data, key) is not MISSING


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set an existing dotted key (the caller checked :func:`has_dotted`)."""
    *parents, last = key.split(".")
    node: Any = data
    for part in parents:
        node = _child(node, part)
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    return a == b


# ------------------------------------------------------------------------ -S values, by Hydra's parser


@functools.cache
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def _hydra_text(element: Any) -> str:
    """Hydra's own rendering of a parsed override value (the inverse of its parser)."""
    from hydra.core.override_parser.types import Override, OverrideType

    return Override(OverrideType.CHANGE, "key", None, element).get_value_element_as_str()


def _element(value: Any) -> Any:
    """``value`` as Hydra's parser would return it, so :func:`_hydra_text` writes text that parses back to it.

    A string stays bare when Hydra writes it unescaped and reads it back as itself inside a list (the
    strictest place it can appear); anything else (``'null'``, ``'1e-4'``, ``'a b'``, ``"it's"``, ``''``)
    becomes a quoted string, which Hydra escapes itself.
    """
    from hydra.core.override_parser.types import Quote, QuotedString

    if isinstance(value, str):
        if _hydra_text(value) == value and _parses_to(f"[{value}]", [value]):
            return value
        return QuotedString(value, Quote.single)
    if isinstance(value, list | tuple):
        return [_element(v) for v in value]
    if isinstance(value, dict):
        return {k: _element(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float):
        return value
    raise ProfileError(f"cannot express {value!r} ({type(value).__name__}) as a params value")


def _parses_to(text: str, expected: Any) -> bool:
    try:
        return same_value(parse_value(text), expected)
    except ProfileError:
        return False


def format_value(value: Any) -> str:
    """A Python value in DVC's ``-S`` syntax, written by Hydra, e.g. ``[1e-05,3e-05]``."""
    return _hydra_text(_element(value))


def parse_value(text: str) -> Any:
    """Parse one ``-S`` value with Hydra's parser, as DVC does: ``1e-4`` is a float, ``[1,2]`` a list."""
    try:
        return _parser().parse_override(f"key={text}").value()
    except Exception as err:
        raise ProfileError(f"'{text}' is not a valid -S value: {err}") from None


def parse_set_args(specs: list[str] | tuple[str, ...]) -> Overrides:
    """Parse ``file:key=value`` strings (the argument of ``dvc exp run -S``) into overrides."""
    out: Overrides = {}
    for spec in specs:
        target, eq, text = spec.partition("=")
        file, colon, key = target.partition(":")
        if not (eq and colon and file and key):
            raise ProfileError(
                f"'{spec}': expected FILE:KEY=VALUE, e.g. params/finetune.yaml:finetune.seeds=[1,2]"
            )
        out.setdefault(file, {})[key] = parse_value(text)
    return out


def merge(*layers: Overrides) -> Overrides:
    """Later layers win. A later key replaces earlier keys below it (``a.b`` drops ``a.b.c``) and moves to
    the end, so applying the result in order gives the same params as applying the layers one by one."""
    out: Overrides = {}
    for layer in layers:
        for file, keys in layer.items():
            dest = out.setdefault(file, {})
            for key, value in keys.items():
                for old in [k for k in dest if k == key or k.startswith(key + ".")]:
                    del dest[old]
                dest[key] = value
    return out


def hydra_overrides(key: str, value: Any) -> list[str]:
    """The ``-S`` override(s) for one key. A mapping replaces the old one wholesale (``~key`` then
    ``+key=...``): a plain ``key={...}`` would *merge* into it and could not drop or add entries."""
    if isinstance(value, dict):
        return [f"~{key}", f"+{key}={format_value(value)}"]
    return [f"{key}={format_value(value)}"]


def set_args(overrides: Overrides) -> list[str]:
    """``["-S", "params/x.yaml:key=value", ...]`` for ``dvc exp run``."""
    args: list[str] = []
    for file, keys in overrides.items():
        for key, value in keys.items():
            for override in hydra_overrides(key, value):
                args += ["-S", f"{file}:{override}"]
    return args
