"""A hook's sharded form under FSDP2: validated, built and attached to fully_shard'ed modules.

    import hooks.fsdp
    state, form = hooks.fsdp.build("quantized_allreduce", process_group=None, chunk_size=512, all_gather="uint8")
    for index, module in enumerate(sharded_modules):     # each fully_shard'ed module, the root last
        hooks.fsdp.attach(state, form, module, index)
    ...
    state.stats()   # reduce_scatter_bytes, all_gather_bytes, wire_bytes, all_gather_rel_error, ...

What a hook's sharded form is lives in its spec (``HookSpec.sharded``, hooks/spec.py); the
forms themselves in hooks/sharded.py, FSDP's interfaces carrying them in hooks/fsdp_comms.py
(imported by ``attach`` alone: see there).
"""
from __future__ import annotations

from typing import Any

from . import registry
from .sharded import ShardState
from .spec import HookSpec, ShardedForm


def sharded_hooks() -> list[str]:
    """The hooks that have a sharded form, in registry order."""
    return [name for name, s in registry.available().items() if s.sharded is not None]


def refusal(name: str) -> str | None:
    """Why hook ``name`` cannot run under FSDP, one line (None: it can)."""
    s = registry.spec(name)
    if s.sharded is not None:
        return None
    return f"hook {name!r} has no sharded form; under fsdp: {', '.join(sharded_hooks())}"


def parameters(name: str) -> dict[str, Any]:
    """``{parameter: default}`` of hook ``name``'s sharded form: the hook's own and the form's."""
    s = _sharded_spec(name)
    return {**s.params, **{k: p.default for k, p in s.sharded.parameters.items()}}


def validate(name: str, **params) -> dict[str, Any]:
    """The full parameters of hook ``name``'s sharded form (defaults filled in); ValueError
    naming what is wrong (no sharded form, an unknown parameter, a bad value)."""
    s = _sharded_spec(name)
    own = {k: v for k, v in params.items() if k not in s.sharded.parameters}
    try:
        full = registry.validate(name, **own)
    except ValueError as exc:
        raise ValueError(f"{exc} (or, under fsdp: {', '.join(s.sharded.parameters)})") from None
    for key, param in s.sharded.parameters.items():
        full[key] = param.checked(name, key, params.get(key, param.default))
    return full


def build(name: str, process_group=None, **params) -> tuple[ShardState, ShardedForm]:
    """``(state, form)``: attach both to each fully_shard'ed module with :func:`attach`."""
    full = validate(name, **params)
    form = registry.spec(name).sharded
    state = form.make_state(process_group, **full)
    state.name, state.params = name, full
    return state, form


def attach(state: ShardState, form: ShardedForm, module, index: int) -> None:
    """Module ``index``'s reduce-scatter and all-gather become the form's (``module``: an
    FSDPModule; ``index``: its place in the sharding order, which keys its NaN flag and residual).
    A module without parameters of its own has no FSDP collectives: nothing to attach."""
    from .fsdp_comms import ShardedAllGather, ShardedReduceScatter  # torch.distributed.fsdp: only where a model is sharded

    state_of = module._get_fsdp_state()
    if not state_of._fsdp_param_groups:
        return
    own = [p for group in state_of._fsdp_param_groups for p in (fp.sharded_param for fp in group.fsdp_params)]
    module.set_custom_reduce_scatter(ShardedReduceScatter(state, form.reduce_scatter, index, own))
    module.set_custom_all_gather(ShardedAllGather(state))


def _sharded_spec(name: str) -> HookSpec:
    found = refusal(name)
    if found is not None:
        raise ValueError(found)
    return registry.spec(name)
