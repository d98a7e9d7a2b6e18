"""The ``pretrain`` stage: MLM + NSP pretraining of a BERT preset (see :mod:`bert_core.pretrain.run`).

- ``params``: :class:`PretrainParams` and its parts (model, optimizer, phases).
- ``inputs``: the checks of the vocab and data before training, the unigram prior of the MLM targets.
- ``objective``: the MLM + NSP objective as a training :class:`~bert_core.training.Objective`.
- ``run``: :func:`pretrain` (phases, evaluation, the model in Hugging Face format) and :func:`write_curves`.

The instances themselves are read by :mod:`bert_core.pretrain_data.loader`, which lives with the package
that owns their on-disk format.
"""

from bert_core.pretrain.inputs import check_inputs, unigram_log_prior
from bert_core.pretrain.objective import PretrainingObjective
from bert_core.pretrain.params import ModelParams, OptimizerParams, PhaseParams, PretrainParams
from bert_core.pretrain.run import PretrainResult, pretrain, save_model, write_curves

__all__ = [
    "ModelParams",
    "OptimizerParams",
    "PhaseParams",
    "PretrainParams",
    "PretrainResult",
    "PretrainingObjective",
    "check_inputs",
    "pretrain",
    "save_model",
    "unigram_log_prior",
    "write_curves",
]
