"""The raw stamps of a sampled DDP step: what the step model (service/step_model/) makes a timeline of.

A training loop holds one :class:`StepSampler` per hook state and calls it at the step's phase
boundaries: ``forward(step)``, ``backward()``, ``optimizer()``, ``done()``. On a sampled step
the sampler puts a :class:`StepRecorder` in ``state.sampling`` and the state's own per-call
methods stamp each bucket's hook call (``HookState.begin``: called; the first ``account``:
its first collective launched, since every hook accounts a collective just before launching it;
``finish``: the hook returned; the completion step: collective completed, decode done). Cost:
``time.perf_counter()`` five times per bucket on a sampled step, no device or cross-rank sync;
on any other step one ``is not None`` test per state method and per phase call.

The stamps are all this module keeps (hooks/ holds no model): service/step_model/stamps.py
turns them into the step model's ``StepTimeline``. Times are this rank's.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterable, Optional


class BucketCall:
    """One hook call's timestamps (``time.perf_counter`` seconds; None until reached)."""

    __slots__ = ("numel", "element_size", "called", "launched", "returned", "completed", "decoded", "kind")

    def __init__(self, numel: int, element_size: int, called: float, kind: str = ""):
        self.numel, self.element_size, self.called = numel, element_size, called
        self.kind = kind  # "": a DDP bucket's hook; an FSDP collective's kind (hooks/sharded.py): its call
        self.launched = self.returned = self.completed = self.decoded = None


class StepRecorder:
    """What ``HookState.sampling`` holds during a sampled step: its hook calls, in call order
    (hook calls run one at a time on the autograd thread; completions on the group's thread
    write only their own call)."""

    def __init__(self):
        self.calls: list[BucketCall] = []

    def called(self, buf, t0: float, kind: str = "") -> None:
        self.calls.append(BucketCall(buf.numel(), buf.element_size(), t0, kind))

    def launched(self) -> None:
        call = self.calls[-1]
        if call.launched is None:  # the first collective of the call: where its encode ends
            call.launched = time.perf_counter()

    def returned(self) -> BucketCall:
        call = self.calls[-1]
        call.returned = time.perf_counter()
        return call

    def completed(self) -> None:
        """A synchronous collective of the current call returned (an FSDP form's: what follows is its decode)."""
        self.calls[-1].completed = time.perf_counter()


@dataclass
class SampledStep:
    """One sampled step's phase boundaries (perf_counter seconds) and its hook calls."""

    step: int
    forward: float
    backward: float = math.nan
    optimizer: float = math.nan
    end: float = math.nan
    calls: list[BucketCall] = field(default_factory=list)


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
