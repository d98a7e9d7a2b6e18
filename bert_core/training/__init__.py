"""The training loop shared by pretraining and fine-tuning, and its parts.

Public API (import from here):

- :class:`Trainer`, :class:`TrainConfig`, :class:`Objective`, :class:`StepOutput`, :class:`FitResult`,
  :class:`TrainingInterrupted`, :class:`NonFiniteLossError` (``loop``, ``config``, ``objective``)
- :func:`build_optimizer`, :func:`param_groups`, :class:`Lamb` (``optim``)
- :class:`LinearWarmupDecay` (``schedule``)
- :class:`DistContext`, :func:`setup_distributed`, :func:`teardown_distributed` (``distributed``)
- metric sinks (:func:`bert_core.tracking.mlflow_sink`, ...) live in :mod:`bert_core.tracking`
- :func:`bert_train_flops`, :func:`peak_tflops`, :func:`mfu` (``flops``)
- :class:`TrainingCheckpointError`, :func:`list_checkpoints`, :func:`load_checkpoint` (``checkpoint``)
"""

from bert_core.training.checkpoint import TrainingCheckpointError, list_checkpoints, load_checkpoint
from bert_core.training.config import FitResult, NonFiniteLossError, TrainConfig, TrainingInterrupted
from bert_core.training.distributed import DistContext, setup_distributed, teardown_distributed
from bert_core.training.flops import bert_train_flops, mfu, peak_tflops
from bert_core.training.loop import Trainer
from bert_core.training.objective import Objective, StepOutput
from bert_core.training.optim import Lamb, build_optimizer, param_groups
from bert_core.training.schedule import LinearWarmupDecay

__all__ = [
    "DistContext",
    "FitResult",
    "Lamb",
    "LinearWarmupDecay",
    "NonFiniteLossError",
    "Objective",
    "StepOutput",
    "TrainConfig",
    "Trainer",
    "TrainingCheckpointError",
    "TrainingInterrupted",
    "bert_train_flops",
    "build_optimizer",
    "list_checkpoints",
    "load_checkpoint",
    "mfu",
    "param_groups",
    "peak_tflops",
    "setup_distributed",
    "teardown_distributed",
]
