"""Workload registry: the model, data and loss a sweep trial trains.

A workload is everything a worker needs besides the hook:

    wl = build_workload("char_lm", seed=0)
    logits = wl.model(x)              # (..., C) logits
    loss = wl.loss_fn(logits, y)      # y (...) holds class indices
    eval_loss, eval_accuracy = evaluate(wl.model, wl.eval_set, wl.loss_fn)

Built-ins (real data that ships with the installed packages; nothing is downloaded):

    mlp_digits   MLP on scikit-learn's handwritten digits (64 pixels -> 10 classes)
    cnn_digits   small CNN on the same digits as 1x8x8 images
    char_lm      small causal transformer predicting the next byte of Python's own
                 standard-library source

A user's own workload is named "package.module:function": the module is imported and
function(seed) must return a Workload or a (model, train_set, eval_set, loss_fn) tuple.
See docs/workloads.md and examples/custom_workload.py.

Determinism: build_workload(name, seed) seeds torch's RNG with `seed` (inside a forked
RNG, so the caller's RNG state is untouched), so every rank of a trial builds identical
weights and the same train/eval split, as DDP requires.
"""

from __future__ import annotations

import difflib
import importlib
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Workload:
    """What one trial trains. Datasets yield (x, y) per index; model(x) gives logits (..., C)."""

    model: nn.Module
    train_set: Dataset
    eval_set: Dataset
    loss_fn: LossFn


# What a config may leave out (issue 13: a first config should not need them): the global batch,
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


# ----------------------------------------------------------------------------------------
# Digits (mlp_digits, cnn_digits)

DIGITS_EVAL_FRACTION = 0.2
DIGITS_SPLIT_SEED = 1234  # the split is the same for every seed: eval numbers stay comparable


def _digits_tensors() -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's 1797 8x8 digits, standardized, split train/eval (a fixed split)."""
    from sklearn.datasets import load_digits  # the data file ships inside scikit-learn

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(DIGITS_SPLIT_SEED))
    n_eval = int(len(y) * DIGITS_EVAL_FRACTION)
    eval_idx, train_idx = order[:n_eval], order[n_eval:]
    # Standardize with the training pixels' mean/std: centred inputs let plain SGD start fast.
    mean, std = x[train_idx].mean(), x[train_idx].std()
    x = (x - mean) / std
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[eval_idx], y[eval_idx])


# Sizes: each built-in costs ~0.1-0.15 s per plain step at batch 128 on one thread here, so
# 300 steps at world size 2 take about a minute (measurements in docs/workloads.md).
# The MLP has 8.5M parameters (34 MB of gradient in 8 tensors): the communication-heavy one.
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
    return Workload(DigitsMLP(), train_set, eval_set, cross_entropy)


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


# ----------------------------------------------------------------------------------------
# Character (byte) language model on the standard library's own source (char_lm)

# A fixed selection of pure-Python stdlib modules present in CPython 3.10-3.13, read in
# this order. The text therefore depends only on the Python version, which every rank of
# a trial shares. Missing files are skipped; too little text is an error.
STDLIB_TEXT_FILES = (
    "argparse.py", "ast.py", "calendar.py", "collections/__init__.py", "configparser.py",
    "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "datetime.py", "difflib.py",
    "dis.py", "doctest.py", "enum.py", "fractions.py", "functools.py", "gettext.py",
    "heapq.py", "inspect.py", "ipaddress.py", "json/decoder.py", "json/encoder.py",
    "logging/__init__.py", "optparse.py", "pickle.py", "pprint.py", "random.py",
    "shutil.py", "statistics.py", "string.py", "subprocess.py", "tarfile.py",
    "textwrap.py", "threading.py", "tokenize.py", "traceback.py", "typing.py",
)
MIN_TEXT_BYTES = 200_000
VOCAB_SIZE = 256  # bytes: no tokenizer, identical on every machine
CONTEXT_LENGTH = 32
EVAL_FRACTION = 0.1  # the last 10% of the text is held out
EVAL_SEQUENCES = 512  # cap: a full pass over the held-out text would cost many steps

# 0.47M parameters (1.9 MB of gradient) in 30 tensors of many shapes (embeddings, attention,
# MLP, LayerNorm, biases): the realistic mix that per-tensor vs per-chunk hooks care about.
LM_EMBED = 128
LM_LAYERS = 2
LM_HEADS = 4


def stdlib_text() -> bytes:
    """The concatenated source of STDLIB_TEXT_FILES, as bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [(root / rel).read_bytes() for rel in STDLIB_TEXT_FILES if (root / rel).is_file()]
    text = b"\n".join(parts)
    if len(text) < MIN_TEXT_BYTES:
        raise RuntimeError(
            f"char_lm: only {len(text)} bytes of standard-library source under {root}; "
            f"need {MIN_TEXT_BYTES}"
        )
    return text


def _windows(tokens: torch.Tensor, context: int) -> TensorDataset:
    """Non-overlapping windows: x = tokens[i*T : i*T+T], y = the same shifted by one."""
    n = (len(tokens) - 1) // context
    x = tokens[: n * context].view(n, context)
    y = tokens[1 : n * context + 1].view(n, context)
    return TensorDataset(x.clone(), y.clone())


class CausalSelfAttention(nn.Module):
    def __init__(self, embed: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(embed, 3 * embed)
        self.proj = nn.Linear(embed, embed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, embed: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(embed)
        self.attn = CausalSelfAttention(embed, heads)
        self.ln2 = nn.LayerNorm(embed)
        self.mlp = nn.Sequential(nn.Linear(embed, 4 * embed), nn.GELU(), nn.Linear(4 * embed, embed))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    """A nanoGPT-shaped decoder: token + position embeddings, pre-LN blocks, linear head."""

    def __init__(
        self,
        vocab: int = VOCAB_SIZE,
        context: int = CONTEXT_LENGTH,
        embed: int = LM_EMBED,
        layers: int = LM_LAYERS,
        heads: int = LM_HEADS,
    ):
        super().__init__()
        self.context = context
        self.tok_emb = nn.Embedding(vocab, embed)
        self.pos_emb = nn.Embedding(context, embed)
        self.blocks = nn.Sequential(*(Block(embed, heads) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(embed)
        self.head = nn.Linear(embed, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # idx (B, T) byte values
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        return self.head(self.ln_f(self.blocks(x)))  # (B, T, vocab)


def build_char_lm(seed: int) -> Workload:
    tokens = torch.frombuffer(bytearray(stdlib_text()), dtype=torch.uint8).long()
    split = int(len(tokens) * (1 - EVAL_FRACTION))
    train_set = _windows(tokens[:split], CONTEXT_LENGTH)
    eval_x, eval_y = _windows(tokens[split:], CONTEXT_LENGTH).tensors
    eval_set = TensorDataset(eval_x[:EVAL_SEQUENCES], eval_y[:EVAL_SEQUENCES])
    return Workload(CharTransformer(), train_set, eval_set, cross_entropy)


# ----------------------------------------------------------------------------------------
# Registry

BUILTIN_WORKLOADS: dict[str, WorkloadInfo] = {
    "mlp_digits": WorkloadInfo(
        "MLP (64-2048-2048-2048-10) on scikit-learn's 8x8 handwritten digits; 20% held out",
        (64,), 10, build_mlp_digits,
    ),
    "cnn_digits": WorkloadInfo(
        "small CNN (3 conv layers, 2 linear) on the same digits as 1x8x8 images",
        (1, 8, 8), 10, build_cnn_digits,
    ),
    "char_lm": WorkloadInfo(
        "2-layer causal transformer predicting the next byte of Python stdlib source "
        f"(context {CONTEXT_LENGTH})",
        (CONTEXT_LENGTH,), VOCAB_SIZE, build_char_lm,
        lr=(("sgd", 0.5), ("adamw", 0.003)),  # bench/error_feedback.py and compression_at_scale.yaml
    ),
}


def training_defaults(name: str, optimizer: str) -> dict[str, float]:
    """``global_batch_size`` and ``lr`` for a config that leaves them out: the built-in's own,
    or the general ones for a custom workload (docs/workloads.md lists them)."""
    info = BUILTIN_WORKLOADS.get(name)
    lrs = dict(info.lr) if info is not None else DEFAULT_LR
    return {"global_batch_size": info.global_batch_size if info is not None else DEFAULT_GLOBAL_BATCH,
            "lr": lrs.get(optimizer, DEFAULT_LR.get(optimizer, DEFAULT_LR["sgd"]))}

_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _allowed() -> str:
    return f"one of {', '.join(BUILTIN_WORKLOADS)}, or 'package.module:function'"


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _resolve_custom(name: str) -> Callable:
    """Import the module of a 'package.module:function' spec and return the callable."""
    module_name, func_name = name.split(":")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as err:  # a user's module may fail any way: one line
        raise ValueError(f"workload {name!r}: cannot import {module_name}: {_one_line(err)}") from None
    func = getattr(module, func_name, None)
    if func is None:
        raise ValueError(f"workload {name!r}: module {module_name} has no attribute {func_name!r}")
    if not callable(func):
        raise ValueError(f"workload {name!r}: {module_name}.{func_name} is not callable")
    return func


def check_workload(name: str) -> None:
    """Cheap validation before Ray starts: a built-in name, or a custom spec that imports and
    names a callable (the function is not called). Raises ValueError with one line."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"workload must be {_allowed()}")
    if name in BUILTIN_WORKLOADS:
        return
    if ":" not in name:
        close = difflib.get_close_matches(name, BUILTIN_WORKLOADS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown workload {name!r}: expected {_allowed()}{hint}")
    if not _SPEC.match(name):
        raise ValueError(f"bad workload spec {name!r}: expected 'package.module:function'")
    _resolve_custom(name)


def _as_workload(name: str, result: object) -> Workload:
    """Accept a Workload or a (model, train_set, eval_set, loss_fn) tuple and check its parts."""
    if isinstance(result, Workload):
        wl = result
    elif isinstance(result, (tuple, list)) and len(result) == 4:
        wl = Workload(*result)
    else:
        raise ValueError(
            f"workload {name!r} returned {type(result).__name__}; expected a Workload or a "
            "(model, train_set, eval_set, loss_fn) tuple"
        )
    if not isinstance(wl.model, nn.Module):
        raise ValueError(f"workload {name!r}: model is {type(wl.model).__name__}, not a torch.nn.Module")
    for field in ("train_set", "eval_set"):
        ds = getattr(wl, field)
        if not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")) or len(ds) == 0:
            raise ValueError(f"workload {name!r}: {field} must be a non-empty indexable dataset")
    if not callable(wl.loss_fn):
        raise ValueError(f"workload {name!r}: loss_fn is not callable")
    return wl


def build_workload(name: str, seed: int) -> Workload:
    """Build a workload; the same (name, seed) gives the same weights and data everywhere.

    No downloads. Raises ValueError (one line) for an unknown name or a bad custom spec.
    """
    check_workload(name)
    builder = BUILTIN_WORKLOADS[name].builder if name in BUILTIN_WORKLOADS else _resolve_custom(name)
    # Seed a forked RNG: identical weights on every rank, and the caller's RNG is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        result = builder(seed)
    return _as_workload(name, result)


# ----------------------------------------------------------------------------------------
# Batches and evaluation


def fetch_batch(dataset: Dataset, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) for a 1-D tensor of indices: one gather for a TensorDataset, else stacked items."""
    if isinstance(dataset, TensorDataset):
        x, y = dataset.tensors[0][indices], dataset.tensors[1][indices]
        return x, y
    items = [dataset[int(i)] for i in indices]
    xs, ys = zip(*items)
    return torch.stack([torch.as_tensor(x) for x in xs]), torch.stack([torch.as_tensor(y) for y in ys])


@torch.no_grad()
def evaluate(
    model: nn.Module,
    eval_set: Dataset,
    loss_fn: LossFn,
    batch_size: int = 512,
    device: torch.device | str | None = None,
) -> tuple[float, float]:
    """(eval_loss, eval_accuracy) over the whole eval set.

    eval_loss is loss_fn's mean weighted by the positions in each batch; accuracy is the
    argmax match rate over every position (so classification and the char LM share one
    eval). Pass the bare module (ddp_model.module) so no DDP collectives run. Batches are
    moved to `device` when given (the model must already be there). The model's
    train/eval mode is restored afterwards.
    """
    was_training = model.training
    model.eval()
    try:
        total_loss, correct, positions = 0.0, 0, 0
        for start in range(0, len(eval_set), batch_size):
            idx = torch.arange(start, min(start + batch_size, len(eval_set)))
            x, y = fetch_batch(eval_set, idx)
            if device is not None:
                x, y = x.to(device), y.to(device)
            logits = model(x)
            n = y.numel()
            total_loss += float(loss_fn(logits, y)) * n
            correct += int((logits.argmax(dim=-1) == y).sum())
            positions += n
    finally:
        model.train(was_training)
    return total_loss / positions, correct / positions
