"""Sampling a trial's DDP step as a timeline (the step model's input, hooks/step_model.py).

A training loop holds one :class:`StepSampler` per hook state and calls it at the step's phase
boundaries: ``forward(step)``, ``backward()``, ``optimizer()``, ``done()``. On a sampled step
the sampler puts a :class:`StepRecorder` in ``state.sampling`` and the state's own per-call
methods stamp each bucket's hook call (``HookState.begin``: called; the first ``account``:
its first collective launched, since every hook accounts a collective just before launching it;
``finish``: the hook returned; the completion step: collective completed, decode done). Cost:
``time.perf_counter()`` five times per bucket on a sampled step, no device or cross-rank sync;
on any other step one ``is not None`` test per state method and per phase call.

:meth:`StepSampler.timelines` turns the samples into ``StepTimeline`` objects:

* ready = hook called - backward start; encode = first launch - called;
* comm = completed - max(first launch, the previous bucket's completion): collectives queue on
  the group, so a bucket's own time on the link starts when the one before it finished; a
  collective the hook waits for inside its call (quantized_allreduce's all_to_all, PowerSGD's
  whole compressed exchange with its matrix products) counts as comm;
* decode = decode done - completed (split per peer by ``step_model.decode_cost``);
* a hook that waits in its call (``HookSpec.waits_in_call``): waited = (returned - comm start) /
  comm, and its hold (returned - first launch) left out of the later ready times and the
  backward end, which the model puts back as its link and W make it;
* backward end = the last hook call's return (the autograd thread's own work: its gradients and
  the hooks' encodes, not DDP's wait for the collectives at the end of ``backward()``).

Times are this rank's: the lead rank's or a median over ranks is the caller's choice.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterable, Optional

from .registry import spec
from .step_model import BucketTiming, StepTimeline, decode_cost


class BucketCall:
    """One hook call's timestamps (``time.perf_counter`` seconds; None until reached)."""

    __slots__ = ("numel", "element_size", "called", "launched", "returned", "completed", "decoded")

    def __init__(self, numel: int, element_size: int, called: float):
        self.numel, self.element_size, self.called = numel, element_size, called
        self.launched = self.returned = self.completed = self.decoded = None


class StepRecorder:
    """What ``HookState.sampling`` holds during a sampled step: its hook calls, in call order
    (hook calls run one at a time on the autograd thread; completions on the group's thread
    write only their own call)."""

    def __init__(self):
        self.calls: list[BucketCall] = []

    def called(self, buf, t0: float) -> None:
        self.calls.append(BucketCall(buf.numel(), buf.element_size(), t0))

    def launched(self) -> None:
        call = self.calls[-1]
        if call.launched is None:  # the first collective of the call: where its encode ends
            call.launched = time.perf_counter()

    def returned(self) -> BucketCall:
        call = self.calls[-1]
        call.returned = time.perf_counter()
        return call


@dataclass
class SampledStep:
    """One sampled step's phase boundaries (perf_counter seconds) and its hook calls."""

    step: int
    forward: float
    backward: float = math.nan
    optimizer: float = math.nan
    end: float = math.nan
    calls: list[BucketCall] = field(default_factory=list)

    def timeline(self, hook: str, hook_params: dict, world_size: int, batch: int,
                 link_gbps: float = math.inf, latency_s: float = 0.0) -> StepTimeline:
        """This step as the step model's ``StepTimeline`` (ms; see the module doc)."""
        ms, waits = _ms, spec(hook).waits_in_call
        buckets, link_free, held = [], -math.inf, 0.0
        for c in self.calls:
            launched = c.launched if c.launched is not None else c.returned
            comm_from = max(launched, link_free)
            comm = ms(comm_from, c.completed)
            buckets.append(BucketTiming(
                ready_ms=max(ms(self.backward, c.called) - held, 0.0), numel=c.numel, element_size=c.element_size,
                encode_ms=ms(c.called, launched), comm_ms=comm,
                decode=decode_cost(hook, ms(c.completed, c.decoded), world_size),
                waited=min(ms(comm_from, c.returned) / comm, 1.0) if waits and comm > 0 else 0.0))
            if waits:  # the thread's hold after the launch: the model puts it back at its own W and link
                held += ms(launched, c.returned)
            link_free = c.completed
        own_end = max((c.returned for c in self.calls), default=self.optimizer)
        return StepTimeline(hook=hook, hook_params=dict(hook_params), world_size=world_size, batch=batch,
                            forward_ms=ms(self.forward, self.backward), buckets=tuple(buckets),
                            backward_end_ms=max(ms(self.backward, own_end) - held, 0.0),
                            optimizer_ms=ms(self.optimizer, self.end),
                            link_gbps=link_gbps, latency_s=latency_s)


class StepSampler:
    """Records the steps in ``steps`` of a trial whose hook state is ``state`` (built by
    ``hooks.build``: it knows its hook's name and parameters). The loop calls, every step::

        sampler.forward(step); ...forward...; sampler.backward(); ...backward (the hooks run)...
        sampler.optimizer(); ...optimizer step...; sampler.done()
    """

    def __init__(self, state, steps: Iterable[int]):
        self.state, self.steps = state, frozenset(steps)
        self.samples: list[SampledStep] = []
        self._open: Optional[SampledStep] = None

    def forward(self, step: int) -> None:
        if step in self.steps:
            self._open = SampledStep(step, time.perf_counter())
            self.state.sampling = StepRecorder()

    def backward(self) -> None:
        if self._open is not None:
            self._open.backward = time.perf_counter()

    def optimizer(self) -> None:
        if self._open is not None:
            self._open.optimizer = time.perf_counter()

    def done(self) -> None:
        if self._open is not None:
            self._open.end = time.perf_counter()
            self._open.calls = self.state.sampling.calls
            self.samples.append(self._open)
            self._open, self.state.sampling = None, None

    def timelines(self, world_size: int, batch: int, link_gbps: float = math.inf, latency_s: float = 0.0,
                  **measured_params) -> list[StepTimeline]:
        """The sampled steps as ``StepTimeline`` objects; ``measured_params``: the hook's
        ``HookSpec.from_stats`` inputs read from its measured stats (PowerSGD's)."""
        params = {**self.state.params, **measured_params}
        return [s.timeline(self.state.name, params, world_size, batch, link_gbps, latency_s) for s in self.samples]


def _ms(earlier: float, later: float) -> float:
    return 1000.0 * max(later - earlier, 0.0)
