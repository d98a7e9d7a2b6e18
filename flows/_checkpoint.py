"""The pipeline's starting checkpoint as a path DVC can track (``finetune.model.source``).

The ``finetune@<task>`` stages depend on ``${finetune.model.source}``: ``models/pretrained`` links them to
the pretrain stage; a released checkpoint's directory has no upstream stage, so no pretraining runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bert_core.released import MINILM_DIR, download_hub_checkpoint, hub_local_dir
from bert_core.sources import is_hub_id
from flows import profiles
from flows.overrides import Overrides, ProfileError, value_at
from flows.stages import get

FILE, KEY = get("finetune").params_file, "finetune.model.source"
PRETRAINED = get("pretrain").outs[0]  # models/pretrained


def track_model_source(overrides: Overrides, root: Path, log: Callable[[str], None] = print) -> Overrides:
    """``overrides`` with ``finetune.model.source`` as a local directory DVC can use as a dep: a Hub id is
    downloaded once to ``models/released/<owner>--<name>`` (offline, an error within seconds).

    Raises:
        ProfileError: a registry URI, or a local directory that does not exist.
        bert_core.released.CheckpointSourceError: a Hub id that cannot be downloaded (offline).
    """
    if not (Path(root) / FILE).is_file():  # a workspace without fine-tuning stages (e.g. a trimmed dvc.yaml)
        return overrides
    source = value_at(profiles.effective_params(FILE, overrides, root), KEY)
    if not isinstance(source, str) or source == PRETRAINED:
        return overrides
    if source.startswith("models:/"):
        raise ProfileError(
            f"{FILE}: {KEY}={source!r}: the pipeline tracks the starting checkpoint as a DVC dep, and a "
            f"registry URI is not a path; run `python -m flows.finetune TASK` for it, or set {KEY} to a directory"
        )
    if is_hub_id(source):
        local = hub_local_dir(source, root)
        if not (local / "config.json").is_file():
            log(f"downloading the Hub checkpoint {source} into {local.relative_to(root)}")
            download_hub_checkpoint(source, local, key=KEY)
        out = {f: dict(k) for f, k in overrides.items()}
        out.setdefault(FILE, {})[KEY] = str(local.relative_to(root))
        return out
    if not (Path(root) / source / "config.json").is_file():
        raise ProfileError(
            f"{FILE}: {KEY}={source!r} is not a Hugging Face model directory (no config.json). Point it at a "
            f"released BERT directory, e.g. `python -m flows.checkpoints unpack-minilm` writes {MINILM_DIR}"
        )
    return overrides
