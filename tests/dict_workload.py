"""Custom workloads in the batch_loss form, for the multi-process tests (referenced by name,
``tests.dict_workload:FUNCTION``, as a user's workload is: each worker imports this module).

``dict_digits`` is a tiny MLP on the real digits data whose items are dicts and whose loss is
``batch_loss(model, batch)``, returned as a plain dict (no Workload), through a plain Dataset
(torch's default collate). The others are broken on purpose, one way each.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

DICT = "tests.dict_workload:dict_digits"


class DigitsDicts(Dataset):
    """{"pixels": (64,) float, "label": () long} per index: a dict-batch dataset, collated
    by torch's default_collate (it is not one of the service's fast dataset types)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return {"pixels": self.x[i], "label": self.y[i]}


def _digits():
    from service.workloads.digits import load_digits  # sklearn's data, without importing sklearn

    x, y = load_digits()
    return x / 16.0, y


def _model():
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def digits_loss(model, batch):
    return F.cross_entropy(model(batch["pixels"]), batch["label"])


def dict_digits(seed: int) -> dict:
    x, y = _digits()
    return {"model": _model(), "train_set": DigitsDicts(x[:1500], y[:1500]),
            "eval_set": DigitsDicts(x[1500:], y[1500:]), "batch_loss": digits_loss}


def random_weights(seed: int) -> dict:
    """Re-seeds torch from the OS before building: every rank gets other weights."""
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    return dict_digits(seed) | {"model": _model()}


def random_split(seed: int) -> dict:
    """Deterministic weights, but a train/eval split drawn from the OS per process."""
    wl = dict_digits(seed)
    x, y = _digits()
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little")))
    return wl | {"train_set": DigitsDicts(x[order[:1500]], y[order[:1500]])}


def per_sample_loss(model, batch):
    return F.cross_entropy(model(batch["pixels"]), batch["label"], reduction="none")


def non_scalar(seed: int) -> dict:
    return dict_digits(seed) | {"batch_loss": per_sample_loss}


class MixedKeys(DigitsDicts):
    def __getitem__(self, i):
        item = super().__getitem__(i)
        return item if i < len(self) // 2 else {"image": item["pixels"], "label": item["label"]}


def mixed_keys(seed: int) -> dict:
    x, y = _digits()
    return dict_digits(seed) | {"train_set": MixedKeys(x[:1500], y[:1500])}


def dicts_with_loss_fn(seed: int) -> dict:
    """Dict items, but the (logits, targets) loss_fn form: cannot work."""
    wl = dict_digits(seed)
    del wl["batch_loss"]
    return wl | {"loss_fn": F.cross_entropy}


def with_eval_fn(seed: int) -> dict:
    """dict_digits with its own eval_fn (the whole eval set at once: run on rank 0 alone)."""
    def eval_fn(model, eval_set):
        return {"eval_loss": float(digits_loss(model, {"pixels": eval_set.x, "label": eval_set.y}))}

    return dict_digits(seed) | {"eval_fn": eval_fn}


def bad_eval_fn(seed: int) -> dict:
    return dict_digits(seed) | {"eval_fn": lambda model, eval_set: 0.5}


def wrong_key(seed: int) -> dict:
    """batch_loss reads a key the items do not have: fails on the first batch."""
    return dict_digits(seed) | {"batch_loss": lambda model, batch: F.cross_entropy(model(batch["pixels"]),
                                                                                    batch["labels"])}


class WithEvalHead(torch.nn.Module):
    """_model() plus a head only eval mode uses: a parameter no training step gives a gradient."""

    def __init__(self):
        super().__init__()
        self.body, self.eval_head = _model(), torch.nn.Linear(10, 10)

    def forward(self, x):
        out = self.body(x)
        return out if self.training else self.eval_head(out)


def eval_head(seed: int) -> dict:
    return dict_digits(seed) | {"model": WithEvalHead()}


# One refusal per seed, so a single sweep (seed: [0, 1, ...], find_unused_parameters: false)
# meets every documented start-of-trial refusal (tests/test_refusals.py): seed i builds REFUSALS[i].
REFUSALS = [random_weights, random_split, mixed_keys, dicts_with_loss_fn, non_scalar, wrong_key, eval_head]


def refusal_by_seed(seed: int) -> dict:
    return REFUSALS[seed](seed)


HF_SHORT = "tests.dict_workload:hf_gpt2_short"
SHORT_EVAL_SEQUENCES = 8
SHORT_CONTEXT = 16  # tokens per sequence, of hf_gpt2's 64


def hf_gpt2_short(seed: int):
    """hf_gpt2 (the same model, data and eval_fn) with its eval set cut to its first
    SHORT_EVAL_SEQUENCES sequences and every sequence to its first SHORT_CONTEXT tokens: for the
    bf16 trials of tests/test_workload_contract.py, which test training through bf16 buckets (their
    dtype and bytes, a falling loss, a NaN found), not the eval or the context length; the model and
    its parameters are hf_gpt2's. bf16 matmuls on a CPU without native bf16 (AVX2 only) run ~30x
    fp32's: the full 512-sequence eval of bf16 weights took 165 s there (5.3 s in fp32), and those
    trials ran 28 evals on rank 0; a step's cost is its tokens'."""
    from service.workloads import build_workload
    from service.workloads.batches import DictTensorDataset

    wl = build_workload("hf_gpt2", seed)
    wl.train_set = DictTensorDataset(**{k: t[:, :SHORT_CONTEXT] for k, t in wl.train_set.tensors.items()})
    wl.eval_set = DictTensorDataset(**{k: t[:SHORT_EVAL_SEQUENCES, :SHORT_CONTEXT]
                                       for k, t in wl.eval_set.tensors.items()})
    return wl
