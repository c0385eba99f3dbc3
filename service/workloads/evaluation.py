"""Evaluation: a workload's eval metrics on the bare module (its eval_fn, or the default eval of
its loss form), in eval mode under no_grad, train mode restored."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Mapping, Optional

import torch
import torch.nn as nn
from torch.utils.data import Dataset

from service.text import short_value
from service.workloads.batches import batch_size_of, collate_batch, fetch_batch, to_device
from service.workloads.contract import BatchLoss, LossFn, Workload


def _batches(part: range, batch_size: int):
    """``part`` (sample indices, contiguous) in index tensors of at most ``batch_size``."""
    for start in range(part.start, part.stop, batch_size):
        yield torch.arange(start, min(start + batch_size, part.stop))


@torch.no_grad()
def _batch_loss_sums(model: nn.Module, eval_set: Dataset, batch_loss: BatchLoss, part: range, batch_size: int,
                     device=None, float_dtype: Optional[torch.dtype] = None) -> tuple[float, int]:
    """(sum over the batches of ``batch_loss`` x the batch's samples, samples) over ``part``."""
    total, samples = 0.0, 0
    for idx in _batches(part, batch_size):
        batch = collate_batch(eval_set, idx)
        n = batch_size_of(batch)
        if device is not None:
            batch = to_device(batch, device, float_dtype)
        total += float(batch_loss(model, batch)) * n
        samples += n
    return total, samples


def evaluate_batch_loss(model: nn.Module, eval_set: Dataset, batch_loss: BatchLoss, batch_size: int = 512,
                        device=None, float_dtype: Optional[torch.dtype] = None) -> float:
    """The mean ``batch_loss`` over ``eval_set``, weighted by the samples of each batch (the
    default eval of a ``batch_loss`` workload without ``eval_fn``). Train mode is restored."""
    with _eval_mode(model):
        total, samples = _batch_loss_sums(model, eval_set, batch_loss, range(len(eval_set)), batch_size,
                                          device, float_dtype)
    return total / samples


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode, its train/eval mode restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def eval_share(wl: Workload, model: nn.Module, rank: int, world_size: int, device=None,
               float_dtype: Optional[torch.dtype] = None, batch_size: int = 512) -> Optional[list[float]]:
    """What rank ``rank`` of ``world_size`` adds to the default eval: its contiguous share of the
    eval set's samples, as sums [loss x positions, correct, positions] (``loss_fn`` form) or [loss
    x samples, 0, samples] (``batch_loss`` form); summed over the ranks, ``metrics_from_sums`` makes
    the eval metrics. None for a workload with an ``eval_fn`` (it sees the whole set at once)."""
    if wl.eval_fn is not None:
        return None
    n = len(wl.eval_set)
    part = range(rank * n // world_size, (rank + 1) * n // world_size)
    with _eval_mode(model):
        if wl.batch_loss is not None:
            total, samples = _batch_loss_sums(model, wl.eval_set, wl.batch_loss, part, batch_size, device, float_dtype)
            return [total, 0.0, float(samples)]
        return [float(v) for v in _loss_fn_sums(model, wl.eval_set, wl.loss_fn, part, batch_size, device, float_dtype)]


def metrics_from_sums(wl: Workload, sums: list[float]) -> dict[str, float]:
    """The default eval's metrics from ``eval_share``'s sums added over every rank."""
    loss, correct, count = sums
    if wl.batch_loss is not None:
        return {"eval_loss": loss / count}
    return {"eval_loss": loss / count, "eval_accuracy": correct / count}


def evaluate_workload(wl: Workload, model: nn.Module, device=None,
                      float_dtype: Optional[torch.dtype] = None) -> dict[str, float]:
    """The workload's eval metrics on ``model`` (the bare module): its ``eval_fn`` if it has
    one, else eval_loss + eval_accuracy (``loss_fn`` form) or eval_loss (``batch_loss`` form).
    Raises ValueError (one line) when an ``eval_fn`` returns anything but {name: number}."""
    if wl.eval_fn is not None:
        with _eval_mode(model), torch.no_grad():
            metrics = wl.eval_fn(model, wl.eval_set)
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
    with _eval_mode(model):
        total_loss, correct, positions = _loss_fn_sums(model, eval_set, loss_fn, range(len(eval_set)), batch_size,
                                                       device, float_dtype)
    return total_loss / positions, correct / positions


@torch.no_grad()
def _loss_fn_sums(model: nn.Module, eval_set: Dataset, loss_fn: LossFn, part: range, batch_size: int,
                  device=None, float_dtype: Optional[torch.dtype] = None) -> tuple[float, int, int]:
    """(sum of loss_fn x the batch's positions, correct positions, positions) over ``part``."""
    total_loss, correct, positions = 0.0, 0, 0
    for idx in _batches(part, batch_size):
        x, y = fetch_batch(eval_set, idx)
        if device is not None or float_dtype is not None:
            x, y = to_device((x, y), device or x.device, float_dtype)
        logits = model(x)
        n = y.numel()
        total_loss += float(loss_fn(logits, y)) * n
        correct += int((logits.argmax(dim=-1) == y).sum())
        positions += n
    return total_loss, correct, positions
