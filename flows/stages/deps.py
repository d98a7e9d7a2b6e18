"""Code deps of every stage, derived from its real imports: ``python -m flows.stages sync-deps [--check]``.

The import graph of ``bert_core/`` and ``flows/`` is grimp's (every import statement, inside functions
too, relative ones resolved); a stage's code is its flow module and everything it imports, transitively,
with each module's parent packages (importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py``).
A package directory replaces its files only when every one is imported. ``sync-deps`` rewrites each
``deps:`` list of ``dvc.yaml`` through DVC's round-trip YAML, keeping its comments and layout.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bert_core.constants import REPO_ROOT
from flows.stages import STAGES, Stage

CODE_PACKAGES = ("bert_core", "flows")


# ------------------------------------------------------------------------------------------ the walk


def module_file(name: str, root: Path) -> Path | None:
    """The file of module ``name`` under ``root`` (``a/b.py`` or ``a/b/__init__.py``), if it exists."""
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def import_graph() -> Any:
    """grimp's import graph of the code packages of this checkout."""
    import grimp

    return grimp.build_graph(*CODE_PACKAGES, cache_dir=None)


def closure(graph: Any, entry: str) -> set[str]:
    """Every module of ours that running ``python -m <entry>`` can import (parent packages included)."""
    seen: set[str] = set()
    todo = [entry]
    while todo:
        if (name := todo.pop()) in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += graph.find_modules_directly_imported_by(name)
    return seen


def _py_files(directory: Path) -> set[Path]:
    return {p for p in directory.rglob("*.py") if "__pycache__" not in p.parts}


def collapse(files: set[Path], root: Path) -> list[str]:
    """Repository-relative paths: a package directory whose ``.py`` files are all in ``files``, else files."""
    out: set[str] = set()
    covered: set[Path] = set()
    top = {root / p for p in CODE_PACKAGES}  # a whole code package is never collapsed
    packages = sorted({p.parent for p in files if p.name == "__init__.py"}, key=lambda d: len(d.parts))
    for package in packages:
        if package in top or any(c in package.parents for c in covered):
            continue
        if _py_files(package) <= files:
            covered.add(package)
            out.add(package.relative_to(root).as_posix())
    for path in files:
        if not any(c in path.parents for c in covered):
            out.add(path.relative_to(root).as_posix())
    return sorted(out)


def expected_deps(stage: Stage, graph: Any, root: Path = REPO_ROOT) -> list[str]:
    """The deps of ``stage``: its record of what it reads from outside the repository, its data deps, then
    its flow module and everything it imports (collapsed)."""
    files = {f for m in closure(graph, stage.flow_module) if (f := module_file(m, root)) is not None}
    return [*filter(None, [stage.record]), *stage.data_deps, *collapse(files, root)]


# ------------------------------------------------------------------------------------ dvc.yaml rewrite


class DepsError(ValueError):
    """dvc.yaml cannot be brought in sync (a stage or its ``deps:`` block is missing)."""


def rewrite(text: str, deps: dict[str, list[str]]) -> str:
    """``dvc.yaml`` text with the ``deps:`` list of each stage in ``deps`` replaced, through DVC's own
    round-trip YAML (what ``dvc stage add`` writes: comments and layout kept)."""
    from dvc.utils.serialize import dumps_yaml, parse_yaml_for_update

    data = parse_yaml_for_update(text, "dvc.yaml")
    missing = []
    for name, wanted in deps.items():
        body = (data.get("stages") or {}).get(name)
        body = body.get("do", body) if isinstance(body, dict) else None
        if body is None or "deps" not in body:
            missing.append(name)
        else:
            body["deps"][:] = wanted
    if missing:
        raise DepsError(
            f"dvc.yaml: no `deps:` block found for stage(s) {', '.join(sorted(missing))}; add one"
        )
    return dumps_yaml(data)


def current_deps(text: str) -> dict[str, list[str]]:
    """Each stage's ``deps`` as written in ``dvc.yaml`` (a foreach stage: its ``do`` block's)."""
    data = yaml.safe_load(text) or {}
    out: dict[str, list[str]] = {}
    for name, body in (data.get("stages") or {}).items():
        body = body.get("do", body) if isinstance(body, dict) else {}
        out[name] = [d if isinstance(d, str) else next(iter(d)) for d in body.get("deps") or []]
    return out


@dataclass
class SyncResult:
    text: str  # dvc.yaml as it should be
    problems: list[str]  # "stage X: missing dep P" / "stage X: superfluous dep P"
    wrong_stages: list[str]


def sync(root: Path = REPO_ROOT, stages: tuple[Stage, ...] = STAGES, text: str | None = None) -> SyncResult:
    """Compute the in-sync ``dvc.yaml`` and what differs in the current one (or in ``text``)."""
    if text is None:
        text = (root / "dvc.yaml").read_text(encoding="utf-8")
    graph = import_graph()
    wanted = {s.name: expected_deps(s, graph, root) for s in stages}
    have = current_deps(text)
    problems: list[str] = []
    wrong: list[str] = []
    for name, deps in wanted.items():
        if name not in have:
            problems.append(f"stage {name}: not in dvc.yaml")
            wrong.append(name)
            continue
        before = len(problems)
        problems += [f"stage {name}: missing dep {p}" for p in deps if p not in have[name]]
        problems += [f"stage {name}: superfluous dep {p}" for p in have[name] if p not in deps]
        if len(problems) == before and have[name] != deps:
            problems.append(f"stage {name}: deps not in canonical order (data deps first, then sorted code)")
        if len(problems) > before:
            wrong.append(name)
    new_text = rewrite(text, {n: d for n, d in wanted.items() if n in have})
    return SyncResult(new_text, problems, wrong)


def main(argv: list[str] | None = None, root: Path = REPO_ROOT) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flows.stages",
        description="The stage table's commands (see flows/stages/__init__.py).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sync-deps", help="rewrite every stage's code deps in dvc.yaml from its imports")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when dvc.yaml is out of sync")
    sub.add_parser("list", help="print the stages and their code deps")
    sub.add_parser(
        "inputs", help="record what each stage reads from outside the repository (DVC stage inputs)"
    )
    args = parser.parse_args(argv)
    if args.command == "inputs":
        from flows.stages.inputs import write_records

        return write_records(root)
    if args.command == "list":
        graph = import_graph()
        for stage in STAGES:
            print(f"{stage.name}: {' '.join(expected_deps(stage, graph, root))}")
        return 0
    try:
        result = sync(root)
    except DepsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for problem in result.problems:
        print(problem, file=sys.stderr if args.check else sys.stdout)
    if args.check:
        if result.problems:
            print(
                f"dvc.yaml is out of sync in {len(result.wrong_stages)} stage(s): "
                "run `python -m flows.stages sync-deps`",
                file=sys.stderr,
            )
            return 1
        print("dvc.yaml deps are in sync")
        return 0
    path = root / "dvc.yaml"
    if result.text != path.read_text(encoding="utf-8"):
        path.write_text(result.text, encoding="utf-8")
        print(f"updated dvc.yaml ({len(result.wrong_stages)} stage(s) changed)")
    else:
        print("dvc.yaml deps already in sync")
    return 0
