"""search.parallelism: which trials run under FSDP2, with what, and what fsdp refuses (before any
trial, one line each). What a hook's sharded form is and takes is its spec's (HookSpec.sharded);
hooks.fsdp validates it. Imports the hook library only when called (it pulls in torch)."""

from __future__ import annotations

from typing import Any

from service.config.errors import FieldProblem
from service.config.limits import DDP_BUCKET_CAP_MB
from service.config.trial import FSDP

# DDP's own knobs and the settings built for DDP only: off their defaults, refused under fsdp
_DDP_ONLY = {"bucket_cap_mb": ([DDP_BUCKET_CAP_MB], "DDP's bucket size cap (FSDP reduces per sharded module)"),
             "gradient_as_bucket_view": ([False], "DDP's bucket views (FSDP has no buckets)"),
             "static_graph": ([False], "DDP's static graph"),
             "compile": ([False], "a compiled trial compiles the module inside DDP (service/train/compiled.py); "
                                  "fsdp trials are not wired for it")}


def sharded_only(hook: str, params: dict) -> list[str]:
    """The parameters in ``params`` only hook's sharded form takes, set off their defaults (an
    all-gather format other than fp32): what makes a combination fsdp's alone."""
    form = _form(hook)
    return [k for k, v in params.items()
            if form is not None and k in form.parameters and v != form.parameters[k].default]


def _form(hook: str):
    import hooks

    spec = hooks.available().get(hook)
    return spec.sharded if spec is not None else None


def form_parameters(hook: str) -> dict[str, Any]:
    """``{parameter: default}`` of what only hook's sharded form takes ({} without one)."""
    form = _form(hook)
    return {k: p.default for k, p in form.parameters.items()} if form is not None else {}


def validate(hook: str, params: dict, parallelism: str) -> dict[str, Any]:
    """The trial's full hook parameters under ``parallelism`` (ValueError naming the problem)."""
    import hooks
    import hooks.fsdp

    if parallelism == FSDP:
        return dict(hooks.fsdp.validate(hook, **params))
    extra = sharded_only(hook, params)
    if extra:
        raise ValueError(f"{extra[0]} is a parameter of {hook}'s sharded form: it needs search.parallelism fsdp")
    form = _form(hook)  # at its default, the all-gather's format means nothing to DDP: dropped
    return dict(hooks.validate(hook, **{k: v for k, v in params.items() if form is None or k not in form.parameters}))


def parallelisms(search, hook: str, combo: dict) -> list[str]:
    """The search's parallelisms a hook combination runs under: one setting a sharded-only
    parameter off its default (all_gather: uint8) runs under fsdp only, as DDP gathers no parameters."""
    return [p for p in search.parallelism if p == FSDP or not sharded_only(hook, combo)]


def fsdp_refusals(cfg) -> None:
    """A FieldProblem naming the first setting of ``cfg`` (its search lists fsdp) fsdp cannot run:
    DDP-only knobs off their defaults, a hook with no sharded form, a per-bucket plan; or a
    sharded-only parameter with no fsdp in the search."""
    import hooks.fsdp

    search = cfg.search
    if FSDP not in search.parallelism:
        if cfg.workload.shard is not None:
            raise FieldProblem("workload.shard", "names the blocks an fsdp trial shards; add fsdp to "
                                                 "search.parallelism or remove it")
        for i, entry in enumerate(search.hooks):
            extra = sharded_only(entry.name, entry.params)
            if extra:
                raise FieldProblem(f"search.hooks[{i}].{extra[0]}", f"a parameter of {entry.name}'s sharded form "
                                                                    "(FSDP's all-gather); add fsdp to search.parallelism")
        return
    for knob, (default, what) in _DDP_ONLY.items():
        if getattr(search, knob) != default:
            raise FieldProblem(f"search.{knob}", f"{what} is DDP's; with parallelism fsdp allowed: {default}")
    for i, entry in enumerate(search.hooks):
        refused = hooks.fsdp.refusal(entry.name)
        if refused is not None:
            raise FieldProblem(f"search.hooks[{i}]", refused)
    if cfg.workload.precision == "bf16":
        raise FieldProblem("workload.precision", "bf16 weights with fsdp: the sharded forms reduce and gather float32 "
                                                 "(not wired for bf16 shards); allowed with fsdp: fp32, bf16_autocast")
    if search.plan is not None:
        raise FieldProblem("search.plan", "a per-bucket plan designs DDP's buckets; fsdp has none: remove search.plan "
                                          "or fsdp from search.parallelism")
