"""Designing a per-bucket plan from the sweep's step timelines: which configuration each DDP
bucket should run, for one cell.

A bucket's communication costs time only where it is exposed: DDP launches buckets as the
backward pass makes them ready, so an early bucket's collectives overlap the backward of the
layers still to come while the last one waits alone. Every configuration of the sweep recorded
a timeline of the same buckets (the same model and bucket cap: the same sizes, in the same
order); a plan takes, per bucket, one configuration's measured encode, collectives and decode,
keeps the baseline's compute, and is priced by the one step model (``price.price_cell``, each
bucket by its own hook: ``BucketTiming.hook``).

The search: every assignment where there are few (``EXHAUSTIVE`` plans or fewer), else
coordinate descent from the best uniform configuration (each bucket in turn takes the choice
that lowers the step most, until a full pass changes nothing). Then the band rule: a bucket
that is not the baseline's goes back to the baseline where what it saves is within the model's
error on the ratio of its configuration's step to the baseline's (``margin_pct``, per
configuration: % of the step): compression is worth its kernels and its accuracy only where the
model is sure the bucket's communication is exposed.

Pure Python; the candidates' quality (only configurations whose verdict matches the baseline's)
is the caller's to choose.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Mapping, Optional

from service.step_model.price import Cell, ComputeScaling, price_cell
from service.step_model.timeline import BucketTiming, StepTimeline

EXHAUSTIVE = 4096   # plans priced one by one at most; beyond, coordinate descent


@dataclass(frozen=True)
class Plan:
    """A designed plan: per bucket (in DDP's index order) the configuration it runs; its
    projected step against the best uniform configuration's, at one cell."""

    choices: tuple[str, ...]
    step_ms: float
    uniform: str
    uniform_step_ms: float
    searched: str          # "every plan (N)" or "coordinate descent"
    baseline_step_ms: float = 0.0   # the baseline everywhere, at the same compute

    @property
    def gain_pct(self) -> float:
        """How much shorter the plan's step is than the best uniform one's, %."""
        return 100.0 * (1.0 - self.step_ms / self.uniform_step_ms)

    @property
    def is_uniform(self) -> bool:
        return len(set(self.choices)) == 1


def layout(timeline: StepTimeline) -> tuple[int, ...]:
    """The buckets' sizes in order: two timelines can be mixed bucket by bucket only where equal."""
    return tuple(b.numel for b in timeline.buckets)


def mixed_timeline(baseline: StepTimeline, options: dict[str, StepTimeline], choices: tuple[str, ...]) -> StepTimeline:
    """The plan's timeline: the baseline's compute (forward, optimizer, each bucket's backward
    compute before it), each bucket's encode, collectives and decode from its chosen
    configuration's timeline; a bucket's ready time moves by the encodes before it (they run on
    the autograd thread)."""
    own_encodes = chosen_encodes = 0.0
    buckets = []
    for i, (b, name) in enumerate(zip(baseline.buckets, choices)):
        src = options[name]
        pick = src.buckets[i]
        ready = max(b.ready_ms - own_encodes, 0.0) + chosen_encodes
        buckets.append(BucketTiming(ready, pick.numel, pick.encode_ms, pick.comm_ms, pick.decode, pick.element_size,
                                    pick.waited, *pick.priced_as(src)))
        own_encodes += b.encode_ms
        chosen_encodes += pick.encode_ms
    end = max(baseline.backward_end_ms - own_encodes, 0.0) + chosen_encodes
    return replace(baseline, buckets=tuple(buckets), backward_end_ms=max(end, buckets[-1].ready_ms if buckets else 0.0))


def design(baseline: str, options: dict[str, StepTimeline], compute: ComputeScaling, global_batch: int,
           cell: Cell, margin_pct: Optional[Mapping[str, float]] = None) -> Plan:
    """The plan that minimises the projected step at ``cell`` over ``options`` (configuration ->
    its timeline, ``baseline`` among them, all of one bucket layout), then the band rule (the
    module doc). ValueError where the layouts differ."""
    base = options[baseline]
    names = list(options)
    different = [n for n in names if layout(options[n]) != layout(base)]
    if different:
        raise ValueError(f"{', '.join(different)} recorded other buckets than {baseline} "
                         f"({len(options[different[0]].buckets)} against {len(base.buckets)}): no plan mixes them")

    def step(choices: tuple[str, ...]) -> float:
        return price_cell(mixed_timeline(base, options, choices), compute, global_batch, cell).step_ms

    n = len(base.buckets)
    uniform = {name: step((name,) * n) for name in names}
    best_uniform = min(uniform, key=uniform.get)
    if len(names) ** n <= EXHAUSTIVE:
        best, searched = min(itertools.product(names, repeat=n), key=step), f"every plan ({len(names) ** n})"
    else:
        best, searched = _descend((best_uniform,) * n, names, step), "coordinate descent"
    best = _keep_baseline_within_band(best, baseline, step, margin_pct or {})
    return Plan(tuple(best), step(tuple(best)), best_uniform, uniform[best_uniform], searched, uniform[baseline])


def _descend(start: tuple[str, ...], names: list[str], step) -> tuple[str, ...]:
    current, cost = list(start), step(start)
    changed = True
    while changed:
        changed = False
        for i in range(len(current)):
            for name in names:
                trial = tuple(current[:i] + [name] + current[i + 1:])
                c = step(trial)
                if c < cost - 1e-9:
                    current, cost, changed = list(trial), c, True
    return tuple(current)


def _keep_baseline_within_band(choices: tuple[str, ...], baseline: str, step,
                               margin_pct: Mapping[str, float]) -> tuple[str, ...]:
    """Each non-baseline bucket, the one saving least (over its margin) first, back to the
    baseline while the step it saves is at most its configuration's ``margin_pct`` % of the
    plan's step (0 for a configuration without one)."""
    current = list(choices)
    while True:
        cost = step(tuple(current))
        savings = []
        for i, name in enumerate(current):
            if name != baseline:
                reverted = tuple(current[:i] + [baseline] + current[i + 1:])
                savings.append((step(reverted) - cost - cost * margin_pct.get(name, 0.0) / 100.0, i))
        if not savings:
            return tuple(current)
        beyond, i = min(savings)
        if beyond > 0:
            return tuple(current)
        current[i] = baseline
