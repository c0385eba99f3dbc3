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

    hf_gpt2      Hugging Face transformers' GPT-2 (built from a config: random init, no
                 download) on the same text, model(**batch).loss; needs the `.[hf]` extra

A user's own workload is named "package.module:function": the module is imported and
function(seed) must return a Workload, a plain dict with the same keys, or a
(model, train_set, eval_set, loss_fn) tuple. The loss is either loss_fn(logits, targets)
(model(x) gives logits, datasets yield (x, y)) or batch_loss(model, batch) -> scalar, which
gets the whole batch as torch's default collate builds it (a tuple or a dict of tensors);
eval_fn(model, eval_set) -> {metric: float} is optional. See docs/workloads.md and examples/.

Determinism: build_workload(name, seed) seeds torch's RNG with `seed` (inside a forked
RNG, so the caller's RNG state is untouched), so every rank of a trial builds identical
weights and the same train/eval split, as DDP requires.
"""

from __future__ import annotations

import difflib
import importlib
import re
import sysconfig
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset, default_collate

from service.text import one_line

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
    """

    model: nn.Module
    train_set: Dataset
    eval_set: Dataset
    loss_fn: Optional[LossFn] = None
    batch_loss: Optional[BatchLoss] = None
    eval_fn: Optional[EvalFn] = None

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
# Hugging Face GPT-2 on the same text (hf_gpt2; needs the optional `.[hf]` extra)

# 2.45M parameters in 40 tensors (3 blocks of 12: LayerNorms, fused qkv Conv1D, projections,
# MLP, all with biases; token + position embeddings, tied head): five times char_lm's
# parameters, at about the same step time per sample as char_lm's twice-shorter context
# (docs/workloads.md, "Sizing").
GPT2_CONTEXT = 64
GPT2_EMBED = 256
GPT2_LAYERS = 3
GPT2_HEADS = 4


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


def hf_causal_lm_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """A Hugging Face causal LM's own loss: ``model(**batch).loss`` (labels shifted inside)."""
    return model(**batch).loss


@torch.no_grad()
def hf_causal_lm_eval(model: nn.Module, eval_set: Dataset, batch_size: int = 256) -> dict[str, float]:
    """eval_loss (the model's own loss, weighted by predicted positions) and eval_accuracy
    (next-byte argmax match rate) of a Hugging Face causal LM whose labels are its inputs."""
    device = next(model.parameters()).device
    total_loss, correct, positions = 0.0, 0, 0
    for start in range(0, len(eval_set), batch_size):
        batch = to_device(collate_batch(eval_set, torch.arange(start, min(start + batch_size, len(eval_set)))),
                          device)
        out = model(**batch)
        predicted = out.logits[:, :-1].argmax(dim=-1)
        targets = batch["labels"][:, 1:]
        n = targets.numel()
        total_loss += float(out.loss) * n
        correct += int((predicted == targets).sum())
        positions += n
    return {"eval_loss": total_loss / positions, "eval_accuracy": correct / positions}


def build_hf_gpt2(seed: int) -> Workload:
    from transformers import GPT2Config, GPT2LMHeadModel  # the optional extra: imported only here

    tokens = torch.frombuffer(bytearray(stdlib_text()), dtype=torch.uint8).long()
    split = int(len(tokens) * (1 - EVAL_FRACTION))

    def windows(part: torch.Tensor, limit: Optional[int] = None) -> DictTensorDataset:
        n = len(part) // GPT2_CONTEXT
        ids = part[: n * GPT2_CONTEXT].view(n, GPT2_CONTEXT)[:limit].clone()
        return DictTensorDataset(input_ids=ids, labels=ids)  # the model shifts labels itself

    config = GPT2Config(
        vocab_size=VOCAB_SIZE, n_positions=GPT2_CONTEXT, n_embd=GPT2_EMBED, n_layer=GPT2_LAYERS,
        n_head=GPT2_HEADS, bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM",
        # no dropout (as nanoGPT's small runs): a step is a function of the weights and the
        # batch, so world sizes and hooks compare on the same trajectory
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa",
    )
    model = GPT2LMHeadModel(config)  # random init from torch's (seeded) RNG: nothing downloaded
    return Workload(model, windows(tokens[:split]), windows(tokens[split:], EVAL_SEQUENCES),
                    batch_loss=hf_causal_lm_loss, eval_fn=hf_causal_lm_eval)


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


@dataclass(frozen=True)
class OptionalWorkload:
    """A built-in that needs an optional extra of the project (``pip install -e '.[extra]'``)."""

    description: str
    package: str  # the import name that must be installed
    extra: str
    builder: Callable[[int], Workload]


# Kept apart from BUILTIN_WORKLOADS (whose entries need nothing but the service's own
# dependencies and yield TensorDatasets of (x, y)).
OPTIONAL_WORKLOADS: dict[str, OptionalWorkload] = {
    "hf_gpt2": OptionalWorkload(
        f"transformers' GPT-2 ({GPT2_LAYERS} layers, embed {GPT2_EMBED}, random init) predicting the "
        f"next byte of Python stdlib source (context {GPT2_CONTEXT}), model(**batch).loss",
        "transformers", "hf", build_hf_gpt2,
    ),
}

_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def workload_names() -> list[str]:
    """Every built-in name, optional ones included."""
    return [*BUILTIN_WORKLOADS, *OPTIONAL_WORKLOADS]


def _allowed() -> str:
    return f"one of {', '.join(workload_names())}, or 'package.module:function'"


def _check_optional(name: str) -> None:
    info = OPTIONAL_WORKLOADS[name]
    if importlib.util.find_spec(info.package) is None:
        raise ValueError(f"workload {name!r} needs the optional package {info.package}, which is not "
                         f"installed: pip install -e '.[{info.extra}]' (scripts/setup.sh --test installs it)")


def _resolve_custom(name: str) -> Callable:
    """Import the module of a 'package.module:function' spec and return the callable."""
    module_name, func_name = name.split(":")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as err:  # a user's module may fail any way: one line
        raise ValueError(f"workload {name!r}: cannot import {module_name}: {one_line(err, every_line=True)}") from None
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
    if name in OPTIONAL_WORKLOADS:
        return _check_optional(name)
    if ":" not in name:
        close = difflib.get_close_matches(name, workload_names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown workload {name!r}: expected {_allowed()}{hint}")
    if not _SPEC.match(name):
        raise ValueError(f"bad workload spec {name!r}: expected 'package.module:function'")
    _resolve_custom(name)


WORKLOAD_KEYS = ("model", "train_set", "eval_set", "loss_fn", "batch_loss", "eval_fn")
_EXPECTED = ("a Workload or a (model, train_set, eval_set, loss_fn) tuple, or a dict with keys "
             "model, train_set, eval_set and loss_fn or batch_loss")


def _as_workload(name: str, result: object) -> Workload:
    """Accept a Workload, a dict of its fields or a (model, train_set, eval_set, loss_fn)
    tuple, and check its parts."""
    if isinstance(result, Workload):
        wl = result
    elif isinstance(result, Mapping):
        unknown = [k for k in result if k not in WORKLOAD_KEYS]
        missing = [k for k in ("model", "train_set", "eval_set") if k not in result]
        if unknown or missing:
            what = f"unknown key {unknown[0]!r}" if unknown else f"no {missing[0]!r}"
            raise ValueError(f"workload {name!r} returned a dict with {what}; allowed keys: {', '.join(WORKLOAD_KEYS)}")
        wl = Workload(**result)
    elif isinstance(result, (tuple, list)) and len(result) == 4:
        wl = Workload(*result)
    else:
        raise ValueError(f"workload {name!r} returned {type(result).__name__}; expected {_EXPECTED}")
    if not isinstance(wl.model, nn.Module):
        raise ValueError(f"workload {name!r}: model is {type(wl.model).__name__}, not a torch.nn.Module")
    for field in ("train_set", "eval_set"):
        ds = getattr(wl, field)
        if not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")) or len(ds) == 0:
            raise ValueError(f"workload {name!r}: {field} must be a non-empty indexable dataset")
    if (wl.loss_fn is None) == (wl.batch_loss is None):
        both = "both" if wl.loss_fn is not None else "neither"
        raise ValueError(f"workload {name!r} gives {both} loss_fn and batch_loss; give exactly one")
    for field in ("loss_fn", "batch_loss", "eval_fn"):
        value = getattr(wl, field)
        if value is not None and not callable(value):
            raise ValueError(f"workload {name!r}: {field} is not callable")
    return wl


def build_workload(name: str, seed: int) -> Workload:
    """Build a workload; the same (name, seed) gives the same weights and data everywhere.

    No downloads. Raises ValueError (one line) for an unknown name or a bad custom spec.
    """
    check_workload(name)
    if name in BUILTIN_WORKLOADS:
        builder = BUILTIN_WORKLOADS[name].builder
    elif name in OPTIONAL_WORKLOADS:
        builder = OPTIONAL_WORKLOADS[name].builder
    else:
        builder = _resolve_custom(name)
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
            raise ValueError(f"eval_fn returned {_short_repr(metrics)}; expected a dict of metric name -> number")
        return {k: float(v) for k, v in metrics.items()}
    if wl.batch_loss is not None:
        return {"eval_loss": evaluate_batch_loss(model, wl.eval_set, wl.batch_loss, device=device,
                                                 float_dtype=float_dtype)}
    eval_loss, eval_accuracy = evaluate(model, wl.eval_set, wl.loss_fn, device=device, float_dtype=float_dtype)
    return {"eval_loss": eval_loss, "eval_accuracy": eval_accuracy}


def _short_repr(value: object, limit: int = 60) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
