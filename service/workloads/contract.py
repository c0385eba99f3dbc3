"""The workload contract: what a trial trains (``Workload``, in its two loss forms), how a
built-in is listed (``WorkloadInfo``), and the defaults a config may leave out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

from service.workloads.batches import collate_batch, fetch_batch

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
BatchLoss = Callable[[nn.Module, Any], torch.Tensor]
EvalFn = Callable[[nn.Module, Dataset], Mapping[str, float]]


@dataclass
class Workload:
    """What one trial trains, in one of two forms (exactly one of ``loss_fn``/``batch_loss``):

    - ``loss_fn(logits, targets)``: datasets yield ``(x, y)``, ``model(x)`` gives logits
      ``(..., C)``, ``y`` class indices; the default eval reports eval_loss and eval_accuracy;
    - ``batch_loss(model, batch) -> scalar tensor``: ``batch`` is the whole batch as torch's
      default collate builds it from the dataset's items (a tuple of tensors for tuple items,
      a dict of tensors for dict items); the default eval reports eval_loss, the mean
      ``batch_loss`` over the eval set (weighted by samples).

    ``eval_fn(model, eval_set) -> {metric: float}`` replaces the default eval (the model is
    the bare module, in eval mode, under no_grad; move batches to its device yourself).

    ``shard``: the blocks an fsdp trial shards one by one before the root (module paths, whose
    children are each a block when the path is a ModuleList or Sequential, or class names);
    empty: every direct child that holds parameters. ``workload.shard`` in a config overrides it.
    """

    model: nn.Module
    train_set: Dataset
    eval_set: Dataset
    loss_fn: Optional[LossFn] = None
    batch_loss: Optional[BatchLoss] = None
    eval_fn: Optional[EvalFn] = None
    shard: tuple[str, ...] = ()

    def fetch(self, dataset: Dataset, indices: torch.Tensor):
        """The batch of ``indices``, as this workload's loss takes it (on the CPU)."""
        if self.batch_loss is not None:
            return collate_batch(dataset, indices)
        return fetch_batch(dataset, indices)

    def step_loss(self, model: nn.Module, batch) -> torch.Tensor:
        """The training loss of one (device-side) batch: the one code path for both forms."""
        if self.batch_loss is not None:
            return self.batch_loss(model, batch)
        x, y = batch
        return self.loss_fn(model(x), y)


# What a config may leave out (a first config should not need them): the global batch,
# and a learning rate per optimizer, from the presets these workloads run in (tune_configs/).
DEFAULT_GLOBAL_BATCH = 64
DEFAULT_LR = {"sgd": 0.05, "adamw": 0.001}


@dataclass(frozen=True)
class WorkloadInfo:
    """A built-in workload as listed to users (config errors, --help, docs), with the global
    batch and learning rates a config gets when it names none."""

    description: str
    input_shape: tuple[int, ...]  # one sample's x
    num_classes: int
    builder: Callable[[int], Workload]
    global_batch_size: int = DEFAULT_GLOBAL_BATCH
    lr: tuple[tuple[str, float], ...] = tuple(DEFAULT_LR.items())  # (optimizer, lr) pairs


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position: logits (..., C), targets (...)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
