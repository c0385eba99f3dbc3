"""Time to target: when a trial's eval loss first reaches the target, and how much that time
moves with the machine's step-time noise (service/answer/recommend.py's module doc, point 2)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class TimeToTarget:
    seconds: float | None      # None: the target was never reached
    step: float | None         # the (interpolated) step where it was reached
    interpolated: bool         # the crossing lies between two evals more than a step apart


def time_to_target(eval_steps: Sequence[int], eval_loss: Sequence[float], steps: Sequence[int],
                   step_ms: Sequence[float], target: float) -> TimeToTarget:
    """When a trial's eval loss first reaches ``target`` (see the module doc)."""
    eval_steps, eval_loss = np.asarray(eval_steps, float), np.asarray(eval_loss, float)
    order = np.argsort(np.asarray(steps))
    steps = np.asarray(steps, float)[order]
    cumulated = np.cumsum(np.asarray(step_ms, float)[order]) / 1000.0
    if not len(steps) or not math.isfinite(target):
        return TimeToTarget(None, None, False)

    def seconds_at(step: float) -> float:
        # cumulated time is known at integer steps; before the first step nothing has run
        return float(np.interp(step, np.concatenate([[steps[0] - 1], steps]),
                               np.concatenate([[0.0], cumulated])))

    previous = None
    for s, value in zip(eval_steps, eval_loss):
        if not math.isfinite(value):
            break  # a NaN trial never reaches anything after it
        if value <= target:
            if previous is None or previous[1] == value:
                return TimeToTarget(seconds_at(s), float(s), False)
            s0, v0 = previous
            crossing = s0 + (v0 - target) / (v0 - value) * (s - s0)
            return TimeToTarget(seconds_at(crossing), float(crossing), s - s0 > 1)
        previous = (s, value)
    return TimeToTarget(None, None, False)


def spread(seconds: float, step_ms: Sequence[float]) -> float:
    """How much a time to target moves with this machine's step-time noise: the time scaled by
    the steps' interquartile range over their median."""
    if len(step_ms) < 4:
        return 0.0
    q1, median, q3 = np.percentile(np.asarray(step_ms, float), [25, 50, 75])
    return float(seconds * (q3 - q1) / median) if median > 0 else 0.0
