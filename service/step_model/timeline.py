"""One measured step as a timeline of its buckets (DDP) or collectives (FSDP): the step model's data.

A trial samples a few steps after warm-up into a :class:`StepTimeline`: the forward pass; per
DDP bucket, in the order its hook was called, when it became ready (ms from the start of the
backward pass), the hook's encode (hook entry to the launch of its first collective: it runs on
the autograd thread, so it delays the rest of the backward pass), its collectives' measured time
and its decode (the completion work after the last collective); when the backward pass's own
work ended; the optimizer step. service/step_model/price.py prices it; stamps.py makes it from
the stamps hooks/step_sampling.py takes. An fsdp trial's step is the same phases with its
collectives in call order instead of buckets (:class:`ShardedCall`): each block's parameter
all-gather in the forward and again in the backward, and its gradient reduce-scatter.

* decode_i(W) = fixed + per_peer * (W - 1) (:class:`LinearCost`; :func:`decode_cost` splits
  a measured decode by the hook's ``HookSpec.decodes_each_rank``); encode does not depend on W.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from hooks.registry import spec


class Cost(Protocol):
    """ms at a number of units (samples, peers): what the step model reads of a fitted cost."""

    def at(self, units: float) -> float: ...


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
    hook: str = ""       # a bucket run by another hook than its step's (a per-bucket plan); "": the step's
    hook_params: dict = field(default_factory=dict)   # that hook's parameters (and measured inputs)

    def priced_as(self, timeline: "StepTimeline") -> tuple[str, dict]:
        """The hook and parameters that price this bucket: its own where it has one, else its step's."""
        return (self.hook, self.hook_params) if self.hook else (timeline.hook, timeline.hook_params)


@dataclass(frozen=True)
class ShardedCall:
    """One of an fsdp step's collectives (hooks/sharded.py), ms, in call order: ``kind``
    (hooks/wire.py's reduce_scatter or all_gather) on ``numel`` unsharded values of
    ``element_size`` bytes, in the ``phase`` it ran in ("forward": the forward pass and the
    micro-batches before the last; "backward": the last backward). ``encode_ms``: the call's
    work before its collective (a cast, quantizing); ``comm_ms``: the collective, launch to
    return; ``decode``: the work after it (widening, dequantizing, averaging), fixed in W: a
    uint8 form decodes W rows of n / W values, the same n values at any W."""

    kind: str
    phase: str
    numel: int
    encode_ms: float
    comm_ms: float
    decode: LinearCost
    element_size: int = 4


@dataclass(frozen=True)
class StepTimeline:
    """One step of a trial of ``hook`` (with ``hook_params``, the ``HookSpec.from_stats``
    inputs of its measured stats included, e.g. PowerSGD's compressed fraction) at
    ``world_size`` ranks of ``batch`` samples each, on a link of ``link_gbps`` and
    ``latency_s`` (inf, 0: loopback, its wire taken as nothing). ms; ``buckets`` in ready order.
    ``backward_end_ms``: when the backward pass's own work ended (its gradients and the hooks'
    encodes; not DDP's wait for the collectives), from the start of the backward pass. Ready
    times and backward end leave out what hooks that wait in their call held the thread for.

    An fsdp step (``sharded``: its collectives, in call order; ``buckets`` empty) runs every
    collective on the training thread, one after another (FSDP2 on CPU/gloo; hooks/sharded.py):
    ``forward_ms`` and ``backward_end_ms`` are then the passes' compute alone, without any call."""

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
    sharded: tuple[ShardedCall, ...] = ()

    def __post_init__(self):
        readies = [b.ready_ms for b in self.buckets]
        if readies != sorted(readies):
            raise ValueError(f"buckets must be in ready order, got ready times {readies}")
        times = [self.forward_ms, self.backward_end_ms, self.optimizer_ms]
        times += [t for b in self.buckets for t in (b.ready_ms, b.encode_ms, b.comm_ms)]
        times += [t for c in self.sharded for t in (c.encode_ms, c.comm_ms)]
        if min(times, default=0.0) < 0:
            raise ValueError("a step timeline's times must be non-negative")

    @property
    def compute_ms(self) -> float:
        """The step without communication: forward, backward (encodes included), optimizer."""
        return self.forward_ms + self.backward_end_ms + self.optimizer_ms


@dataclass(frozen=True)
class SyncTiming:
    """A periodic hook's exchange (hooks/local_sgd.py), once every ``period`` optimizer steps after
    the optimizer step: one call of ``hook`` (with ``hook_params``) on ``numel`` values of
    ``element_size`` bytes, every parameter (post_local_sgd: an allreduce of the parameters;
    diloco: its outer hook on the pseudo-gradient). ms, medians over the trial's exchanges:
    ``comm_ms`` its collectives (from their launch to their completion, the outer hook's decode
    included), ``compute_ms`` the rest (flattening, the outer hook's encode, the outer step, copies)."""

    period: int
    hook: str
    numel: int
    compute_ms: float
    comm_ms: float
    element_size: int = 4
    hook_params: dict = field(default_factory=dict)
