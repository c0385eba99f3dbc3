"""A trial's measured steps projected onto faster links, for its summary (written by the worker).

This is the measuring end of the projection: the per-step accounting of one trial's measured
steps and its step time at this trial's world size on the links of service/projection.py, which
then takes these figures to other world sizes for the report.
"""

from __future__ import annotations

import statistics

import hooks
from service.projection import LINKS_GBPS

ACCOUNTED = ("calls", "raw_bytes", "payload_bytes", "allreduce_calls", "seconds")


def projection(trial, measured_ms: list[float], start: dict | None, now: dict) -> dict[str, float]:
    """The per-step accounting of the measured steps and the step time projected onto
    faster links at this trial's world size (``hooks.cost``'s alpha-beta model).

    ``start``/``now``: the hook's counters (``stats()``) when the measured steps began and now.
    compute_ms_per_step = mean step time - mean hook time (hook entry to completion, summed
    over buckets) of the measured steps. The hook time on this machine is the loopback
    collectives, waiting for the other ranks, and the hook's compression kernels: all of it is
    removed, so the projection prices compression kernels at zero (optimistic for compressing
    hooks; their kernels show as hook_time_ms above allreduce's). projected_step_ms_{G}gbps =
    compute_ms_per_step + hooks.cost's projected communication of the measured buckets at
    G Gbit/s. The per-step accounting (hook_calls, raw/payload bytes, allreduce calls) is what
    the report needs to project the same configuration onto other world sizes.
    """
    steps = len(measured_ms)
    if start is None or not steps or trial is None or not now.get("calls"):
        return {}  # every step was warm-up, or a hook without accounting: nothing to project
    delta = {k: now.get(k, 0) - start.get(k, 0) for k in ACCOUNTED}
    compute_ms = max(statistics.fmean(measured_ms) - 1000.0 * delta["seconds"] / steps, 0.0)
    out = {
        "compute_ms_per_step": compute_ms,
        "hook_calls_per_step": delta["calls"] / steps,
        "raw_bytes_per_step": delta["raw_bytes"] / steps,
        "payload_bytes_per_step": delta["payload_bytes"] / steps,
        "allreduce_calls_per_step": delta["allreduce_calls"] / steps,
    }
    params = dict(trial.hook_params)
    for gbps in LINKS_GBPS:
        seconds = hooks.cost.projected_step_seconds(compute_ms / 1000.0, trial.hook, delta, steps,
                                                    trial.world_size, gbps, **params)
        out[f"projected_step_ms_{gbps}gbps"] = 1000.0 * seconds
    return out
