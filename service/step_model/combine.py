"""Many sampled steps made one: a rank's few sampled steps, then the ranks, into one
``StepTimeline`` (:func:`combine`), and a trial's every rank's timelines and compute windows into
its ``TrialTimeline`` (:func:`combine_ranks`)."""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Optional

from service.step_model.timeline import LinearCost, StepTimeline
from service.step_model.trial import ComputePoint, TrialTimeline


def combine(per_rank: list[list[StepTimeline]]) -> StepTimeline:
    """One timeline from a few sampled steps on each rank (``per_rank[r]``: rank r's).

    Per rank, each time's median over its steps (one slow step is noise, not the step); then
    across ranks the largest compute-side time (forward, ready, encode, decode, backward end,
    optimizer: the slowest rank sets when a bucket can go and when the step ends) and the
    smallest comm (a rank that reached a collective early waits in it for the others; the one
    that came last waited least, so its comm is closest to the collective's own time).
    ValueError when the timelines' buckets differ. Cost: O(ranks x steps x buckets)."""
    return _fold([_fold(steps, _median, _median) for steps in per_rank], max, min)


def _median(values) -> float:
    return statistics.median(list(values))


def _fold(timelines: list[StepTimeline], compute, comm) -> StepTimeline:
    """``timelines`` combined field by field: ``compute`` over the compute-side times, ``comm``
    over the buckets' comm (each called with an iterable of one field's values)."""
    first = timelines[0]
    layouts = {_layout(t) for t in timelines}
    if len(layouts) != 1:
        raise ValueError(f"timelines with different buckets cannot be combined: {sorted(layouts)}")
    buckets = tuple(
        replace(same[0], ready_ms=compute(b.ready_ms for b in same), encode_ms=compute(b.encode_ms for b in same),
                comm_ms=comm(b.comm_ms for b in same), waited=comm(b.waited for b in same),
                decode=LinearCost(compute(b.decode.fixed_ms for b in same), compute(b.decode.per_unit_ms for b in same)))
        for same in zip(*(t.buckets for t in timelines)))
    sharded = tuple(
        replace(same[0], encode_ms=compute(c.encode_ms for c in same), comm_ms=comm(c.comm_ms for c in same),
                decode=LinearCost(compute(c.decode.fixed_ms for c in same), compute(c.decode.per_unit_ms for c in same)))
        for same in zip(*(t.sharded for t in timelines)))
    return replace(first, forward_ms=compute(t.forward_ms for t in timelines), buckets=buckets,
                   backward_end_ms=compute(t.backward_end_ms for t in timelines),
                   optimizer_ms=compute(t.optimizer_ms for t in timelines), sharded=sharded)


def combine_ranks(per_rank: list[tuple[list[StepTimeline], list[tuple[ComputePoint, ...]]]],
                  sampled_steps: tuple[int, ...]) -> Optional[TrialTimeline]:
    """The trial's timeline from each rank's (sampled timelines, compute windows; ``sampled_steps``
    the steps of the timelines): the timelines by :func:`combine`, only those with the
    buckets of the last sampled step (a step sampled before DDP settled its buckets would not
    combine; the sampler waits for that, this keeps a trial from failing at its end if DDP
    rebuilds later); each compute point, like the compute side there, per rank the median over
    its windows, then the slowest rank's. None when no step was sampled."""
    if not per_rank or not per_rank[0][0]:
        return None
    final = _layout(per_rank[0][0][-1])
    kept = [[t for t in timelines if _layout(t) == final] for timelines, _ in per_rank]
    if not all(kept):
        return None
    timeline = combine(kept)
    sampled_steps = tuple(s for s, t in zip(sampled_steps, per_rank[0][0]) if _layout(t) == final)
    windows = [w for _, w in per_rank]
    points: tuple[ComputePoint, ...] = ()
    if all(windows):
        sizes = min(len(w) for rank in windows for w in rank)  # the points every window has
        points = tuple(
            ComputePoint(windows[0][0][i].samples,
                         max(statistics.median(w[i].forward_ms for w in rank) for rank in windows),
                         max(statistics.median(w[i].backward_ms for w in rank) for rank in windows))
            for i in range(sizes))
    return TrialTimeline(timeline, sampled_steps, points)


def _layout(timeline: StepTimeline) -> tuple:
    """What must match for timelines to combine: the buckets' sizes, an fsdp step's calls."""
    return (tuple((b.numel, b.element_size) for b in timeline.buckets),
            tuple((c.kind, c.phase, c.numel, c.element_size) for c in timeline.sharded))
