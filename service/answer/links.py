"""Quality once, time per link: a split network sweep's runs joined into the trials the
report reads.

With several links (config ``network.link_gbps``, ``SweepConfig.splits_links``) a sweep trains
each (configuration, world size, seed) once, on loopback (its *quality* run, TrialSpec.kind), and
gives each link one short *timing* run per (configuration, world size). The training math does
not depend on the link (tests/test_link_determinism.py), so the report's trial at (configuration,
world size, link, seed) is the quality run of that seed with its speed read from that link's
timing run: losses, evals, final losses, status and NaN provenance from the quality run; step
times, throughput, bytes, the paired ratio, the load and the link's own figures from the timing
run. Its time to target is the quality run's crossing step priced with the timing run's step
times: the steps it timed as measured, every later step at its mean after the warm-up.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

# metrics a split sweep's trial reads from its quality run (the rest: from the timing run)
_QUALITY_PREFIXES = ("final_", "nan_", "first_nan_step", "grad_")


def from_quality_run(metric: str) -> bool:
    """Is ``metric`` about what the training reached (the quality run's), not how fast it ran?"""
    return metric.startswith(_QUALITY_PREFIXES)


def joined(runs: list) -> list:
    """The report's trials from a sweep's runs (data.Trial, one per MLflow run): full runs as they
    are, and each quality run once per link that has a timing run of its configuration and world
    size (``Trial.timing`` set, its step-time history the timing run's)."""
    timing: dict[tuple[str, int], list] = defaultdict(list)
    for t in runs:
        if t.record.kind == "timing":
            timing[(t.config, t.world_size)].append(t)
    out = [t for t in runs if t.record.kind == "full"]
    for q in (t for t in runs if t.record.kind == "quality"):
        out += [dataclasses.replace(q, timing=tm, step_time_ms=tm.step_time_ms)
                for tm in timing[(q.config, q.world_size)]]
    return out


def state(quality_state: str, timing) -> str:
    """A joined trial's state: the quality run's, and when that is ok, its timing run's."""
    return quality_state if timing is None or quality_state != "ok" else timing.state


def measured_ms(t) -> np.ndarray:
    """Step times without the first ones (warm-up: compilation, first bucket rebuild)."""
    ms = t.step_time_ms[1]
    return ms[min(5, len(ms) // 4):]


def timed_steps(t) -> tuple[np.ndarray, np.ndarray]:
    """(steps, ms): the step times a trial's time to target adds up. A joined trial's run past its
    timing run's last step at that run's mean measured step time, up to the quality run's last."""
    steps, ms = t.step_time_ms
    if t.timing is None or not len(steps) or not len(t.loss[0]):
        return steps, ms
    last, timed = int(t.loss[0].max()), int(steps.max())
    rest = np.arange(timed + 1, last + 1, dtype=np.int64)
    steady = float(np.mean(measured_ms(t)))
    return np.concatenate([steps, rest]), np.concatenate([ms, np.full(len(rest), steady)])
