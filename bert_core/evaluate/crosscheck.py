"""Cross-checks of the finetune stages' summaries before the ``evaluate`` stage trusts them.

A ``results/finetune/<task>/summary.json`` is only summarised when it belongs where it lies:

- its ``task`` is the directory's name (the configured task, ``finetune.tasks``) and a task of the registry
  (:mod:`bert_core.tasks`);
- its ``kind`` and ``main_metric`` are the registry's for that task (a summary of another code version or a
  hand-edited file reads its metrics wrongly);
- every summary was fine-tuned from the same pretrained model (``model.sha``, the content fingerprint the
  finetune stage records, :func:`bert_core.tracking.fingerprint.fingerprint`); summaries without one (older
  runs, the library called without provenance) are not compared;
- where ``dvc.lock`` records the finetune stage of a task (``finetune@<task>``) with an output at the same
  place, the task's results directory is the one that stage committed (its DVC hash, ``md5`` of the
  directory listing, :func:`dvc_dir_hash`): a file copied in or edited afterwards, or outputs written by
  ``python -m flows.finetune`` outside DVC, are named. Tasks that ``dvc.lock`` does not record, results
  outside the lock's repository and pre-3.0 lock entries (``md5-dos2unix``) are not compared.

Every problem names the file, what it holds instead and the stage to re-run; all of them are raised together
as one :class:`SummaryCheckError` (bounded: at most :data:`MAX_LISTED` problems spelled out), before the
report is written, so a failed check never leaves a partial report.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bert_core.finetune.results import FinetuneResult

MAX_LISTED = 5
_MAX_PROBLEM_CHARS = 600


class SummaryCheckError(ValueError):
    """Summaries that do not belong where they lie; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        shown = [p if len(p) <= _MAX_PROBLEM_CHARS else p[: _MAX_PROBLEM_CHARS - 1] + "…" for p in problems]
        more = len(shown) - MAX_LISTED
        text = "; ".join(shown[:MAX_LISTED]) + (f"; and {more} more problem(s)" if more > 0 else "")
        super().__init__(text)


def rerun(task: str) -> str:
    """The command that rebuilds ``task``'s summary."""
    return f"re-run `dvc repro finetune@{task}`"


def check_summary(
    path: Path, task: str, result: FinetuneResult, own_tasks: Mapping[str, Any] | None = None
) -> str | None:
    """The problem with the summary at ``path`` (expected to be ``task``'s; an own task's definition is in
    ``own_tasks``), or ``None``."""
    from bert_core.tasks import TASKS

    spec = TASKS.get(task) or (own_tasks or {}).get(task)
    if spec is None:
        return (
            f"{path} lies in a directory named {task!r}, which is no task of the registry (valid tasks: "
            f"{', '.join(TASKS)}) nor an own task of finetune.tasks; remove that directory or list the task's "
            "stage in finetune.tasks"
        )
    if result.task != task:
        return (
            f"{path} is the summary of task {result.task!r}, not {task!r} (copied or moved from "
            f"{path.parent.parent / str(result.task)}?); {rerun(task)}"
        )
    if not isinstance(result.model, dict) or not result.trials:
        what = "no trials" if isinstance(result.model, dict) else "no 'model' mapping"
        return f"{path}: not a complete fine-tuning summary ({what}); {rerun(task)}"
    says = "the task registry (bert_core.tasks)" if task in TASKS else f"finetune.tasks.{task}.define"
    for field, expected in (("kind", spec.kind), ("main_metric", spec.main_metric)):
        found = getattr(result, field)
        if found != expected:
            return (
                f"{path} records {field} {found!r} for task {task!r}, but {says} says {expected!r} (written by "
                f"another version of the code or params, or edited?); {rerun(task)}"
            )
    return None


def _describe(result: FinetuneResult) -> str:
    model = result.model
    where = model.get("uri") or model.get("source") or "?"
    version = f" {model['model']} v{model['model_version']}" if model.get("model_version") else ""
    return f"{model.get('sha')} ({where}{version})"


def check_provenance(results: Mapping[str, tuple[Path, FinetuneResult]]) -> list[str]:
    """Problems of summaries fine-tuned from a different pretrained model than the others.

    ``results``: task -> (summary path, result). Summaries are grouped by the pretrained model's fingerprint
    (``model.sha``); the largest group is taken as the pipeline's model and every other summary is named.
    With a tie every group is named.
    """
    groups: dict[str, list[str]] = {}
    for task, (_, result) in sorted(results.items()):
        sha = result.model.get("sha")
        if sha:
            groups.setdefault(str(sha), []).append(task)
    if len(groups) < 2:
        return []
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    top = len(ranked[0][1])
    majority = ranked[0] if len(ranked) > 1 and len(ranked[1][1]) < top else None
    problems = []
    for sha, tasks in ranked:
        if majority is not None and sha == majority[0]:
            continue
        others = [t for s, ts in ranked if s != sha for t in ts]
        other_model = " / ".join(sorted({_describe(results[t][1]) for t in others}))
        for task in tasks:
            path, result = results[task]
            problems.append(
                f"{path} was fine-tuned from pretrained model {_describe(result)}, but "
                f"{', '.join(others)} from {other_model}: the tasks come from different pretrained models; "
                f"{rerun(task)} (or the other tasks' stages, if {task}'s model is the current one)"
            )
    return problems


def dvc_dir_hash(path: str | Path) -> str:
    """DVC 3's hash of a directory output (``<md5>.dir``, as ``dvc.lock`` records it).

    Built by ``dvc_data`` (the library DVC hashes its outputs with) as a dry run: no object is written
    anywhere, the staging database is in memory. ``.dvcignore`` is not applied (result directories have none).
    """
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs import MemoryFileSystem
    from dvc_objects.fs.local import LocalFileSystem

    staging = HashFileDB(MemoryFileSystem(), "/staging")
    _, _, tree = build(staging, str(Path(path).resolve()), LocalFileSystem(), "md5", dry_run=True)
    return str(tree.hash_info.value)


def _locked_out(lock: dict[str, Any], stage: str, rel: str) -> dict[str, Any] | None:
    entry = (lock.get("stages") or {}).get(stage)
    if not isinstance(entry, dict):
        return None
    for out in entry.get("outs") or []:
        if isinstance(out, dict) and out.get("path") == rel:
            return out
    return None


def check_lock(lock_path: str | Path | None, results: Mapping[str, tuple[Path, FinetuneResult]]) -> list[str]:
    """Problems of task results directories that differ from what ``dvc.lock`` recorded for their stage.

    ``results``: task -> (summary path, result); the task's results directory is the summary's parent.
    An absent or unreadable ``dvc.lock`` (DVC itself reports a broken one) compares nothing.
    """
    if lock_path is None or not Path(lock_path).is_file():
        return []
    import yaml

    lock_path = Path(lock_path)
    try:
        lock = yaml.safe_load(lock_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return []
    if not isinstance(lock, dict):
        return []
    repo = lock_path.parent.resolve()
    problems = []
    for task, (path, _) in sorted(results.items()):
        out_dir = path.parent
        try:
            rel = out_dir.resolve().relative_to(repo).as_posix()
        except ValueError:
            continue  # results outside the lock's repository
        stage = f"finetune@{task}"
        out = _locked_out(lock, stage, rel)
        if out is None or out.get("hash") != "md5" or not str(out.get("md5", "")).endswith(".dir"):
            continue
        now = dvc_dir_hash(out_dir)
        if now != out["md5"]:
            problems.append(
                f"{out_dir} is not what {stage} committed ({lock_path} records {out['md5']}, now {now}): "
                f"changed after that stage ran (a file copied in or edited, or `python -m flows.finetune {task}` "
                f"run outside DVC); {rerun(task)}, or `dvc commit {stage}` to keep outputs you produced yourself"
            )
    return problems
