"""What the pretrain stage records with each registered ``bert-pretrained`` version (tags and description).

The registration itself is :func:`bert_core.tracking.register`, shared by every stage.
"""

from __future__ import annotations

import json

from bert_core.pretrain.params import PretrainParams
from bert_core.pretrain.run import PretrainResult
from bert_core.tracking import FINGERPRINT_TAG, fingerprint, git_commit

#: Description of the registered model, set when the first pretrain run creates it.
REGISTERED_MODEL_DESCRIPTION = (
    "BERT pretrained by the pipeline's `pretrain` stage (HF format); each version's description and card "
    "say how (objectives, size or starting checkpoint, steps)."
)


def version_metadata(result: PretrainResult, params: PretrainParams) -> tuple[dict[str, str], str]:
    """Tags (git commit, DVC params, data statistics, held-out metrics) and description of the new version."""
    heldout = result.metrics["heldout"]
    init = result.metrics.get("init")  # continued pretraining: the checkpoint decides the architecture
    size = "checkpoint" if init else params.model.preset
    objectives = "MLM + NSP" if params.nsp else "MLM"
    tags = {
        # lets fine-tuning runs started from the local models/pretrained name this registered version
        FINGERPRINT_TAG: fingerprint(result.model_dir),
        "git_commit": git_commit(),
        "stage": "pretrain",
        "preset": size,
        "objectives": objectives,
        **({"init_from": str(init.get("source", ""))} if init else {}),
        "dvc_params": json.dumps(params.model_dump(mode="json"), sort_keys=True)[:5000],
        "data_stats": json.dumps(result.data_stats, sort_keys=True)[:5000],
        "heldout_mlm_acc": f"{heldout.get('mlm_acc', float('nan')):.4f}",
        "baseline_mlm_acc": f"{heldout.get('baseline_mlm_acc', float('nan')):.4f}",
        "steps": str(result.metrics["steps"]),
    }
    start = f"continued from {init.get('source')}" if init else params.model.preset
    description = (
        f"{start}, {objectives}, {result.metrics['steps']} steps; held-out MLM accuracy "
        f"{tags['heldout_mlm_acc']} vs {tags['baseline_mlm_acc']} for the most frequent token"
    )
    return tags, description
