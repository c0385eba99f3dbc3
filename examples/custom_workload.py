"""A user's own workload, for a sweep config's `workload.name`.

Use it from the repository root (so `examples` is importable) with:

    workload:
      name: examples.custom_workload:build

The sweep imports ONLY the module named before the colon and calls the function after it
with the trial's seed, on every worker. The function returns a Workload, or - as here, so
this file needs nothing from this project - a plain tuple

    (model, train_set, eval_set, loss_fn)

with
    model      a torch.nn.Module; model(x) returns logits shaped (..., C)
    train_set  a torch Dataset: dataset[i] -> (x, y); y holds class indices shaped (...)
               (a TensorDataset is fastest: workers gather a whole batch by index at once)
    eval_set   the same, held out; eval accuracy is the argmax match rate over all positions
    loss_fn    loss_fn(logits, targets) -> scalar tensor

Rules the sweep relies on:
    - Deterministic for a seed: every rank must build the same initial weights. The sweep
      already seeds torch's RNG with `seed` before calling you; seed anything else
      (numpy, random) yourself.
    - No downloads and no network: workers may run where there is none.
    - The module must be importable on every worker (installed, on PYTHONPATH, or inside
      the working directory the sweep ships to the workers).

This example: a small MLP classifying scikit-learn's bundled breast-cancer data
(569 samples, 30 features, 2 classes).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset


def build(seed: int):
    from sklearn.datasets import load_breast_cancer  # ships inside scikit-learn

    data = load_breast_cancer()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.long)

    # A fixed split (not seed-dependent) keeps eval numbers comparable across seeds.
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    eval_idx, train_idx = order[:100], order[100:]

    # Standardize each feature with the training rows' statistics.
    mean, std = x[train_idx].mean(0), x[train_idx].std(0)
    x = (x - mean) / std

    torch.manual_seed(seed)  # the sweep does this too; harmless, and keeps the file standalone
    model = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 2))

    return (
        model,
        TensorDataset(x[train_idx], y[train_idx]),
        TensorDataset(x[eval_idx], y[eval_idx]),
        F.cross_entropy,
    )
