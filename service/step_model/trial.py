"""A trial's recorded step (DDP's buckets or FSDP's collectives): the ranks' sampled step timelines combined into one
``StepTimeline`` (service/step_model/combine.py), the rank's compute at its micro-batch, half and
a quarter of it (the model's ``ComputeScaling``), and the JSON form rank 0 attaches to the trial's run
(``step_timeline.json``, read back by ``service.tracking.SweepReader.step_timeline``).

Written by the training loop (service/train/step_sampling.py), read by the projection.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Iterable, Optional

from hooks.cost import DEFAULT_LATENCY_S
from service.step_model.price import (Cell, CellRefused, ComputeScaling, StepPrice, amortized, price_cell, price_step,
                                      price_sync, rank_batch)
from service.step_model.timeline import BucketTiming, LinearCost, ShardedCall, StepTimeline, SyncTiming, fit_linear
from service.step_model.transport import ProbeHosts, TransportFit

ARTIFACT = "step_timeline.json"
FORMAT = 1  # the JSON's version: a reader refuses any other


@dataclass(frozen=True)
class ComputePoint:
    """A rank's forward and backward ms (bare module: no hook, no collective) for one step's
    micro-batches at ``samples`` samples per step (``grad_accumulation`` micro-batches)."""

    samples: int
    forward_ms: float
    backward_ms: float


@dataclass(frozen=True)
class TrialTimeline:
    """What a trial recorded of its step: ``timeline`` (``combine`` of every rank's sampled
    steps), the steps sampled, and the compute at the rank's batch and at smaller ones
    (``compute_points``, largest first: the batch, its half and, from 4 samples, its quarter;
    empty where the micro-batch has one sample)."""

    timeline: StepTimeline
    sampled_steps: tuple[int, ...]
    compute_points: tuple[ComputePoint, ...] = ()
    hosts: Optional[ProbeHosts] = None   # where the ranks computed it (None: a timeline from before it was recorded)
    sync: Optional[SyncTiming] = None    # a periodic hook's exchange (its sampled steps are local ones); None: none

    @property
    def compute(self) -> Optional[ComputeScaling]:
        """Forward and backward against the samples per step through the measured points
        (:class:`PointsCost`); None without two points."""
        if len(self.compute_points) < 2:
            return None
        points = sorted(self.compute_points, key=lambda p: p.samples)
        return ComputeScaling(PointsCost.through([(p.samples, p.forward_ms) for p in points]),
                              PointsCost.through([(p.samples, p.backward_ms) for p in points]))

    def own_step_ms(self) -> float:
        """The timeline priced where it was measured (its W, link and latency): the model's step,
        set beside the trial's measured median step (``timeline_vs_measured``)."""
        t = self.timeline
        step = price_step(t, t.world_size, t.link_gbps, t.latency_s)
        return self._with_sync(step, Cell(t.world_size, t.link_gbps, t.latency_s)).step_ms

    def price(self, global_batch: int, world_size: int, link_gbps: float,
              latency_s: float = DEFAULT_LATENCY_S, transport: Optional[TransportFit] = None,
              cores: Optional[int] = None) -> StepPrice:
        """The step at ``world_size`` ranks on ``link_gbps`` keeping ``global_batch`` (the one
        step model: ``price.price_cell``), its collectives' transport from ``transport`` (the
        sweep's transport.json) where given, its ranks sharing ``cores`` where given (this
        machine's own cell). CellRefused where the cell's rank batch is not the measured one and
        the trial has no compute scaling to take it there."""
        scaling = self.compute
        if scaling is None:
            if rank_batch(global_batch, world_size) != self.timeline.batch:
                raise CellRefused(f"W={world_size} changes the rank's batch ({self.timeline.batch} samples measured) "
                                  "and the trial measured no compute at a second batch size")
            scaling = ComputeScaling(LinearCost(self.timeline.forward_ms), LinearCost(self.timeline.backward_end_ms))
        cell = Cell(world_size, link_gbps, latency_s, transport, cores)
        return self._with_sync(price_cell(self.timeline, scaling, global_batch, cell), cell)

    def _with_sync(self, step: StepPrice, cell: Cell) -> StepPrice:
        """``step`` (a local step's price) with a periodic hook's exchange amortized over its period."""
        if self.sync is None:
            return step
        return amortized(step, price_sync(self.timeline, self.sync, cell), self.sync.period)

    def summary(self, measured_step_ms: float) -> dict[str, float]:
        """The run's headline metrics: the model's own step and its ratio to the measured median."""
        own = self.own_step_ms()
        out = {"timeline_step_ms": own, "timeline_steps": len(self.sampled_steps)}
        if measured_step_ms > 0:
            out["timeline_vs_measured"] = own / measured_step_ms
        return out

    def to_json(self) -> dict:
        t = asdict(self.timeline)
        t["link_gbps"] = None if math.isinf(self.timeline.link_gbps) else self.timeline.link_gbps  # JSON has no inf
        return {"format": FORMAT, "timeline": t, "sampled_steps": list(self.sampled_steps),
                "compute_points": [asdict(p) for p in self.compute_points],
                **({"hosts": asdict(self.hosts)} if self.hosts is not None else {}),
                **({"sync": asdict(self.sync)} if self.sync is not None else {})}

    @classmethod
    def from_json(cls, data: dict) -> "TrialTimeline":
        if data.get("format") != FORMAT:
            raise ValueError(f"step timeline format {data.get('format')!r}, this reader reads {FORMAT}")
        t = dict(data["timeline"])
        t["buckets"] = tuple(BucketTiming(**{**b, "decode": LinearCost(**b["decode"])}) for b in t["buckets"])
        t["sharded"] = tuple(ShardedCall(**{**c, "decode": LinearCost(**c["decode"])}) for c in t.get("sharded", ()))
        t["link_gbps"] = math.inf if t["link_gbps"] is None else t["link_gbps"]
        return cls(StepTimeline(**t), tuple(data["sampled_steps"]),
                   tuple(ComputePoint(**p) for p in data["compute_points"]),
                   ProbeHosts(**data["hosts"]) if data.get("hosts") else None,
                   SyncTiming(**data["sync"]) if data.get("sync") else None)


def pooled_compute(timelines: Iterable[TrialTimeline]) -> list[TrialTimeline]:
    """Each timeline with its compute points replaced by the medians, point by point, of the
    points of every timeline measured at the same world size and micro-batch sizes. The points
    time the bare module (no hook, no collective: service/train/step_sampling.py), so every trial
    of a sweep at one W measures the same thing, while one trial's two points are a few steps
    each and the fit extrapolates their difference to other batches (docs/performance.md
    "Compute from every trial"). A timeline's own step (forward, backward, buckets) stays its own."""
    timelines = list(timelines)
    groups: dict[tuple, list[TrialTimeline]] = {}
    for t in timelines:
        if t.compute_points:
            groups.setdefault(_point_key(t), []).append(t)
    pooled = {key: tuple(ComputePoint(p.samples, statistics.median(g.compute_points[i].forward_ms for g in group),
                                      statistics.median(g.compute_points[i].backward_ms for g in group))
                         for i, p in enumerate(group[0].compute_points))
              for key, group in groups.items()}
    return [replace(t, compute_points=pooled[_point_key(t)]) if t.compute_points else t for t in timelines]


@dataclass(frozen=True)
class PointsCost:
    """ms against samples through measured points: between two neighbouring points the line
    through them, beyond the ends the end pair's line. A cell's compute at a batch the trial
    measured is that measurement, where one line through the largest two would extrapolate
    their difference (the emulated cluster's W = 8 compute from W = 2's 32 and 16 samples:
    docs/performance.md, "A third compute point"). Where a cost fell as the batch grew (its
    per-sample cost below the timer's noise: a tiny model, or a loaded machine) that segment is
    priced as fixed, at the larger batch's measurement, rather than refusing every cell that
    changes the batch."""

    lines: tuple[tuple[float, LinearCost], ...]  # (the segment's upper end in samples, its line)

    @classmethod
    def through(cls, points: list[tuple[float, float]]) -> "PointsCost":
        """``points`` (samples, ms), sorted by samples, at least two."""
        pairs = list(zip(points, points[1:]))
        return cls(tuple((b[0] if i < len(pairs) - 1 else math.inf, _fit_or_flat(a, b))
                         for i, (a, b) in enumerate(pairs)))

    def at(self, units: float) -> float:
        return next(line for upper, line in self.lines if units <= upper).at(units)


def _point_key(t: TrialTimeline) -> tuple:
    return (t.timeline.world_size, tuple(p.samples for p in t.compute_points))


def _fit_or_flat(a: tuple[float, float], b: tuple[float, float]) -> LinearCost:
    """``fit_linear`` through the two points; where the cost fell as the batch grew, a fixed
    cost at the larger batch's measurement (the one the trial's own timeline has)."""
    try:
        return fit_linear(a, b)
    except ValueError:
        return LinearCost(max(a, b)[1])
