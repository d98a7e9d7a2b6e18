"""A throw-away copy of the project that runs its real DVC pipeline on tiny params.

The copy holds the working tree's code, params and ``dvc.yaml`` (git + DVC initialised), the ``tiny``
profile applied plus the settings a fault test needs (deterministic CPU pretraining with frequent
checkpoints), its own MLflow store, and the session's Prefect server. :meth:`TinyPipeline.build` runs the
stages one at a time with ``dvc repro --single-item`` so each stage's duration is known (the fault tests
pick their kill times inside it); :meth:`TinyPipeline.clone` gives a fresh copy of the built workspace.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .conftest import FAKE_SECRETS, PY, copy_project, git_commit_all, git_dvc_init, run_cmd, stage_env

PROFILE = "tiny"
EXTRA: dict[str, dict[str, Any]] = {
    # Bit-exact resume needs deterministic kernels; checkpoints often enough that a kill lands between two.
    "params/pretrain.yaml": {
        "pretrain.deterministic": True,
        "pretrain.device": "cpu",
        "pretrain.max_steps": 40,
        "pretrain.checkpoint_every": 5,
        "pretrain.keep_last": 2,
        "pretrain.log_every": 5,
    },
    "params/finetune.yaml": {"finetune.device": "cpu"},
    # The statistical data checks on a sample, not on the whole (tiny) output: on a population of ~100
    # held-out instances the IsNext share cannot be held to 50% +- 1 point (see docs/reliability.md).
    "params/pretrain_data.yaml": {"pretrain_data.check_sample": 100, "pretrain_data.heldout_dupe_factor": 2},
}
# Left out of the copies: resume state is what a killed run would have, not what the reference left.
CHECKPOINTS = Path("data") / "pretrain" / "checkpoints"


def tree_digest(path: Path) -> str | None:
    """sha256 over a file or a directory's files (relative names and bytes); None when absent."""
    if not path.exists():
        return None
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        h.update(str(f.relative_to(path)).encode() if f != path else b".")
        h.update(f.read_bytes())
    return h.hexdigest()


@dataclass
class StageRecord:
    name: str
    seconds: float
    outs: list[str]
    stdout: str = ""


@dataclass
class TinyPipeline:
    root: Path
    prefect_api: str
    stages: list[StageRecord] = field(default_factory=list)

    # ------------------------------------------------------------------ set-up
    @classmethod
    def create(cls, root: Path, prefect_api: str) -> TinyPipeline:
        from flows import profiles
        from flows.overrides import has_key

        copy_project(root)
        git_dvc_init(root)
        extra: profiles.Overrides = {}
        for file, keys in EXTRA.items():
            if (root / file).is_file():
                current = profiles.read_params_file(file, root)
                extra[file] = {k: v for k, v in keys.items() if has_key(current, k)}
        name = PROFILE if PROFILE in profiles.list_profiles(root) else None
        profiles.apply(profiles.resolve(name, extra, root), root)
        git_commit_all(root, f"profile {name} + fault-suite settings")
        return cls(root, prefect_api)

    def env(self, root: Path | None = None) -> dict[str, str]:
        root = root or self.root
        return stage_env(self.prefect_api, f"sqlite:///{root / 'mlflow.db'}", **FAKE_SECRETS)

    def dvc(self, *args: str, root: Path | None = None, timeout: float = 600):
        return run_cmd([PY, "-m", "dvc", *args], cwd=root or self.root, env=self.env(root), timeout=timeout)

    def stage_order(self) -> list[tuple[str, list[str]]]:
        """(stage, outs) in an order DVC can run them (``finetune@<task>`` expanded)."""
        import networkx as nx
        from dvc.repo import Repo

        with Repo(str(self.root)) as repo:
            graph = repo.index.graph
            ordered = [s for s in reversed(list(nx.topological_sort(graph))) if hasattr(s, "cmd") and s.cmd]
            return [(s.name, [o.def_path for o in s.outs if not o.metric and not o.plot]) for s in ordered]

    def build(self, until: str | None = None) -> None:
        """Run every stage (up to ``until``) once, one at a time, recording how long each took."""
        done = {s.name for s in self.stages}
        for name, outs in self.stage_order():
            if name not in done:
                started = time.monotonic()
                res = self.dvc("repro", "--single-item", name, timeout=900)
                assert res.returncode == 0, (
                    f"reference run of {name} failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
                )
                self.stages.append(StageRecord(name, time.monotonic() - started, outs, res.stdout))
            if name == until:
                return

    def record(self, name: str) -> StageRecord:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"stage {name} was not built; built: {[s.name for s in self.stages]}")

    # ------------------------------------------------------------------ copies
    def clone(self, dest: Path) -> Path:
        """A copy of the built workspace without DVC's run cache or the pretraining checkpoints.

        Without the run cache DVC cannot restore a stage's outputs instead of running it; the object cache
        stays (hard links: DVC never writes to a cached file), as after any real run: without it DVC would
        call every output "not in cache" and rerun every stage.
        """

        def ignore(directory: str, names: list[str]) -> set[str]:
            d = Path(directory)
            skip = {n for n in names if n == "__pycache__"}
            if d == self.root / ".dvc":
                skip |= {"cache", "tmp"} & set(names)
            if d == self.root / CHECKPOINTS.parent:
                skip |= {CHECKPOINTS.name} & set(names)
            if d == self.root:
                skip |= {"mlflow.db"} & set(names)
            return skip

        shutil.copytree(self.root, dest, symlinks=True, ignore=ignore)
        cache = self.root / ".dvc" / "cache"
        if cache.is_dir():
            shutil.copytree(
                cache,
                dest / ".dvc" / "cache",
                copy_function=os.link,
                ignore=lambda d, names: {"runs"} & set(names) if Path(d) == cache else set(),
            )
        return dest

    def lock_outs(self, root: Path | None = None) -> dict[str, str]:
        """``{out path: md5}`` of every stage output recorded in ``dvc.lock``."""
        lock = yaml.safe_load(((root or self.root) / "dvc.lock").read_text())
        out = {}
        for stage in lock.get("stages", {}).values():
            for o in stage.get("outs", []):
                out[o["path"]] = o.get("md5")
        return out

    def metrics(self, relpath: str, root: Path | None = None) -> dict[str, Any]:
        return json.loads(((root or self.root) / relpath).read_text())
