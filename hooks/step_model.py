"""The DDP step model: one measured step of a trial as a timeline of its buckets, priced at any
world size, link and (at a fixed global batch) per-rank batch. Pure Python over hooks/cost.py.

A trial samples a few steps after warm-up into a :class:`StepTimeline`: the forward pass; per
DDP bucket, in the order its hook was called, when it became ready (ms from the start of the
backward pass), the hook's encode (hook entry to the launch of its first collective: it runs on
the autograd thread, so it delays the rest of the backward pass), its collectives' measured time
and its decode (the completion work after the last collective); when the backward pass's own
work ended; the optimizer step.

:func:`price_step` runs the step as DDP does, one link carrying the buckets' collectives in
ready order, overlapped with the rest of the backward pass::

    start_i = max(ready_i + stall_{i-1} + encode_i, end_{i-1})
    end_i   = start_i + comm_i(W, link)
    done_i  = end_i + decode_i(W)
    step    = forward + max(backward_end + stall_n, max_i done_i) + optimizer    (n buckets)

A hook that waits inside its call for part of its collectives (``HookSpec.waits_in_call``;
``waited_i``: that part's fraction of its comm) holds the autograd thread until then, so what
follows in the backward pass moves by its hold: stall_i = stall_{i-1} + (start_i - ready_i -
stall_{i-1} - encode_i) + waited_i * comm_i (the link's queue, then its own wait). The
timeline's ready times and backward end leave the measured holds out (the sampler removes them).

* comm_i: the bucket's collectives at W from the hook's spec (``hooks.cost.hook_collectives``),
  each priced by ``hooks.cost.collective_seconds`` (wire), with the transport correction of
  docs/hooks.md ("Checked against a real link"): what the collectives cost besides the wire on
  the measured link (the CPU work moving their bytes) is kept, per byte a rank sends, and scaled
  with the bytes it sends at W. gloo's ring allreduce pipelines that work under the wire
  (comm = max(transport, wire)); its allgather and all_to_all do not (comm = transport + wire).
  A bucket with any kind outside ``hooks.cost.OVERLAPPING_KINDS`` is priced as not overlapping.
* decode_i(W) = fixed + per_peer * (W - 1) (:class:`LinearCost`; :func:`decode_cost` splits
  a measured decode by the hook's ``HookSpec.decodes_each_rank``); encode does not depend on W.

Cost: O(buckets x collectives per bucket) per priced cell.

:func:`combine` makes one timeline of a few sampled steps on each rank (medians over steps;
across ranks the slowest rank's compute and the least-waiting rank's comm).

At a fixed global batch (:func:`price_cell`) a rank's forward and backward shrink as the batch
splits over more ranks: each is fixed + per-sample cost (:class:`ComputeScaling`, fitted by
:func:`fit_linear` from two measured micro-batch sizes), the timeline's backward scaled along
its compute (the encodes on the autograd thread kept as they are); a cell with more ranks than
samples is refused (:class:`CellRefused`) with its reason.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

from .cost import DEFAULT_LATENCY_S, OVERLAPPING_KINDS, collective_seconds, hook_collectives
from .registry import spec
from .wire import wire_bytes


@dataclass(frozen=True)
class LinearCost:
    """ms = fixed_ms + per_unit_ms * units (floored at 0): a compute per sample, a decode per peer."""

    fixed_ms: float
    per_unit_ms: float = 0.0

    def at(self, units: float) -> float:
        return max(self.fixed_ms + self.per_unit_ms * units, 0.0)


def fit_linear(a: tuple[float, float], b: tuple[float, float]) -> LinearCost:
    """The line through two measured ``(units, ms)`` points, e.g. a rank's backward at two
    micro-batch sizes. ValueError when the units are equal or the cost falls as they grow
    (noise larger than the per-unit cost: measure further apart or longer)."""
    (x1, y1), (x2, y2) = a, b
    if x1 == x2:
        raise ValueError(f"two points at the same size {x1} do not give a per-unit cost")
    slope = (y2 - y1) / (x2 - x1)
    if slope < 0:
        raise ValueError(f"cost falls from {y1} ms at {x1} to {y2} ms at {x2}: no per-unit cost to fit")
    return LinearCost(y1 - slope * x1, slope)


def decode_cost(hook: str, decode_ms: float, world_size: int) -> LinearCost:
    """A decode of ``decode_ms`` measured at ``world_size``, as fixed + per peer.

    A hook whose spec says it decodes each rank's message (``decodes_each_rank``) spent
    decode_ms / W per message, its own one the fixed part and the W - 1 peers' the growing
    part (one measured W cannot tell a fixed overhead from a message; two can, with
    :func:`fit_linear` over W - 1). Any other hook's decode is fixed."""
    if not spec(hook).decodes_each_rank:
        return LinearCost(decode_ms)
    per_message = decode_ms / max(world_size, 1)
    return LinearCost(per_message, per_message)


@dataclass(frozen=True)
class BucketTiming:
    """One bucket of one sampled step, ms. ``comm_ms``: the link's time for its collectives,
    from their launch (or the previous bucket's completion, if later: collectives queue) to the
    completion of its last one, a collective waited for inside the hook included (0: none
    measured, wire only). ``decode``: per peer (W - 1), from :func:`decode_cost`."""

    ready_ms: float
    numel: int
    encode_ms: float
    comm_ms: float
    decode: LinearCost
    element_size: int = 4
    waited: float = 0.0  # the fraction of comm the hook waits for inside its call (see the module doc)


@dataclass(frozen=True)
class StepTimeline:
    """One step of a trial of ``hook`` (with ``hook_params``, the ``HookSpec.from_stats``
    inputs of its measured stats included, e.g. PowerSGD's compressed fraction) at
    ``world_size`` ranks of ``batch`` samples each, on a link of ``link_gbps`` and
    ``latency_s`` (inf, 0: loopback, its wire taken as nothing). ms; ``buckets`` in ready order.
    ``backward_end_ms``: when the backward pass's own work ended (its gradients and the hooks'
    encodes; not DDP's wait for the collectives), from the start of the backward pass. Ready
    times and backward end leave out what hooks that wait in their call held the thread for."""

    hook: str
    world_size: int
    batch: int
    forward_ms: float
    buckets: tuple[BucketTiming, ...]
    backward_end_ms: float
    optimizer_ms: float
    hook_params: dict = field(default_factory=dict)
    link_gbps: float = math.inf
    latency_s: float = 0.0

    def __post_init__(self):
        readies = [b.ready_ms for b in self.buckets]
        if readies != sorted(readies):
            raise ValueError(f"buckets must be in ready order, got ready times {readies}")
        times = [self.forward_ms, self.backward_end_ms, self.optimizer_ms]
        times += [t for b in self.buckets for t in (b.ready_ms, b.encode_ms, b.comm_ms)]
        if min(times, default=0.0) < 0:
            raise ValueError("a step timeline's times must be non-negative")

    @property
    def compute_ms(self) -> float:
        """The step without communication: forward, backward (encodes included), optimizer."""
        return self.forward_ms + self.backward_end_ms + self.optimizer_ms


@dataclass(frozen=True)
class BucketPrice:
    """Where one bucket's communication sits in a priced step: ms from the backward start."""

    start_ms: float
    end_ms: float
    done_ms: float


@dataclass(frozen=True)
class StepPrice:
    """One step priced at ``world_size`` on ``link_gbps``: its time and its buckets' places.
    ``compute_ms``: the (scaled) timeline's forward + backward + optimizer; the rest of
    ``step_ms`` is communication and decoding the backward pass did not hide."""

    world_size: int
    link_gbps: float
    step_ms: float
    compute_ms: float
    buckets: tuple[BucketPrice, ...]


def comm_ms(timeline: StepTimeline, bucket: BucketTiming, world_size: int, link_gbps: float,
            latency_s: float = DEFAULT_LATENCY_S) -> float:
    """The link's time for one bucket's collectives at ``world_size`` on ``link_gbps`` (see the
    module doc): wire + the measured transport, overlapped for allreduce. A timeline measured
    at W = 1 sent nothing, so it has no transport to scale: wire only."""
    measured = _collectives(timeline, bucket, timeline.world_size)
    target = _collectives(timeline, bucket, world_size)
    overlapping = all(c.kind in OVERLAPPING_KINDS for c in measured)
    wire_then = sum(collective_seconds(c.kind, c.nbytes, timeline.world_size, timeline.link_gbps,
                                       timeline.latency_s, c.count) for c in measured)
    # Overlapping: measured = max(transport, wire), so at least the measured time was transport;
    # the others: measured = transport + wire.
    transport = max(bucket.comm_ms / 1000.0 - (0.0 if overlapping else wire_then), 0.0)
    sent_then = sum(wire_bytes(c.kind, c.nbytes, timeline.world_size) for c in measured)
    sent = sum(wire_bytes(c.kind, c.nbytes, world_size) for c in target)
    transport = transport * sent / sent_then if sent_then else 0.0
    wire = sum(collective_seconds(c.kind, c.nbytes, world_size, link_gbps, latency_s, c.count) for c in target)
    return 1000.0 * (max(transport, wire) if overlapping else transport + wire)


def _collectives(timeline: StepTimeline, bucket: BucketTiming, world_size: int) -> list:
    return hook_collectives(timeline.hook, bucket.numel, world_size, bucket.element_size, **timeline.hook_params)


def price_step(timeline: StepTimeline, world_size: int, link_gbps: float,
               latency_s: float = DEFAULT_LATENCY_S) -> StepPrice:
    """The timeline's step at ``world_size`` ranks on ``link_gbps`` (the module doc's formula)."""
    link_free, stall, placed = 0.0, 0.0, []
    for b in timeline.buckets:
        launch = b.ready_ms + stall + b.encode_ms
        start = max(launch, link_free)
        comm = comm_ms(timeline, b, world_size, link_gbps, latency_s)
        link_free = start + comm
        if b.waited > 0:  # the call returns once its wait is over: the backward pass resumes then
            stall += start - launch + b.waited * comm
        placed.append(BucketPrice(start, link_free, link_free + b.decode.at(world_size - 1)))
    backward = max([timeline.backward_end_ms + stall] + [p.done_ms for p in placed])
    return StepPrice(world_size, link_gbps, timeline.forward_ms + backward + timeline.optimizer_ms,
                     timeline.compute_ms, tuple(placed))


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
    layouts = {tuple((b.numel, b.element_size) for b in t.buckets) for t in timelines}
    if len(layouts) != 1:
        raise ValueError(f"timelines with different buckets cannot be combined: {sorted(layouts)}")
    buckets = tuple(
        replace(same[0], ready_ms=compute(b.ready_ms for b in same), encode_ms=compute(b.encode_ms for b in same),
                comm_ms=comm(b.comm_ms for b in same), waited=comm(b.waited for b in same),
                decode=LinearCost(compute(b.decode.fixed_ms for b in same), compute(b.decode.per_unit_ms for b in same)))
        for same in zip(*(t.buckets for t in timelines)))
    return replace(first, forward_ms=compute(t.forward_ms for t in timelines), buckets=buckets,
                   backward_end_ms=compute(t.backward_end_ms for t in timelines),
                   optimizer_ms=compute(t.optimizer_ms for t in timelines))


class CellRefused(ValueError):
    """A (world size, link) cell the model does not price, with the reason in its message."""


@dataclass(frozen=True)
class ComputeScaling:
    """A rank's forward and backward ms against its samples per step, each fixed + per sample
    (:func:`fit_linear` from two micro-batch sizes)."""

    forward: LinearCost
    backward: LinearCost


def rank_batch(global_batch: int, world_size: int) -> int:
    """Samples per rank per step when ``global_batch`` splits over ``world_size`` ranks: the
    largest share (the slowest rank sets the step); CellRefused with more ranks than samples."""
    if world_size > global_batch:
        raise CellRefused(f"W={world_size} has more ranks than the global batch has samples "
                          f"({global_batch}): some ranks would get none")
    return -(-global_batch // world_size)


def at_batch(timeline: StepTimeline, compute: ComputeScaling, batch: int) -> StepTimeline:
    """The timeline with ``batch`` samples per rank: forward and the backward's compute scaled
    by the fitted cost's ratio at ``batch`` to that at the measured batch (so the measured
    times stay at the measured batch); the encodes on the autograd thread kept as they are."""
    fwd = _ratio(compute.forward, batch, timeline.batch)
    bwd = _ratio(compute.backward, batch, timeline.batch)
    encoded, buckets = 0.0, []
    for b in timeline.buckets:
        # ready = backward compute so far + the earlier buckets' encodes on the same thread
        buckets.append(replace(b, ready_ms=max(b.ready_ms - encoded, 0.0) * bwd + encoded))
        encoded += b.encode_ms
    backward_compute = max(timeline.backward_end_ms - encoded, 0.0)
    return replace(timeline, batch=batch, forward_ms=timeline.forward_ms * fwd,
                   buckets=tuple(buckets), backward_end_ms=backward_compute * bwd + encoded)


def _ratio(cost: LinearCost, batch: int, measured_batch: int) -> float:
    then = cost.at(measured_batch)
    return cost.at(batch) / then if then > 0 else 1.0


def price_cell(timeline: StepTimeline, compute: ComputeScaling, global_batch: int, world_size: int,
               link_gbps: float, latency_s: float = DEFAULT_LATENCY_S) -> StepPrice:
    """The step at ``world_size`` on ``link_gbps`` keeping ``global_batch``: each rank's compute
    at its share of the batch (:func:`at_batch`), then :func:`price_step`. CellRefused with
    more ranks than samples."""
    return price_step(at_batch(timeline, compute, rank_batch(global_batch, world_size)),
                      world_size, link_gbps, latency_s)
