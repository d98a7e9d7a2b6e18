"""``python -m flows.stages inputs``: the DVC stage ``inputs``, which records what each stage reads from
outside the repository (:mod:`bert_core.inputs`) where that stage's record (``Stage.record``) says."""

from __future__ import annotations

import sys
from pathlib import Path

from bert_core.constants import REPO_ROOT
from flows.stages import INPUTS_DIR, STAGES
from flows.stages import resolve as resolve_name


def write_records(root: Path = REPO_ROOT) -> int:
    """Write every stage's record (a foreach stage's, one per item); print the ones that changed. Params that
    do not load are the stage's to refuse: its record then says so, and the stage fails with the message."""
    from bert_core import inputs
    from bert_core.params import ParamsError, load_params
    from bert_core.sources import data_root

    where = data_root()
    cache = inputs.StatCache(root / INPUTS_DIR / ".stat.json")
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
        items = [None] if not stage.foreach else list(params.tasks) if params is not None else []
        for key in items:
            content = error if params is None else inputs.record(reads(params, where, key), where, cache)
            path = root / stage.expand(stage.record, key or "")
            if inputs.write_record(path, content):
                changed.append(path.relative_to(root).as_posix())
    cache.save()
    print(f"inputs changed: {', '.join(changed)}" if changed else "inputs unchanged", file=sys.stderr)
    return 0
