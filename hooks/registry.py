"""The hook registry: names, parameters with defaults, validation, construction."""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from . import basic, powersgd, qsgd, quantization, quantized_allreduce, sign, sparsify
from .state import HookState


@dataclass(frozen=True)
class HookSpec:
    """A hook's name, its parameters with their defaults, whether it is lossy, a one-line doc,
    and how plots draw it: ``colour`` (a matplotlib colour) and ``marker`` (a matplotlib
    marker; not "X" or "P", which mark where a trial went NaN or failed). Every registered hook
    has its own (colour, marker) pair, so no two hooks draw alike in a report (line style is
    left to the chunk size)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    lossy: bool = False
    doc: str = ""
    colour: str = "grey"
    marker: str = "o"


_EF = {"error_feedback": False}

_SPECS: dict[str, HookSpec] = {
    s.name: s
    for s in [
        HookSpec("allreduce", {}, False, "fp32 ring allreduce of the mean (exact; DDP's default)", "black", "o"),
        HookSpec("allgather_then_aggregate", {}, False, "allgather every rank's bucket, average locally (exact)",
                 "tab:gray", "s"),
        HookSpec("fp16_compress", dict(_EF), True, "allreduce in float16 (2 bytes/float)", "tab:orange", "^"),
        HookSpec("bf16_compress", dict(_EF), True, "allreduce in bfloat16 (2 bytes/float)", "tab:brown", "v"),
        HookSpec("quantization_pertensor", dict(_EF), True, "uint8 min/max, one scale per bucket, by allgather",
                 "tab:blue", "D"),
        HookSpec(
            "quantization_perchannel",
            {"chunk_size": 512, **_EF},
            True,
            "uint8 min/max, one scale per chunk of chunk_size floats, by allgather",
            "tab:green",
            "p",
        ),
        HookSpec(
            "powersgd",
            {"rank": 1, "start_iter": 10, "error_feedback": True, "warm_start": True, "orthogonalization_epsilon": 1e-8},
            True,
            "PowerSGD low-rank compression (torch's), after start_iter plain allreduces",
            "tab:purple",
            "*",
        ),
        HookSpec(
            "quantized_allreduce",
            {"chunk_size": 512, **_EF},
            True,
            "uint8 per-chunk quantization inside all_to_all (reduce-scatter) + allgather: ~1/4 of fp32 allreduce",
            "tab:red",
            "h",
        ),
        HookSpec("topk", {"ratio": 0.01, **_EF}, True,
                 "each rank's ceil(ratio*N) largest |values| as (index, value) pairs by allgather, mean densified (biased)",
                 "tab:cyan", ">"),
        HookSpec("randomk", {"ratio": 0.01, **_EF}, True,
                 "the same ceil(ratio*N) random indices on every rank (seeded per call), allreduce of those values (biased)",
                 "tab:olive", "<"),
        HookSpec("signsgd", {"chunk_size": 512, "majority_vote": False, **_EF}, True,
                 "1 sign bit per value (8 per byte) + a mean-|x| scale per chunk by allgather; mean or majority vote (biased)",
                 "tab:pink", "d"),
        HookSpec("qsgd", {"levels": qsgd.MAX_LEVELS, "chunk_size": 512, **_EF}, True,
                 "QSGD: stochastic rounding to levels of each chunk's L2 norm, int8 codes by allgather (unbiased)",
                 "navy", "8"),
    ]
}

_HOOKS: dict[str, Callable] = {
    "allreduce": basic.allreduce,
    "allgather_then_aggregate": basic.allgather_then_aggregate,
    "fp16_compress": basic.fp16_compress,
    "bf16_compress": basic.bf16_compress,
    "quantization_pertensor": quantization.quantization_pertensor,
    "quantization_perchannel": quantization.quantization_perchannel,
    "powersgd": powersgd.powersgd,
    "quantized_allreduce": quantized_allreduce.quantized_allreduce,
    "topk": sparsify.topk,
    "randomk": sparsify.randomk,
    "signsgd": sign.signsgd,
    "qsgd": qsgd.qsgd,
}


def available() -> dict[str, HookSpec]:
    """All hooks: ``{name: HookSpec(name, params={param: default}, lossy, doc, colour, marker)}``."""
    return {name: replace(s, params=dict(s.params)) for name, s in _SPECS.items()}


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check(name: str, param: str, value, ok: bool, allowed: str) -> None:
    if not ok:
        raise ValueError(f"hook {name!r}: parameter {param!r} must be {allowed}, got {value!r}")


def validate(name: str, **params) -> dict[str, Any]:
    """The full parameter dict of hook ``name`` (defaults filled in); ValueError naming what is wrong.

    Needs no process group (the sweep validates its grid before Ray starts).
    """
    spec = _SPECS.get(name)
    if spec is None:
        raise ValueError(f"unknown hook {name!r}; available: {', '.join(_SPECS)}")
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        allowed = ", ".join(f"{k} (default {v!r})" for k, v in spec.params.items()) or "none"
        raise ValueError(f"hook {name!r} has no parameter {unknown[0]!r}; its parameters: {allowed}")
    full = {**spec.params, **params}
    for param, value in full.items():
        if param in ("chunk_size", "rank"):
            _check(name, param, value, _is_int(value) and value > 0, "a positive integer")
            full[param] = int(value)
        elif param == "start_iter":
            _check(name, param, value, _is_int(value) and value >= 0, "a non-negative integer")
            full[param] = int(value)
        elif param == "ratio":
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < value <= 1
            _check(name, param, value, ok, "a number in (0, 1] (the fraction of values each rank sends)")
            full[param] = float(value)
        elif param == "levels":
            ok = _is_int(value) and 1 <= value <= qsgd.MAX_LEVELS
            _check(name, param, value, ok, f"an integer from 1 to {qsgd.MAX_LEVELS} (codes are int8)")
            full[param] = int(value)
        elif param in ("error_feedback", "warm_start", "majority_vote"):
            _check(name, param, value, isinstance(value, bool), "true or false")
        elif param == "orthogonalization_epsilon":
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 <= value < 1
            _check(name, param, value, ok, "a number in [0, 1)")
            full[param] = float(value)
    if name == "powersgd" and (full["error_feedback"] or full["warm_start"]) and full["start_iter"] < 2:
        raise ValueError(
            f"hook 'powersgd': parameter 'start_iter' must be >= 2 when error_feedback or warm_start is on "
            f"(DDP rebuilds its buckets after the first iteration), got {full['start_iter']!r}"
        )
    return full


def build(name: str, process_group=None, **params) -> tuple[HookState, Callable]:
    """``(state, hook)`` for ``ddp_model.register_comm_hook(state, hook)``; validates first."""
    p = validate(name, **params)
    if name in ("allreduce", "allgather_then_aggregate"):
        state = HookState(process_group)
    elif name in ("fp16_compress", "bf16_compress"):
        dtype = torch.float16 if name == "fp16_compress" else torch.bfloat16
        state = basic.CastState(dtype, process_group, error_feedback=p["error_feedback"])
    elif name == "quantization_pertensor":
        state = quantization.QuantizationState(None, process_group, error_feedback=p["error_feedback"])
    elif name == "quantization_perchannel":
        state = quantization.QuantizationState(p["chunk_size"], process_group, error_feedback=p["error_feedback"])
    elif name == "quantized_allreduce":
        state = quantized_allreduce.QuantizedAllreduceState(p["chunk_size"], process_group, error_feedback=p["error_feedback"])
    elif name == "powersgd":
        state = powersgd.PowerSGDHookState(process_group, **p)
    elif name in ("topk", "randomk"):
        state = sparsify.SparsifyState(p["ratio"], process_group, error_feedback=p["error_feedback"])
    elif name == "signsgd":
        state = sign.SignState(p["chunk_size"], p["majority_vote"], process_group, error_feedback=p["error_feedback"])
    elif name == "qsgd":
        state = qsgd.QSGDState(p["levels"], p["chunk_size"], process_group, error_feedback=p["error_feedback"])
    else:  # pragma: no cover - every spec has a branch
        raise AssertionError(name)
    state.name = name
    state.params = p
    return state, _HOOKS[name]
