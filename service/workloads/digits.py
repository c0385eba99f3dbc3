"""mlp_digits and cnn_digits: scikit-learn's handwritten digits (the data ships inside it)."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

from service.workloads.contract import Workload, cross_entropy

DIGITS_EVAL_FRACTION = 0.2
DIGITS_SPLIT_SEED = 1234  # the split is the same for every seed: eval numbers stay comparable


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1797 8x8 digits as (pixels float32 (1797, 64), labels int64), the values
    ``sklearn.datasets.load_digits()`` gives, read from the data file that ships inside
    scikit-learn without importing it: the import costs every rank of every trial 1.5 CPU-s
    (docs/performance.md, "The first hour")."""
    import gzip
    import importlib.util
    import os

    import numpy as np

    spec = importlib.util.find_spec("sklearn")  # finds the package; runs none of it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the digits workloads need scikit-learn (pip install scikit-learn): its data file")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return torch.tensor(data[:, :-1], dtype=torch.float32), torch.tensor(data[:, -1].astype(int), dtype=torch.long)


def _digits_tensors() -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's 1797 8x8 digits, standardized, split train/eval (a fixed split)."""
    x, y = load_digits()
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(DIGITS_SPLIT_SEED))
    n_eval = int(len(y) * DIGITS_EVAL_FRACTION)
    eval_idx, train_idx = order[:n_eval], order[n_eval:]
    # Standardize with the training pixels' mean/std: centred inputs let plain SGD start fast.
    mean, std = x[train_idx].mean(), x[train_idx].std()
    x = (x - mean) / std
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[eval_idx], y[eval_idx])


# Sizes: each built-in is sized so that a 300-step trial at world size 2 trains for about a
# minute on 2 cores (measured in docs/workloads.md, "Sizing"). The MLP has 8.5M parameters
# (34 MB of gradient in 8 tensors): the communication-heavy one.
MLP_HIDDEN = 2048


class DigitsMLP(nn.Module):
    def __init__(self, hidden: int = MLP_HIDDEN, num_classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(64, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, 64)
        return self.net(x)


def build_mlp_digits(seed: int) -> Workload:
    train_set, eval_set = _digits_tensors()
    return Workload(DigitsMLP(), train_set, eval_set, cross_entropy, shard=("net",))  # each Linear


CNN_CHANNELS = (96, 192, 384)  # 1.2M parameters, conv-dominated compute


class DigitsCNN(nn.Module):
    """conv-conv-pool-conv-pool over 8x8 images, then a two-layer classifier."""

    def __init__(self, channels: tuple[int, int, int] = CNN_CHANNELS, num_classes: int = 10):
        c1, c2, c3 = channels
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
            nn.Conv2d(c2, c3, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),  # 4x4 -> 2x2
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(c3 * 4, 256), nn.ReLU(), nn.Linear(256, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, 1, 8, 8)
        return self.classifier(self.features(x))


def build_cnn_digits(seed: int) -> Workload:
    train_set, eval_set = _digits_tensors()

    def as_images(ds: TensorDataset) -> TensorDataset:
        x, y = ds.tensors
        return TensorDataset(x.reshape(-1, 1, 8, 8), y)

    return Workload(DigitsCNN(), as_images(train_set), as_images(eval_set), cross_entropy)
