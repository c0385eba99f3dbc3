"""Evaluation: a workload's eval metrics on the bare module (its eval_fn, or the default eval of
its loss form), in eval mode under no_grad, train mode restored."""

from __future__ import annotations

from typing import Mapping, Optional

import torch
import torch.nn as nn
from torch.utils.data import Dataset

from service.text import short_value
from service.workloads.batches import batch_size_of, collate_batch, fetch_batch, to_device
from service.workloads.contract import BatchLoss, LossFn, Workload


@torch.no_grad()
def evaluate_batch_loss(model: nn.Module, eval_set: Dataset, batch_loss: BatchLoss, batch_size: int = 512,
                        device=None, float_dtype: Optional[torch.dtype] = None) -> float:
    """The mean ``batch_loss`` over ``eval_set``, weighted by the samples of each batch (the
    default eval of a ``batch_loss`` workload without ``eval_fn``). Train mode is restored."""
    was_training = model.training
    model.eval()
    try:
        total, samples = 0.0, 0
        for start in range(0, len(eval_set), batch_size):
            batch = collate_batch(eval_set, torch.arange(start, min(start + batch_size, len(eval_set))))
            n = batch_size_of(batch)
            if device is not None:
                batch = to_device(batch, device, float_dtype)
            total += float(batch_loss(model, batch)) * n
            samples += n
    finally:
        model.train(was_training)
    return total / samples


def evaluate_workload(wl: Workload, model: nn.Module, device=None,
                      float_dtype: Optional[torch.dtype] = None) -> dict[str, float]:
    """The workload's eval metrics on ``model`` (the bare module): its ``eval_fn`` if it has
    one, else eval_loss + eval_accuracy (``loss_fn`` form) or eval_loss (``batch_loss`` form).
    Raises ValueError (one line) when an ``eval_fn`` returns anything but {name: number}."""
    if wl.eval_fn is not None:
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                metrics = wl.eval_fn(model, wl.eval_set)
        finally:
            model.train(was_training)
        if not isinstance(metrics, Mapping) or not all(
                isinstance(k, str) and isinstance(v, (int, float, torch.Tensor)) and not isinstance(v, bool)
                for k, v in metrics.items()):
            raise ValueError(f"eval_fn returned {short_value(metrics)}; expected a dict of metric name -> number")
        return {k: float(v) for k, v in metrics.items()}
    if wl.batch_loss is not None:
        return {"eval_loss": evaluate_batch_loss(model, wl.eval_set, wl.batch_loss, device=device,
                                                 float_dtype=float_dtype)}
    eval_loss, eval_accuracy = evaluate(model, wl.eval_set, wl.loss_fn, device=device, float_dtype=float_dtype)
    return {"eval_loss": eval_loss, "eval_accuracy": eval_accuracy}


@torch.no_grad()
def evaluate(
    model: nn.Module,
    eval_set: Dataset,
    loss_fn: LossFn,
    batch_size: int = 512,
    device: torch.device | str | None = None,
    float_dtype: Optional[torch.dtype] = None,
) -> tuple[float, float]:
    """(eval_loss, eval_accuracy) over the whole eval set.

    eval_loss is loss_fn's mean weighted by the positions in each batch; accuracy is the
    argmax match rate over every position (so classification and the char LM share one
    eval). Pass the bare module (ddp_model.module) so no DDP collectives run. Batches are
    moved to `device` when given (the model must already be there). The model's
    train/eval mode is restored afterwards. ``float_dtype``: floating inputs are cast to it
    (a bf16 model).
    """
    was_training = model.training
    model.eval()
    try:
        total_loss, correct, positions = 0.0, 0, 0
        for start in range(0, len(eval_set), batch_size):
            idx = torch.arange(start, min(start + batch_size, len(eval_set)))
            x, y = fetch_batch(eval_set, idx)
            if device is not None or float_dtype is not None:
                x, y = to_device((x, y), device or x.device, float_dtype)
            logits = model(x)
            n = y.numel()
            total_loss += float(loss_fn(logits, y)) * n
            correct += int((logits.argmax(dim=-1) == y).sum())
            positions += n
    finally:
        model.train(was_training)
    return total_loss / positions, correct / positions
