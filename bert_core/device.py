"""Tensors between host and device without the host waiting: batches to the device, results back. Shared by
the training loop and prediction (a served model carries this module)."""

from __future__ import annotations

from typing import Any, NamedTuple

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


class HostCopy(NamedTuple):
    """A tensor on its way to host memory, the host not waiting for the device: on a GPU a copy into pinned
    memory behind an event recorded on the stream of the tensor's own device (the stream the copy goes to);
    elsewhere the tensor itself. :meth:`wait` waits for that copy alone."""

    tensor: Tensor
    ready: torch.cuda.Event | None

    @classmethod
    def start(cls, tensor: Tensor) -> HostCopy:
        if tensor.device.type != "cuda":
            return cls(tensor, None)
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(tensor.device))
        return cls(host, ready)

    def wait(self) -> Tensor:
        """The tensor in host memory, once the copy is done."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.tensor
