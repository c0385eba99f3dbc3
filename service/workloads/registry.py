"""The registry: built-in and optional workload names, a user's "package.module:function",
the cheap check before Ray starts, and ``build_workload`` (seeded, checked against the contract)."""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.nn as nn

from service.text import did_you_mean, one_line
from service.workloads.char_lm import CONTEXT_LENGTH, VOCAB_SIZE, build_char_lm
from service.workloads.contract import DEFAULT_GLOBAL_BATCH, DEFAULT_LR, Workload, WorkloadInfo
from service.workloads.digits import build_cnn_digits, build_mlp_digits
from service.workloads.hf_gpt2 import GPT2_CONTEXT, GPT2_EMBED, GPT2_LAYERS, build_hf_gpt2

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
        raise ValueError(f"unknown workload {name!r}: expected {_allowed()}{did_you_mean(name, workload_names())}")
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
