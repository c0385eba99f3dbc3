"""The settings a periodic hook (post_local_sgd, diloco: an exchange every ``period`` steps after
the optimizer step, hooks/local_sgd.py) cannot run with, each refused before any trial starts in
one line naming it: groups that do not divide a world size, and a split network sweep's timing
runs too short to time one exchange."""

from __future__ import annotations

from service import hook_facts
from service.config.errors import FieldProblem


def periodic_refusals(cfg) -> None:
    """FieldProblem for the first setting of ``cfg`` (a SweepConfig) a periodic hook cannot run with."""
    import hooks  # imported late: it pulls in torch

    wl = cfg.workload
    for i, entry in enumerate(cfg.search.hooks):
        if not hook_facts.periodic(entry.name):
            continue
        for combo in entry.combos():
            params = hooks.validate(entry.name, **combo)
            group = params.get("group_size", 1)
            for world in cfg.search.world_size:
                if world % group:
                    raise FieldProblem(f"search.hooks[{i}].group_size",
                                       f"{group} does not divide world_size {world}: every rank needs a group of "
                                       f"{group}; allowed: a divisor of every world size")
            last_warm = max(wl.warmup_steps, params.get("start_iter", 0))
            if cfg.splits_links and cfg.network.timing_steps < last_warm + params["period"]:
                raise FieldProblem("network.timing_steps",
                                   f"{cfg.network.timing_steps} steps time no exchange of {entry.name} with period "
                                   f"{params['period']} after the {last_warm} warm-up steps; allowed: "
                                   f"{last_warm + params['period']} or more")
