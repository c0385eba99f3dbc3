"""The small workload the multi-process tests train: a tiny MLP on the real digits data (the
tests share 2 busy cores). Referenced by name, ``tests.tiny_workload:tiny_digits``, as a user's
custom workload is: each worker imports it."""
from __future__ import annotations

import torch
from torch.nn.functional import cross_entropy
from torch.utils.data import TensorDataset

from service.workloads import Workload

TINY = "tests.tiny_workload:tiny_digits"


def tiny_digits(seed: int) -> Workload:
    from service.workloads.digits import load_digits

    x, y = load_digits()
    x = x / 16.0
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    return Workload(model, TensorDataset(x[:1500], y[:1500]), TensorDataset(x[1500:], y[1500:]),
                    cross_entropy)


def tiny_deep(seed: int) -> Workload:
    """tiny_digits with three hidden layers: tensors enough for small bucket caps to cut the
    gradient into several DDP buckets (tests/test_ddp_knobs.py)."""
    wl = tiny_digits(seed)
    layers = [torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
              torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)]
    return Workload(torch.nn.Sequential(*layers), wl.train_set, wl.eval_set, cross_entropy)


def tiny_noisy(seed: int) -> Workload:
    """tiny_deep with dropout (draws from torch's RNG) and BatchNorm (running statistics): a side
    window that forgot to put either back would change the trajectory (tests/test_step_timeline.py)."""
    wl = tiny_digits(seed)
    layers = [torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
              torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
              torch.nn.Linear(32, 10)]
    return Workload(torch.nn.Sequential(*layers), wl.train_set, wl.eval_set, cross_entropy)


def tiny_exposed(seed: int) -> Workload:
    """tiny_digits with a 1 MB layer near the output and tiny ones at the input: DDP (its first
    bucket capped at 1 MiB, the rest at 25) cuts it into a 1.1 MB bucket (the last two layers',
    ready first) and an 11 KB last one (the first two layers'). On a fast link at a large world
    size the large bucket's wire is most of the step and the small one's microseconds, less than
    fp16's cast costs: a per-bucket plan compresses the first and not the last
    (tests/test_plan_round.py)."""
    wl = tiny_digits(seed)
    layers = [torch.nn.Linear(64, 8), torch.nn.ReLU(), torch.nn.Linear(8, 256), torch.nn.ReLU(),
              torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)]
    return Workload(torch.nn.Sequential(*layers), wl.train_set, wl.eval_set, cross_entropy)


def tiny_eval_fn(seed: int) -> Workload:
    """tiny_digits with its own eval_fn: rank 0 evaluates the whole eval set alone, the other
    ranks get {} (an fsdp trial's final eval once hung on that: tests/test_fsdp_training.py)."""
    wl = tiny_digits(seed)

    def accuracy(model, eval_set) -> dict:
        x, y = eval_set.tensors
        return {"eval_accuracy": float((model(x).argmax(-1) == y).float().mean())}

    return Workload(wl.model, wl.train_set, wl.eval_set, cross_entropy, eval_fn=accuracy)
