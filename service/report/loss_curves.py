"""The loss curves of loss_curves.png: per world size, one line per configuration over its seeds
(mean, std, each seed's own values), and the minus-baseline panel's pairs, seed by seed.

Drawn by service/report/plots.py; the numbers come from the trials data.py loads.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from service.answer.data import Sweep, Trial, config_order, with_link


@dataclass
class LossCurve:
    """One line of loss_curves.png: a configuration at a world size, over its seeds."""

    config: str
    hook: str
    chunk_size: int | None
    world_size: int
    run_ids: list[str]
    steps: np.ndarray              # every step at which some seed logged a finite loss
    mean: np.ndarray               # mean over the seeds with a finite loss at that step
    std: np.ndarray                # sample std over those seeds (0 where only one)
    count: np.ndarray              # how many seeds contribute at that step
    stops: list[tuple[str, int, float, str]]   # (run_id, step, loss there, "nan" | "failed")
    per_seed: dict[int, np.ndarray] = field(default_factory=dict)   # each seed's loss at ``steps`` (NaN: none)


def paired_loss_delta(curve: LossCurve, base: LossCurve) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """``curve``'s loss minus ``base``'s, seed by seed on the seeds both ran, averaged at each step
    both logged: (steps, mean difference, the shared seeds). Two means over different seeds would
    swing with the seeds' spread (a baseline's adaptive extra seed), not with the hook."""
    seeds = sorted(set(curve.per_seed) & set(base.per_seed))
    common, mine, theirs = np.intersect1d(curve.steps, base.steps, return_indices=True)
    if not seeds or not len(common):
        return np.array([], dtype=np.int64), np.array([]), seeds
    diffs = np.array([curve.per_seed[s][mine] - base.per_seed[s][theirs] for s in seeds])
    finite = np.isfinite(diffs).any(axis=0)
    with np.errstate(invalid="ignore"):
        mean = np.nanmean(np.where(np.isfinite(diffs), diffs, np.nan)[:, finite], axis=0)
    return common[finite], mean, seeds


def loss_curve_data(sweep: Sweep) -> dict[int, list[LossCurve]]:
    """Per world size, one LossCurve per configuration (seeds averaged, band = ±std)."""
    groups: dict[tuple[int, str], list[Trial]] = defaultdict(list)
    for t in sweep.trials:
        groups[(t.world_size, with_link(t.config, t.link))].append(t)
    curves: dict[int, list[LossCurve]] = defaultdict(list)
    for (world_size, config), trials in groups.items():
        by_step: dict[int, list[float]] = defaultdict(list)
        stops = []
        for t in trials:
            steps, values = t.loss
            finite = np.isfinite(values)
            for s, v in zip(steps[finite], values[finite]):
                by_step[int(s)].append(float(v))
            if t.state in ("nan", "failed") and finite.any():
                last = int(np.flatnonzero(finite)[-1])
                stop = t.stop_step if t.state == "nan" else int(steps[last])
                stops.append((t.run_id, stop if stop is not None else int(steps[last]),
                              float(values[last]), t.state))
        ordered = sorted(by_step)
        at = {s: i for i, s in enumerate(ordered)}
        per_seed = {t.seed: np.full(len(ordered), np.nan) for t in trials}
        for t in trials:  # the minus-allreduce panel's pairs (paired_loss_delta): seed by seed
            steps, values = t.loss
            finite = np.isfinite(values)
            per_seed[t.seed][[at[int(s)] for s in steps[finite]]] = values[finite]
        curves[world_size].append(LossCurve(
            config=config, hook=trials[0].hook, chunk_size=trials[0].chunk_size,
            world_size=world_size, run_ids=[t.run_id for t in trials],
            steps=np.array(ordered, dtype=np.int64),
            mean=np.array([np.mean(by_step[s]) for s in ordered]),
            std=np.array([np.std(by_step[s], ddof=1) if len(by_step[s]) > 1 else 0.0
                          for s in ordered]),
            count=np.array([len(by_step[s]) for s in ordered], dtype=np.int64),
            stops=stops, per_seed=per_seed,
        ))
    for world_size in curves:
        curves[world_size].sort(key=lambda c: config_order(c.hook, _params_of(sweep, c)))
    return dict(sorted(curves.items()))


def _params_of(sweep: Sweep, curve: LossCurve) -> dict:
    return next(t.hook_params for t in sweep.trials if t.run_id == curve.run_ids[0])
