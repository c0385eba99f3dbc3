"""Batches: a dataset's samples gathered by index (one gather per tensor where it can), in the
shape each loss form takes, and moved to the device."""

from __future__ import annotations

from typing import Mapping, Optional

import torch
from torch.utils.data import Dataset, TensorDataset, default_collate


class DictTensorDataset(Dataset):
    """A dataset of dict items ``{key: tensor[i]}`` over equal-length tensors, gathered a
    whole batch at a time by :func:`collate_batch` (the dict twin of ``TensorDataset``)."""

    def __init__(self, **tensors: torch.Tensor):
        lengths = {len(t) for t in tensors.values()}
        if len(lengths) != 1:
            raise ValueError(f"DictTensorDataset: tensors of different lengths {sorted(lengths)}")
        self.tensors = tensors

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def __getitem__(self, i) -> dict[str, torch.Tensor]:
        return {k: t[i] for k, t in self.tensors.items()}


def fetch_batch(dataset: Dataset, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) for a 1-D tensor of indices: one gather for a TensorDataset, else stacked items."""
    if isinstance(dataset, TensorDataset):
        x, y = dataset.tensors[0][indices], dataset.tensors[1][indices]
        return x, y
    items = [dataset[int(i)] for i in indices]
    xs, ys = zip(*items)
    return torch.stack([torch.as_tensor(x) for x in xs]), torch.stack([torch.as_tensor(y) for y in ys])


def collate_batch(dataset: Dataset, indices: torch.Tensor):
    """The batch of ``indices`` as torch's default collate builds it, a tuple for tuple items.

    One gather per tensor for a ``TensorDataset`` (a tuple) or a ``DictTensorDataset`` (a
    dict); any other dataset's items go through ``torch.utils.data.default_collate``, whose
    list for tuple items is returned as a tuple.
    """
    if isinstance(dataset, TensorDataset):
        return tuple(t[indices] for t in dataset.tensors)
    if isinstance(dataset, DictTensorDataset):
        return {k: t[indices] for k, t in dataset.tensors.items()}
    batch = default_collate([dataset[int(i)] for i in indices])
    return tuple(batch) if isinstance(batch, list) else batch


def to_device(batch, device, float_dtype: Optional[torch.dtype] = None):
    """``batch`` (a tensor, or a tuple/list/dict of them, nested) moved to ``device``, its
    floating tensors cast to ``float_dtype`` when given (a bf16 model takes bf16 inputs)."""
    if isinstance(batch, torch.Tensor):
        if float_dtype is not None and batch.is_floating_point():
            return batch.to(device=device, dtype=float_dtype, non_blocking=True)
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, float_dtype) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device, float_dtype) for v in batch)
    return batch


def batch_size_of(batch) -> int:
    """Samples in a collated batch: the first dimension of its first tensor."""
    while not isinstance(batch, torch.Tensor):
        batch = next(iter(batch.values())) if isinstance(batch, Mapping) else batch[0]
    return int(batch.shape[0]) if batch.dim() else 1
