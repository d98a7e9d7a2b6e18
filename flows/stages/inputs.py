"""``python -m flows.stages inputs``: the DVC stage ``inputs``, which records what each stage reads from
outside the repository (:mod:`bert_core.inputs`) where that stage's record (``Stage.record``) says."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bert_core.constants import REPO_ROOT
from flows.stages import STAGES, Stage
from flows.stages import resolve as resolve_name


def write_records(root: Path = REPO_ROOT) -> int:
    """Write every stage's record (a foreach stage's, one per item); print the ones that changed. Params that
    do not load are the stage's to refuse: its record then says so, and the stage fails with the message."""
    from bert_core import inputs
    from bert_core.params import ParamsError, load_params
    from bert_core.sources import data_root

    try:
        where = data_root(offline=False)  # an own task's Hub dataset is asked about (its stage loads it)
    except FileNotFoundError as err:  # BERT_DATA_ROOT names no directory: every stage would fail on it
        print(f"inputs stage failed: {err}", file=sys.stderr)
        return 1
    cache, commits = inputs.StatCache(root / ".dvc" / "tmp" / "inputs-stat.json"), inputs.HubCommits()
    changed = []
    for stage in STAGES:
        if stage.record is None:
            continue
        reads = resolve_name(stage.reads)
        params, error = None, {}
        try:
            params = load_params(root / stage.params_file, stage.section, stage.model())
        except ParamsError as err:
            error = {"params": f"missing: {err}"}
        items = [None] if not stage.foreach else list(_foreach_keys(stage, params)) if params else []
        for key in items:
            path = root / stage.expand(stage.record, key or "")
            if params is None:
                content = error
            else:
                previous = inputs.read_record(path)
                content = inputs.record(reads(params, where, key), where, cache, commits, previous)
            if inputs.write_record(path, content):
                changed.append(path.relative_to(root).as_posix())
    cache.save()
    print(f"inputs changed: {', '.join(changed)}" if changed else "inputs unchanged", file=sys.stderr)
    return 0


def _foreach_keys(stage: Stage, params: Any) -> Any:
    """The entries of a foreach stage's params key (``finetune.tasks`` -> ``params.tasks``)."""
    return getattr(params, stage.foreach.removeprefix(f"{stage.section}.")) if stage.foreach else ()
