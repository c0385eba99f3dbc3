"""The step model's pricing: a :class:`~service.step_model.timeline.StepTimeline` at any world
size, link and (at a fixed global batch) per-rank batch. Pure Python over hooks/cost.py.

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
  Given the sweep's measured transport (``transport.TransportFit``, transport.json), the
  transport is that fit's at W for the bucket's collectives instead: the machine's, measured
  once, not what the few sampled steps of one trial happened to record; a hook that waits in
  its call keeps the kernels it runs between its collectives (its comm less the fit's transport
  at the measured W). A fit probed across a real link (``TransportFit.link_gbps``: a cluster's,
  python -m service.probe --link-gbps) holds that link's wire: where transport and wire add up it
  is taken out before the cell's own wire is added.
* decode_i(W): the bucket's ``LinearCost`` at W - 1 peers (service/step_model/timeline.py).

Cost: O(buckets x collectives per bucket) per priced cell.

An fsdp step (``StepTimeline.sharded``: each block's all-gather in the forward and in the backward,
its reduce-scatter) is priced as FSDP2 runs it on CPU/gloo, every call on the training thread in
turn (:func:`price_sharded_step`)::

    step = forward + backward + optimizer + sum_calls (encode_c + comm_c(W, link) + decode_c(W))

comm_c as a bucket's (wire + transport; neither FSDP kind is in OVERLAPPING_KINDS unless measured
so), encode_c and decode_c as measured (a uint8 form works on W rows of n / W values: the same n
values at any W). Nothing overlaps: on GPUs FSDP2 prefetches the next block's all-gather
and reduce-scatters on a stream of its own, which this model does not price (there it is an
upper bound).

An fsdp rank's optimizer steps its 1/W shard: :func:`price_cell` scales it by measured W / W
(:func:`sharded_optimizer`).

At a fixed global batch (:func:`price_cell`) a rank's forward and backward shrink as the batch
splits over more ranks: each is fixed + per-sample cost (:class:`ComputeScaling`, fitted by
``timeline.fit_linear`` from two measured micro-batch sizes), the timeline's backward scaled along
its compute (the encodes on the autograd thread kept as they are); a cell with more ranks than
samples is refused (:class:`CellRefused`) with its reason.

A cell on a machine of ``cores`` cores shared by all its ranks (the measurement machine's own
cell, e.g. W = 8 emulated hosts on 2 cores; :func:`time_shared`) has every rank's CPU phases
(forward, backward, encode, decode, optimizer) stretched by W / cores over what the timeline
measured with its own W on those cores; a cluster cell (``cores`` None) gives each rank its own.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from hooks.cost import DEFAULT_LATENCY_S, OVERLAPPING_KINDS, collective_seconds, hook_collectives
from hooks.registry import spec
from hooks.sharded import call_collectives
from hooks.wire import Collective, wire_bytes
from service.step_model.timeline import BucketTiming, Cost, LinearCost, ShardedCall, StepTimeline, SyncTiming
from service.step_model.transport import TransportFit


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
    sync_ms: float = 0.0   # a periodic hook's exchange at the cell (step_ms holds it amortized over its period)


def comm_ms(timeline: StepTimeline, bucket: BucketTiming, world_size: int, link_gbps: float,
            latency_s: float = DEFAULT_LATENCY_S, transport: Optional[TransportFit] = None) -> float:
    """The link's time for one bucket's collectives at ``world_size`` on ``link_gbps`` (see the
    module doc): wire + the measured transport (``transport``'s where given, else the bucket's
    own, scaled), overlapped for allreduce. A timeline measured at W = 1 sent nothing, so
    without ``transport`` it has none to scale: wire only."""
    measured = _collectives(timeline, bucket, timeline.world_size)
    target = _collectives(timeline, bucket, world_size)
    return _link_ms(timeline, measured, target, bucket.comm_ms, Cell(world_size, link_gbps, latency_s, transport),
                    lambda overlapping, wire_then: _kernels_between(timeline, bucket, transport, overlapping, wire_then))


def sharded_comm_ms(timeline: StepTimeline, call: ShardedCall, world_size: int, link_gbps: float,
                    latency_s: float = DEFAULT_LATENCY_S, transport: Optional[TransportFit] = None) -> float:
    """The link's time for one of an fsdp step's collectives at ``world_size`` on ``link_gbps``,
    as :func:`comm_ms` prices a bucket's: the call's collective from its form (hooks/sharded.py)
    at W, wire + transport. A ``transport`` without the call's kind (a probe that measured
    DDP's collectives only) is not used: the call's own measured comm is scaled instead."""
    measured = _sharded_collectives(timeline, call, timeline.world_size)
    target = _sharded_collectives(timeline, call, world_size)
    if transport is not None and not all(c.kind in transport.kinds for c in target):
        transport = None
    return _link_ms(timeline, measured, target, call.comm_ms, Cell(world_size, link_gbps, latency_s, transport),
                    lambda overlapping, wire_then: 0.0)  # a form's kernels are its encode and decode, stamped apart


def _link_ms(timeline: StepTimeline, measured: list, target: list, measured_ms: float, cell: "Cell", kernels) -> float:
    """``target`` collectives' ms at the cell (its W, link, latency and transport; its cores are
    not read), from ``measured`` ones that took ``measured_ms`` where the timeline was measured
    (the module doc); ``kernels(overlapping, wire_then)``: seconds of a hook's own work inside
    its measured comm, kept as measured."""
    world_size, link_gbps, latency_s, transport = cell.world_size, cell.link_gbps, cell.latency_s, cell.transport
    overlapping = all(c.kind in OVERLAPPING_KINDS for c in measured)
    wire = sum(collective_seconds(c.kind, c.nbytes, c.ranks(world_size), link_gbps, latency_s, c.count) for c in target)
    wire_then = sum(collective_seconds(c.kind, c.nbytes, c.ranks(timeline.world_size), timeline.link_gbps,
                                       timeline.latency_s, c.count) for c in measured)
    if transport is not None:
        moved = _moved_s(transport, target, world_size, overlapping)
        own_work = kernels(overlapping, wire_then if not overlapping else 0.0)
        return 1000.0 * (own_work + (max(moved, wire) if overlapping else moved + wire))
    # Overlapping: measured = max(transport, wire), so at least the measured time was transport;
    # the others: measured = transport + wire.
    moved = max(measured_ms / 1000.0 - (0.0 if overlapping else wire_then), 0.0)
    sent_then = sum(wire_bytes(c.kind, c.nbytes, c.ranks(timeline.world_size)) for c in measured)
    sent = sum(wire_bytes(c.kind, c.nbytes, c.ranks(world_size)) for c in target)
    moved = moved * sent / sent_then if sent_then else 0.0
    return 1000.0 * (max(moved, wire) if overlapping else moved + wire)


def _kernels_between(timeline: StepTimeline, bucket: BucketTiming, transport: TransportFit, overlapping: bool,
                     wire_s: float) -> float:
    """Seconds of a hook's own kernels inside its measured comm: a hook that waits in its call
    (``HookSpec.waits_in_call``: PowerSGD's P, orthogonalisation, Q; quantized_allreduce's
    rescale) runs them between its collectives, so its comm_ms holds them beside the transport.
    What the measured comm exceeds the fit's transport (and wire) at the measured W by; 0 for
    every other hook (their comm is the collectives')."""
    if not spec(bucket.priced_as(timeline)[0]).waits_in_call:
        return 0.0
    measured = _collectives(timeline, bucket, timeline.world_size)
    moved = _moved_s(transport, measured, timeline.world_size, overlapping)
    return max(bucket.comm_ms / 1000.0 - moved - wire_s, 0.0)


def _moved_s(transport: TransportFit, collectives: list, world_size: int, overlapping: bool) -> float:
    """Seconds the hosts' transport takes for ``collectives`` at ``world_size``. Overlapping (max with
    the wire): the fit as probed, a probed link's wire inside it or not. Otherwise transport and
    wire add up: the hosts' own part (``TransportFit.own_ms``: a probed link's wire taken out),
    to which the caller adds the cell's wire."""
    ms = transport.ms if overlapping else transport.own_ms
    return sum(ms(c.kind, c.nbytes, c.ranks(world_size), c.count) for c in collectives) / 1000.0


def _collectives(timeline: StepTimeline, bucket: BucketTiming, world_size: int) -> list:
    hook, params = bucket.priced_as(timeline)
    return hook_collectives(hook, bucket.numel, world_size, bucket.element_size, **params)


def _sharded_collectives(timeline: StepTimeline, call: ShardedCall, world_size: int) -> list:
    form = spec(timeline.hook).sharded
    return [Collective(*c) for c in call_collectives(call.kind, form.collectives, call.numel, world_size,
                                                     **timeline.hook_params)]


def price_step(timeline: StepTimeline, world_size: int, link_gbps: float,
               latency_s: float = DEFAULT_LATENCY_S, transport: Optional[TransportFit] = None) -> StepPrice:
    """The timeline's step at ``world_size`` ranks on ``link_gbps`` (the module doc's formula)."""
    if timeline.sharded:
        return price_sharded_step(timeline, world_size, link_gbps, latency_s, transport)
    link_free, stall, placed = 0.0, 0.0, []
    for b in timeline.buckets:
        launch = b.ready_ms + stall + b.encode_ms
        start = max(launch, link_free)
        comm = comm_ms(timeline, b, world_size, link_gbps, latency_s, transport)
        link_free = start + comm
        if b.waited > 0:  # the call returns once its wait is over: the backward pass resumes then
            stall += start - launch + b.waited * comm
        placed.append(BucketPrice(start, link_free, link_free + b.decode.at(world_size - 1)))
    backward = max([timeline.backward_end_ms + stall] + [p.done_ms for p in placed])
    return StepPrice(world_size, link_gbps, timeline.forward_ms + backward + timeline.optimizer_ms,
                     timeline.compute_ms, tuple(placed))


def price_sharded_step(timeline: StepTimeline, world_size: int, link_gbps: float,
                       latency_s: float = DEFAULT_LATENCY_S, transport: Optional[TransportFit] = None) -> StepPrice:
    """An fsdp step at ``world_size`` on ``link_gbps`` (the module doc): its compute plus every
    call, encode + collective + decode, one after another on the training thread, nothing
    overlapped (FSDP2 on CPU/gloo runs them so; on GPUs it overlaps the next block's all-gather
    and the last block's reduce-scatter with compute, which this prices as not overlapped)."""
    calls = sum(c.encode_ms + sharded_comm_ms(timeline, c, world_size, link_gbps, latency_s, transport)
                + c.decode.at(world_size - 1) for c in timeline.sharded)
    return StepPrice(world_size, link_gbps, timeline.compute_ms + calls, timeline.compute_ms, ())


class CellRefused(ValueError):
    """A (world size, link) cell the model does not price, with the reason in its message."""


@dataclass(frozen=True)
class ComputeScaling:
    """A rank's forward and backward ms against its samples per step (a :class:`LinearCost`, or
    the measured points' ``trial.PointsCost``)."""

    forward: Cost
    backward: Cost


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


def sharded_optimizer(timeline: StepTimeline, world_size: int) -> StepTimeline:
    """An fsdp step's optimizer at ``world_size``: each rank steps its 1/W shard of the
    parameters, so the measured optimizer scales by measured W / W (a ddp step's, every rank
    stepping all of them, stays as measured)."""
    if not timeline.sharded or world_size == timeline.world_size:
        return timeline
    return replace(timeline, optimizer_ms=timeline.optimizer_ms * timeline.world_size / world_size)


def _ratio(cost: LinearCost, batch: int, measured_batch: int) -> float:
    then = cost.at(measured_batch)
    return cost.at(batch) / then if then > 0 else 1.0


def sharing(world_size: int, cores: Optional[int]) -> float:
    """How many ranks share a core: W / cores where W ranks exceed the cores, else 1 (and 1 for
    a cluster cell, ``cores`` None: a core per rank)."""
    return 1.0 if cores is None else max(world_size / cores, 1.0)


def time_shared(timeline: StepTimeline, factor: float) -> StepTimeline:
    """The timeline with every CPU phase of the rank (forward, the backward's ready times and
    end, encodes, decodes, optimizer) ``factor`` times as long; the collectives are priced
    apart (their transport measured at the cell's W on the same cores)."""
    if factor == 1.0:
        return timeline
    sharded = tuple(replace(c, encode_ms=c.encode_ms * factor,
                            decode=LinearCost(c.decode.fixed_ms * factor, c.decode.per_unit_ms * factor))
                    for c in timeline.sharded)
    buckets = tuple(replace(b, ready_ms=b.ready_ms * factor, encode_ms=b.encode_ms * factor,
                            decode=LinearCost(b.decode.fixed_ms * factor, b.decode.per_unit_ms * factor))
                    for b in timeline.buckets)
    return replace(timeline, forward_ms=timeline.forward_ms * factor, buckets=buckets, sharded=sharded,
                   backward_end_ms=timeline.backward_end_ms * factor, optimizer_ms=timeline.optimizer_ms * factor)


@dataclass(frozen=True)
class Cell:
    """Where a step is priced: ``world_size`` ranks on ``link_gbps`` with ``latency_s`` per message;
    ``transport`` the sweep's measured one (None: the timeline's own, scaled); ``cores`` the
    machine's when its W ranks share them (the measurement machine's cell), None on a cluster."""

    world_size: int
    link_gbps: float
    latency_s: float = DEFAULT_LATENCY_S
    transport: Optional[TransportFit] = None
    cores: Optional[int] = None


def price_cell(timeline: StepTimeline, compute: ComputeScaling, global_batch: int, cell: Cell) -> StepPrice:
    """The step at ``cell`` keeping ``global_batch``: each rank's compute at its share of the
    batch (:func:`at_batch`), time-shared where the cell's ranks share the machine's cores
    (:func:`time_shared`), then :func:`price_step`; a cluster cell's transport from the world
    sizes probed with a core per rank (``TransportFit.own_cores``). CellRefused with more ranks
    than samples."""
    w = cell.world_size
    shaped = sharded_optimizer(at_batch(timeline, compute, rank_batch(global_batch, w)), w)
    shaped = time_shared(shaped, sharing(w, cell.cores) / sharing(timeline.world_size, cell.cores))
    transport = cell.transport
    if transport is not None and cell.cores is None:  # a cluster: no W probed on shared cores
        transport = transport.own_cores()
    return price_step(shaped, w, cell.link_gbps, cell.latency_s, transport)


def price_sync(timeline: StepTimeline, sync: SyncTiming, cell: Cell) -> float:
    """A periodic hook's exchange at ``cell`` (ms): its measured compute (the flatten, the outer
    step, the copies; time-shared as :func:`price_cell` shares a step's) plus its collectives,
    one call of the exchange's hook on every parameter priced as a bucket is (:func:`comm_ms`)."""
    share = sharing(cell.world_size, cell.cores) / sharing(timeline.world_size, cell.cores)
    transport = cell.transport
    if transport is not None and cell.cores is None:
        transport = transport.own_cores()
    bucket = BucketTiming(ready_ms=0.0, numel=sync.numel, encode_ms=0.0, comm_ms=sync.comm_ms,
                          decode=LinearCost(0.0), element_size=sync.element_size, hook=sync.hook,
                          hook_params=dict(sync.hook_params))
    return sync.compute_ms * share + comm_ms(timeline, bucket, cell.world_size, cell.link_gbps, cell.latency_s, transport)


def amortized(step: StepPrice, sync_ms: float, period: int) -> StepPrice:
    """A local step's price with the exchange every ``period`` steps spread over them."""
    return replace(step, step_ms=step.step_ms + sync_ms / period, sync_ms=sync_ms)
