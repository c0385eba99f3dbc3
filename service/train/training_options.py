"""The training-realism options of ``workload:``: precision, gradient clipping, LR schedule.

Each is a small pure piece the worker loop (service/train/loop.py) calls at one place:

    precision = Precision(wl_cfg.precision, device)
    model = precision.cast(model)                    # bf16: weights (so DDP buckets) in bf16
    with precision.autocast():                       # bf16_autocast: fp32 weights, bf16 matmuls
        loss = wl.step_loss(model, to_device(batch, device, precision.input_dtype))
    ...                                              # backward; the hook averages the buckets
    clip_gradients(params, wl_cfg.grad_clip_norm)    # after the hook: the averaged gradient
    set_lr(optimizer, lr_at(step, wl_cfg))           # a pure function of the step

``precision``:
    fp32           everything float32 (the default)
    bf16_autocast  float32 weights, gradients and DDP buckets; the forward (and loss) runs
                   under ``torch.autocast(dtype=bfloat16)``, as mixed-precision training does
    bf16           the model's floating parameters and buffers are cast to bfloat16, so its
                   gradients and DDP's buckets are bf16 and every comm hook gets bf16 buckets;
                   floating inputs are cast to bf16 too (integer token ids are left alone)

``grad_clip_norm``: clip the total L2 norm of the gradients to this value after the comm
hook has written the averaged gradient back (as real DDP training clips: the same clipped
gradient on every rank). A non-finite total norm leaves the gradients exactly as the hook
wrote them (torch's own clip would multiply every gradient by NaN), so the NaN check still
names the hook's non-finite output and its parameters, not every parameter of the model.

``lr_schedule`` with ``lr_warmup_steps`` (its own count, separate from ``warmup_steps``,
the steps excluded from throughput: a measurement setting must not change the training):
    constant  lr on every step after a linear warm-up
    cosine    linear warm-up, then cosine decay towards 0 over the remaining steps
Linear warm-up: step s (1-based) of the first ``lr_warmup_steps`` trains at lr * s / warm-up.
The rate is a function of the step number alone, so a resumed trial needs no scheduler state.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch

PRECISIONS = ("fp32", "bf16_autocast", "bf16")
LR_SCHEDULES = ("constant", "cosine")


class Precision:
    """What ``precision`` means for the model, the inputs and the forward pass."""

    def __init__(self, name: str, device) -> None:
        if name not in PRECISIONS:
            raise ValueError(f"precision {name!r}: allowed {', '.join(PRECISIONS)}")
        self.name = name
        self.device = torch.device(device)
        # the dtype the model's weights (and so its gradients and DDP buckets) are kept in
        self.param_dtype = torch.bfloat16 if name == "bf16" else torch.float32
        # floating inputs are cast to the weights' dtype (None: left as the dataset gives them)
        self.input_dtype = torch.bfloat16 if name == "bf16" else None

    def cast(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model on its device, in the weights' dtype (before DDP wraps it)."""
        if self.name == "bf16":
            return model.to(device=self.device, dtype=torch.bfloat16)
        return model.to(self.device)

    def autocast(self):
        """The context the forward pass and loss run in."""
        if self.name == "bf16_autocast":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()


def clip_gradients(parameters, max_norm) -> None:
    """Scale the gradients so their total L2 norm is at most ``max_norm`` (None: no-op).

    Same factor as ``torch.nn.utils.clip_grad_norm_`` (max_norm / (norm + 1e-6), capped at 1)
    where the norm is finite; where it is not, the gradients are left untouched (see the
    module doc). No host sync: the choice is a ``torch.where`` on the device.
    """
    if max_norm is None:
        return
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    coef = torch.where(norm.isfinite(), (max_norm / (norm + 1e-6)).clamp(max=1.0), torch.ones_like(norm))
    torch._foreach_mul_(grads, coef.to(grads[0].device))


def lr_at(step: int, lr: float, steps: int, schedule: str = "constant", warmup: int = 0) -> float:
    """The learning rate of optimizer step ``step`` (1-based) of ``steps``."""
    if warmup and step <= warmup:
        return lr * step / warmup
    if schedule == "cosine":
        done = (step - warmup - 1) / max(steps - warmup, 1)  # 0 on the first step after warm-up
        return lr * 0.5 * (1.0 + math.cos(math.pi * done))
    return lr


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
