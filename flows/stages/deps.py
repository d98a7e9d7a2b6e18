"""Code deps of every stage, derived from its real imports: ``python -m flows.stages sync-deps [--check]``.

A static walk from the stage's flow module over its import statements (inside functions too; relative
ones; a package ``__init__``'s lazy ``__getattr__`` exports) collects every file of ``bert_core/`` and
``flows/`` the stage can execute; ``if __name__ == "__main__":`` code counts only in the flow module. A
package directory replaces its files only when every one is imported. ``sync-deps`` rewrites each
``deps:`` list of ``dvc.yaml`` through DVC's round-trip YAML, keeping its comments and layout.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

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


def _is_main_guard(node: ast.AST) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    sides = [node.test.left, *node.test.comparators]
    names = {s.id for s in sides if isinstance(s, ast.Name)}
    consts = {s.value for s in sides if isinstance(s, ast.Constant)}
    return names == {"__name__"} and consts == {"__main__"}


def _import_nodes(tree: ast.Module, *, include_main: bool) -> list[ast.Import | ast.ImportFrom]:
    nodes: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            nodes.append(node)
        for child in ast.iter_child_nodes(node):
            if not include_main and node is tree and _is_main_guard(child):
                continue
            stack.append(child)
    return nodes


def _lazy_exports(tree: ast.Module) -> dict[str, str]:
    """``{name: submodule}`` of a package that exports names through a module-level ``__getattr__``."""
    if not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
        return {}
    out: dict[str, str] = {}
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Dict):
            for k, v in zip(value.keys, value.values, strict=True):
                key = k.value if isinstance(k, ast.Constant) else None
                sub = v.value if isinstance(v, ast.Constant) else None
                if isinstance(key, str) and isinstance(sub, str):
                    out[key] = sub.lstrip(".")
    return out


class ImportGraph:
    """Parsed modules of the repository's code packages, cached."""

    def __init__(self, root: Path = REPO_ROOT) -> None:
        self.root = root
        self._trees: dict[Path, ast.Module] = {}

    def tree(self, path: Path) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        return self._trees[path]

    def _ours(self, name: str) -> bool:
        return name.split(".", 1)[0] in CODE_PACKAGES

    def _with_parents(self, name: str) -> list[str]:
        parts = name.split(".")
        return [".".join(parts[: i + 1]) for i in range(len(parts))]

    def imported_by(self, name: str, *, entry: bool = False) -> set[str]:
        """The modules of ours that module ``name`` imports directly (parents included)."""
        path = module_file(name, self.root)
        if path is None:
            return set()
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        found: set[str] = set()
        for node in _import_nodes(self.tree(path), include_main=entry):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    parts = package.split(".")
                    base_parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join([*base_parts, *([node.module] if node.module else [])])
                else:
                    base = node.module or ""
                targets = [base]
                base_file = module_file(base, self.root) if self._ours(base) else None
                lazy = (
                    _lazy_exports(self.tree(base_file))
                    if base_file is not None and base_file.name == "__init__.py"
                    else {}
                )
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if alias.name != "*" and module_file(sub, self.root) is not None:
                        targets.append(sub)
                    elif alias.name in lazy and module_file(f"{base}.{lazy[alias.name]}", self.root):
                        targets.append(f"{base}.{lazy[alias.name]}")
            for target in targets:
                if self._ours(target):
                    found.update(m for m in self._with_parents(target) if module_file(m, self.root))
        return found

    def closure(self, entry: str) -> set[str]:
        """Every module of ours that running ``python -m <entry>`` can import."""
        seen: set[str] = set()
        todo = [(m, m == entry) for m in self._with_parents(entry)]
        while todo:
            name, is_entry = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            todo += [(m, False) for m in self.imported_by(name, entry=is_entry) if m not in seen]
        return {m for m in seen if module_file(m, self.root) is not None}


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


def code_deps(stage: Stage, root: Path = REPO_ROOT, graph: ImportGraph | None = None) -> list[str]:
    """The code deps of ``stage``: its flow module and everything it imports within our packages."""
    graph = graph or ImportGraph(root)
    modules = graph.closure(stage.flow_module)
    files = {f for m in modules if (f := module_file(m, root)) is not None}
    return collapse(files, root)


def expected_deps(stage: Stage, root: Path = REPO_ROOT, graph: ImportGraph | None = None) -> list[str]:
    return [*stage.data_deps, *code_deps(stage, root, graph)]


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
    graph = ImportGraph(root)
    wanted = {s.name: expected_deps(s, root, graph) for s in stages}
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
    args = parser.parse_args(argv)
    if args.command == "list":
        graph = ImportGraph(root)
        for stage in STAGES:
            print(f"{stage.name}: {' '.join(expected_deps(stage, root, graph))}")
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
