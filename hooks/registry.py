"""The hook registry: collects each hook module's :class:`HookSpec`; validation and construction.

A hook module declares its spec(s) beside the hook (``SPEC`` or ``SPECS``); this file lists
them once. Adding a hook is its module, one line in ``_MODULE_SPECS`` and its docs
(docs/hooks.md, "Adding a hook").
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from . import basic, local_sgd, plan, powersgd, qsgd, quantization, quantized_allreduce, sign, sparsify
from .spec import HookSpec
from .state import HookState

_MODULE_SPECS: list[HookSpec] = [
    *basic.SPECS,
    *quantization.SPECS,
    powersgd.SPEC,
    quantized_allreduce.SPEC,
    *sparsify.SPECS,
    sign.SPEC,
    qsgd.SPEC,
]

_SPECS: dict[str, HookSpec] = {s.name: s for s in _MODULE_SPECS}

# What every other hook is compared against: DDP's own default, exact.
BASELINE = "allreduce"


def available() -> dict[str, HookSpec]:
    """All hooks: ``{name: HookSpec}`` (``spec.params`` is ``{param: default}``)."""
    return {name: replace(s, parameters=dict(s.parameters)) for name, s in _SPECS.items()}


def spec(name: str) -> HookSpec:
    """The registered spec of hook ``name``; ValueError naming the known hooks otherwise."""
    found = _SPECS.get(name)
    if found is None:
        raise ValueError(f"unknown hook {name!r}; available: {', '.join(_SPECS)}")
    return found


def validate(name: str, **params) -> dict[str, Any]:
    """The full parameter dict of hook ``name`` (defaults filled in); ValueError naming what is wrong.

    Needs no process group (the sweep validates its grid before Ray starts).
    """
    s = spec(name)
    unknown = sorted(set(params) - set(s.parameters))
    if unknown:
        allowed = ", ".join(f"{k} (default {v!r})" for k, v in s.params.items()) or "none"
        raise ValueError(f"hook {name!r} has no parameter {unknown[0]!r}; its parameters: {allowed}")
    full = {**s.params, **params}
    for param, value in full.items():
        full[param] = s.parameters[param].checked(name, param, value)
    if s.check is not None:
        s.check(full)
    return full


def build(name: str, process_group=None, **params) -> tuple[HookState, Callable]:
    """``(state, hook)`` for ``ddp_model.register_comm_hook(state, hook)``; validates first."""
    p = validate(name, **params)
    s = spec(name)
    state = s.make_state(process_group, **p)
    state.name = name
    state.params = p
    return state, s.hook


_SPECS[plan.NAME] = plan.make_spec(spec, validate, build)
for _periodic in local_sgd.make_specs(spec, validate, build):
    _SPECS[_periodic.name] = _periodic
