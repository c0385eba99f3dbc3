"""The points of tradeoff.png: per world size, each configuration's final quality against the
bytes it put on the wire per step, with the Pareto front marked.

A point is set against allreduce's (and every other's) on the seeds they ran: at each (world
size, link) the means are over the seeds every configuration there ran, as the tables' paired
gaps compare (service/answer/recommend.py). Adaptive seeds give allreduce, and the undecided, a
seed the others did not get; that trial's accuracy moved allreduce's point by its seeds' spread,
not by anything a hook did.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from service.answer.data import Sweep, Trial, mean_std, config_order, link_order, with_link


@dataclass
class TradeoffPoint:
    config: str
    hook: str
    world_size: int
    bytes_per_step: float
    quality: float                 # eval accuracy (higher is better) or final loss (lower)
    quality_std: float
    on_front: bool = False
    chunk_size: int | None = None
    seeds: tuple[int, ...] = ()    # the seeds its means are over (those every configuration ran)


def shared_seeds(by_config: dict[str, list[Trial]]) -> set[int]:
    """The seeds every configuration ran (whatever their trials' end); empty where none is shared."""
    return set.intersection(*({t.seed for t in trials} for trials in by_config.values()))


def tradeoff_data(sweep: Sweep) -> tuple[str, dict[int, list[TradeoffPoint]]]:
    """(quality metric name, per world size the points of tradeoff.png with the Pareto front
    marked). Quality is final eval accuracy, or final loss when no trial logged accuracy; each
    point averages its ok trials at the seeds every configuration at its W and link ran (its own
    where they share none). World size 1 is left out when larger ones exist: it sends nothing."""
    ok = [t for t in sweep.trials if t.state == "ok"]
    metric = ("final_eval_accuracy" if any(np.isfinite(t.metric("final_eval_accuracy")) for t in ok)
              else "final_loss")
    groups: dict[tuple[int, str], dict[str, list[Trial]]] = defaultdict(lambda: defaultdict(list))
    for t in sweep.trials:
        groups[(t.world_size, t.link)][t.config].append(t)
    points: dict[int, list[TradeoffPoint]] = defaultdict(list)
    for world_size, link in sorted(groups, key=lambda k: (k[0], link_order(k[1]))):
        by_config = groups[(world_size, link)]
        shared = shared_seeds(by_config)
        for config, trials in sorted(by_config.items(), key=lambda c: config_order(c[1][0].hook, c[1][0].hook_params)):
            mine = [t for t in trials if t.state == "ok" and (t.seed in shared or not shared)]
            bytes_mean, _, n_bytes = mean_std([t.metric("comm_bytes_per_step") for t in mine])
            quality, quality_std, n_quality = mean_std([t.metric(metric) for t in mine])
            if n_bytes and n_quality:
                points[world_size].append(TradeoffPoint(
                    with_link(config, link), trials[0].hook, world_size, bytes_mean, quality, quality_std,
                    chunk_size=trials[0].chunk_size, seeds=tuple(sorted(t.seed for t in mine))))
    if any(w > 1 for w in points):
        points.pop(1, None)
    for group in points.values():
        _mark_front(group, metric)
    return metric, dict(sorted(points.items()))


def _mark_front(group: list[TradeoffPoint], metric: str) -> None:
    """on_front: no other point has both no more bytes and no worse quality (and differs)."""
    better = (lambda a, b: a >= b) if metric == "final_eval_accuracy" else (lambda a, b: a <= b)
    for p in group:
        p.on_front = not any(
            q is not p and q.bytes_per_step <= p.bytes_per_step and better(q.quality, p.quality)
            and (q.bytes_per_step < p.bytes_per_step or q.quality != p.quality)
            for q in group)
