"""Batches to the device, shared by the training loop and prediction (a served model carries this module)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The batch's tensors on ``device``. To a GPU they go through pinned memory: a copy from pageable
    memory may make the host wait for the device's queue, and the host would no longer run ahead."""
    pin = device.type == "cuda"
    return {
        k: (v.pin_memory() if pin and v.device.type == "cpu" else v).to(device, non_blocking=True)
        if isinstance(v, Tensor)
        else v
        for k, v in batch.items()
    }
