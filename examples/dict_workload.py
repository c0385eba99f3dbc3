"""A user's own workload in the batch_loss form: dict batches, its own loss and its own eval.

    workload:
      name: examples.dict_workload:build

The function returns a plain dict (no import from this project needed) with

    model       a torch.nn.Module (called however your batch_loss calls it)
    train_set   any map-style torch Dataset; here each item is a dict of tensors
    eval_set    the same, held out
    batch_loss  batch_loss(model, batch) -> scalar tensor. ``batch`` is the whole batch as
                torch's default collate builds it from the items: a dict of stacked tensors
                for dict items (a tuple of tensors for tuple items), already on the
                worker's device (floating tensors in bf16 under `precision: bf16`)
    eval_fn     optional: eval_fn(model, eval_set) -> {metric name: float}, called on rank 0
                with the bare model in eval mode under torch.no_grad(); without it the
                service reports eval_loss, the mean batch_loss over eval_set

The same rules as examples/custom_workload.py: deterministic for a seed, no network, and
importable on every worker. The service checks at the start of each trial that batch_loss
returns a scalar, that the items have the same keys, and that every rank built the same
weights and data; a workload that fails one of them is stopped with one line saying which.

This example: breast-cancer screening (scikit-learn's bundled data, 30 features) as dict
items {"features", "label"}, a small MLP with a label-smoothed loss, and an eval reporting
loss, accuracy and recall of the malignant class.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset


class Records(Dataset):
    """One patient per index, as a dict: the shape of data most real pipelines hand over."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor):
        self.features, self.labels = features, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"features": self.features[i], "label": self.labels[i]}


def batch_loss(model, batch):
    logits = model(batch["features"])
    return F.cross_entropy(logits, batch["label"], label_smoothing=0.1)


@torch.no_grad()
def eval_fn(model, eval_set):
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype  # bf16 under `precision: bf16`
    x = eval_set.features.to(device=device, dtype=dtype)
    y = eval_set.labels.to(device)
    logits = model(x)
    predicted = logits.argmax(-1)
    malignant = y == 0  # scikit-learn's target 0 is malignant
    return {
        "eval_loss": float(F.cross_entropy(logits.float(), y)),
        "eval_accuracy": float((predicted == y).float().mean()),
        "eval_recall_malignant": float((predicted[malignant] == 0).float().mean()),
    }


def build(seed: int):
    from sklearn.datasets import load_breast_cancer  # ships inside scikit-learn

    data = load_breast_cancer()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))  # a fixed split
    eval_idx, train_idx = order[:100], order[100:]
    mean, std = x[train_idx].mean(0), x[train_idx].std(0)
    x = (x - mean) / std
    model = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 2))  # torch is seeded for you
    return {
        "model": model,
        "train_set": Records(x[train_idx], y[train_idx]),
        "eval_set": Records(x[eval_idx], y[eval_idx]),
        "batch_loss": batch_loss,
        "eval_fn": eval_fn,
    }
