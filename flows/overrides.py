"""Params overrides: dotted keys into params files, and DVC's ``-S`` value syntax both ways.

An override set maps a params file to dotted keys and their values (:data:`Overrides`), e.g.
``{"params/pretrain.yaml": {"pretrain.model.preset": "base"}}``. Values use DVC's ``-S`` syntax, which is
Hydra's override grammar; DVC parses it with Hydra's ``OverridesParser`` (``dvc/utils/hydra.py``), and so do
we: :func:`parse_value` is that parser and :func:`format_value` is Hydra's own rendering of a parsed value,
so a value survives the round trip through ``dvc exp run -S`` without a grammar of our own. In memory,
:func:`set_keys` applies overrides the way ``-S`` does (an OmegaConf config in struct mode, Hydra's own
code), so the params a run will see are what ``dvc exp run -S`` writes. Used by :mod:`flows.profiles` and
the pipeline flow's inputs (:mod:`flows._inputs`).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

Overrides = dict[str, dict[str, Any]]
"""``{params file (repo-relative): {dotted key: value}}``."""


class ProfileError(ValueError):
    """A profile or an override is wrong; the message names the file and key and what to do."""


# ------------------------------------------------------------------------ -S values, by Hydra's parser


@functools.cache
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def _parse(override: str, shown: str) -> Any:
    """One ``key=value`` override as Hydra's parser (and so DVC's ``-S``) reads it; errors show ``shown``."""
    try:
        return _parser().parse_override(override)
    except Exception as err:
        raise ProfileError(f"'{shown}' is not a valid -S value: {err}") from None


def parse_value(text: str) -> Any:
    """Parse one ``-S`` value with Hydra's parser, as DVC does: ``1e-4`` is a float, ``[1,2]`` a list."""
    return _parse(f"key={text}", text).value()


def format_value(value: Any) -> str:
    """A Python value in DVC's ``-S`` syntax, written by Hydra's own renderer, e.g. ``[1e-05,3e-05]``.

    Hydra renders what its parser returns, so each string is first made that: bare when Hydra writes it
    unescaped and reads it back as itself inside a list (its strictest place), else a quoted string
    (``'null'``, ``'1e-4'``, ``'a b'``, ``''``), which Hydra escapes itself.
    """
    from hydra.core.override_parser.types import Override, OverrideType, Quote, QuotedString

    def text(element: Any) -> str:
        return Override(OverrideType.CHANGE, "key", None, element).get_value_element_as_str()

    def element(v: Any) -> Any:
        if isinstance(v, str):
            with contextlib.suppress(ProfileError):
                if text(v) == v and parse_value(f"[{v}]") == [v]:
                    return v
            return QuotedString(v, Quote.single)
        if isinstance(v, bool):  # Hydra reads any case; YAML (and the params files) write lowercase
            return "true" if v else "false"
        if isinstance(v, list | tuple):
            return [element(x) for x in v]
        if isinstance(v, dict):
            return {k: element(x) for k, x in v.items()}
        if v is None or isinstance(v, bool | int | float):
            return v
        raise ProfileError(f"cannot express {v!r} ({type(v).__name__}) as a params value")

    return text(element(value))


def parse_set_args(specs: list[str] | tuple[str, ...]) -> Overrides:
    """Parse ``file:key=value`` strings (``dvc exp run -S``) into overrides, split and parsed as DVC does.

    A mapping replaced wholesale comes as the pair :func:`hydra_overrides` writes (``~key``, then
    ``+key={...}``, as ``python -m flows.profiles args`` prints it) and reads back as ``key={...}``.
    """
    out: Overrides = {}
    removed: dict[tuple[str, str], str] = {}  # (file, key) -> its `~key`, awaiting the `+key=...`
    for spec in specs:
        file, colon, override = spec.partition(":")
        if not (colon and file and "=" not in file and ("=" in override or override.startswith("~"))):
            raise ProfileError(
                f"'{spec}': expected FILE:KEY=VALUE, e.g. params/finetune.yaml:finetune.defaults.seeds=[1,2]"
            )
        parsed = _parse(override, spec)
        key = parsed.key_or_group
        if parsed.is_delete() and "=" not in override:
            removed[(file, key)] = spec
            continue
        if (
            parsed.is_sweep_override()
            or parsed.is_delete()
            or (parsed.is_add() and removed.pop((file, key), None) is None)
        ):
            raise ProfileError(
                f"'{spec}': one value per key (no sweep, + or ~ but a mapping's ~KEY +KEY={{...}}); quote a "
                "string with commas: KEY='a,b'"
            )
        out.setdefault(file, {})[key] = parsed.value()
    if removed:
        raise ProfileError(
            f"'{next(iter(removed.values()))}': a key is removed only to be replaced: +KEY=VALUE next"
        )
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


# ---------------------------------------------------------------- applied in memory, as -S does


def has_key(params: DictConfig, key: str) -> bool:
    """Whether the dotted ``key`` exists; list items go by index (``a.0.b``), as in ``-S``."""
    absent = object()
    with contextlib.suppress(OmegaConfBaseException):  # a list item by a name that is no index
        return OmegaConf.select(params, key, default=absent) is not absent
    return False


def value_at(params: DictConfig, key: str) -> Any:
    """The value at the dotted ``key`` (``None`` when absent); a mapping as a ``dict``, a list as a ``list``."""
    node = OmegaConf.select(params, key)
    return OmegaConf.to_object(node) if OmegaConf.is_config(node) else node


def _same(a: Any, b: Any) -> bool:
    """Equal as params values: ``1`` and ``1.0`` are, and so are mappings in another key order (DVC's ``-S``
    keeps a file's order); ``true`` and ``1`` are not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def set_keys(params: DictConfig, keys: dict[str, Any], file: str) -> dict[str, Any]:
    """Apply ``keys`` of params file ``file`` to ``params`` in order, with DVC's own code for their ``-S``
    strings (:func:`hydra_overrides`); the keys that changed a value (:func:`_same`). Raises ProfileError."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    OmegaConf.set_struct(params, True)  # as DVC loads a params file for -S: an override adds no key
    changed = {}
    for key, value in keys.items():
        if not has_key(params, key):
            raise ProfileError(
                f"{file}: no key '{key}' (an override can only change an existing key; check its "
                f"spelling against {file})"
            )
        if not _same(value_at(params, key), value):
            changed[key] = value
        overrides = hydra_overrides(key, value)
        try:  # what DVC's -S runs (dvc.utils.hydra.apply_overrides)
            ConfigLoaderImpl._apply_overrides_to_config([_parse(o, o) for o in overrides], params)
        except Exception as err:
            why = ": ".join(str(e).splitlines()[0] for e in (err, err.__cause__) if e is not None)
            raise ProfileError(f"{file}: DVC's -S cannot apply {' '.join(overrides)}: {why}") from None
    return changed
