"""Optimizers: AdamW (fused kernel where the device has one) and LAMB, with BERT's parameter groups.

Weight decay 0.01 applies to weight matrices and embeddings only, not to biases and LayerNorm
parameters (Google's ``optimization.py``: ``exclude_from_weight_decay=["LayerNorm", "layer_norm",
"bias"]``). LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning") rescales each
tensor's Adam update by the trust ratio ``||w|| / ||update||``; as in the reference implementation,
the excluded (no-decay) tensors are also excluded from that layer adaptation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Literal

import torch
from torch import nn

log = logging.getLogger(__name__)

OptimizerName = Literal["adamw", "lamb"]


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters into a decayed and a non-decayed group.

    A parameter is not decayed when it belongs to a LayerNorm module, is named ``*bias``, or has
    "LayerNorm"/"layer_norm" in its name. Tied parameters appear once.

    Returns:
        ``[{"params": decayed, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]``
        (empty groups are left out).
    """
    no_decay_ids: set[int] = set()
    for mod_name, module in model.named_modules():
        for p_name, p in module.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if (
                isinstance(module, nn.LayerNorm)
                or p_name == "bias"
                or "LayerNorm" in full
                or "layer_norm" in full
            ):
                no_decay_ids.add(id(p))
    decay, no_decay = [], []
    for p in model.parameters():  # de-duplicates tied parameters
        if p.requires_grad:
            (no_decay if id(p) in no_decay_ids else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


class Lamb(torch.optim.Optimizer):
    """LAMB with bias-corrected Adam moments and decoupled weight decay inside the trust ratio.

    For each tensor ``w`` with gradient ``g`` (step ``t``)::

        m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
        u = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * w
        r = ||w|| / ||u||   (1 when either norm is 0, or for groups with ``adapt=False``)
        w = w - lr * r * u

    Args:
        params: parameters or groups; a group may set ``adapt`` (default: ``weight_decay > 0``).
        lr: learning rate.
        betas: Adam coefficients.
        eps: added to the denominator.
        weight_decay: default decoupled weight decay.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        if lr <= 0 or eps <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid LAMB hyperparameters lr={lr} betas={betas} eps={eps}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            b1, b2 = group["betas"]
            wd, eps, lr = group["weight_decay"], group["eps"], group["lr"]
            adapt = group.get("adapt", wd > 0)
            grads = [p.grad for p in params]
            ms, vs = [], []
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                ms.append(state["exp_avg"])
                vs.append(state["exp_avg_sq"])
            t = float(self.state[params[0]]["step"])
            torch._foreach_lerp_(ms, grads, 1 - b1)
            torch._foreach_mul_(vs, b2)
            torch._foreach_addcmul_(vs, grads, grads, value=1 - b2)
            denom = torch._foreach_div(vs, 1 - b2**t)
            torch._foreach_sqrt_(denom)
            torch._foreach_add_(denom, eps)
            updates = torch._foreach_div(ms, denom)
            torch._foreach_div_(updates, 1 - b1**t)
            if wd > 0:
                torch._foreach_add_(updates, params, alpha=wd)
            if adapt:
                w_norms = torch._foreach_norm(params)
                u_norms = torch._foreach_norm(updates)
                for u, wn, un in zip(updates, w_norms, u_norms):
                    ratio = torch.where((wn > 0) & (un > 0), wn / un, torch.ones_like(wn))
                    u.mul_(ratio)
            torch._foreach_add_(params, updates, alpha=-lr)
        return loss


def build_optimizer(
    model: nn.Module,
    *,
    name: OptimizerName = "adamw",
    lr: float,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """The optimizer for ``model`` with BERT's parameter groups.

    Args:
        model: the (unwrapped) model whose parameters are optimized.
        name: "adamw" or "lamb".
        lr: initial (peak) learning rate; the schedule overwrites it every step.
        weight_decay: decay of weight matrices (0.01 in the paper).
        betas: Adam coefficients (0.9, 0.999).
        eps: Adam epsilon (1e-6 as Google's BERT).
        fused: AdamW's fused kernel; None uses it when the parameters' device supports it.

    Returns:
        A ``torch.optim.Optimizer``.
    """
    groups = param_groups(model, weight_decay)
    if name == "lamb":
        return Lamb(groups, lr=lr, betas=betas, eps=eps)
    if name != "adamw":
        raise ValueError(f"optimizer must be 'adamw' or 'lamb', got {name!r}")
    if fused is None or fused:
        try:
            return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=True)
        except (RuntimeError, ValueError) as exc:  # device or dtype without a fused kernel
            if fused:
                raise
            log.info("fused AdamW unavailable (%s); using the foreach implementation", exc)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, foreach=True)
