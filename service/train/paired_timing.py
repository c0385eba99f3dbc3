"""Paired step timing: the baseline hook timed inside every trial, on the same ranks, model and
batches, in short windows beside the trial's own steps.

A sweep's trials run one after another; a machine that is busier during one of them (another
job, a noisy neighbour) made that trial's hook look slower or faster than the others, and no
spread rule can tell *when* a trial ran. So each trial also times the baseline: every
``every``-th measured step, one more forward/backward of the step's micro-batches runs on a
second DDP wrapper of the module that carries the baseline hook (allreduce), and is timed. The
two arms run a step apart, so whatever load the machine carries, both see it. Per window::

    ratio = own step / (own step - own forward/backward + baseline forward/backward)

the trial's step against the same step with its forward/backward swapped for the baseline's
(the optimizer step and the rest are the same code for both). ``step_ratio_vs_baseline`` is
the median over the windows, with their interquartile range.

Order: whichever forward/backward runs second finds the step's batches and the module's weights
warm in cache, and a collective just issued (the NaN check's). So the windows alternate: the
trial's first, third, ... window runs *before* the trial's own forward/backward of the step,
outside its timed step, the second, fourth, ... right after its optimizer step. Each window keeps
its order; ``paired_order_effect`` is the median ratio of the after-windows over the median of
the before-windows (1: no order effect; > 1: the arm that runs second looks faster),
bench/paired_order.py measures it (docs/performance.md). A window never falls on a step ``skip``
names (a fidelity step runs an extra fp32 allreduce per bucket in the trial's own backward): it
moves to the next step of its period that is not, or is dropped.

The window leaves the training untouched: it runs on the gradients' own storage set aside (and
given back), with the RNG state and the module's buffers (e.g. BatchNorm's running statistics)
saved before it and restored after; the trial's hook and its state (error feedback, counters)
never see it. tests/test_paired_timing.py checks the weights bit for bit against a run without
windows, in both orders.

With ``find_unused_parameters`` the windows run on a copy of the module (:class:`SideModule`):
DDP's reducer marks a parameter used whenever its gradient accumulator fires, expected or not,
so a backward through the trial's own parameters outside the trial's DDP broke its next step.

An fsdp trial's baseline is FSDP's own fp32 reduce-scatter and fp32 all-gather (``allreduce``'s
sharded form), timed on the trial's own sharded model (:class:`ShardedBaseline`): for the window
every sharded module's custom reduce-scatter and all-gather are swapped for the baseline's, which
has its own state (its bytes, NaN flags and counters are never the trial's; it keeps no residual),
and swapped back after (``ShardedModel.baseline_comms``), the sharded gradients set aside and the
RNG and buffers restored as above. The windows run between steps, FSDP idle: each group's
gradient-sync setting is restored, and no gradient of an unsynced micro-batch is pending to be
reduced by the wrong comms. An fsdp ``allreduce`` trial with the fp32 all-gather is the baseline
itself (:func:`is_baseline`) and pairs nothing; with another all-gather it pairs against fp32's.
"""

from __future__ import annotations

import copy
import statistics
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, ContextManager, Iterator, Optional, Protocol

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import hooks
import hooks.fsdp

if TYPE_CHECKING:
    from service.train.fsdp import ShardedModel


def is_baseline(trial) -> bool:
    """The baseline trial itself: nothing to time it against."""
    return trial.hook == hooks.BASELINE and not trial.non_default_params()


class SideModule:
    """The module a side window (a paired baseline window, the step timeline's compute window)
    runs on: the trial's own (``copy_module=False``) or a copy of it.

    The copy is for a trial whose DDP has ``find_unused_parameters``: its reducer marks every
    parameter whose gradient accumulator fires as used in the current iteration, even outside
    the trial's own forward/backward, so a side backward through the trial's parameters broke
    the trial's next step. The copy has its own parameters, which no reducer of the trial's
    watches, re-synced from the trial's (values and buffers, ``copy_`` under no_grad) before
    each window, so the window computes the same model. It costs one more set of the module's
    parameters and buffers in memory (its gradients are freed after each window), which is why
    only such trials get one.
    """

    def __init__(self, module: torch.nn.Module, copy_module: bool = False):
        self.trained = module
        self.module = copy.deepcopy(module) if copy_module else module

    @property
    def is_copy(self) -> bool:
        return self.module is not self.trained

    @contextmanager
    def window(self) -> Iterator[torch.nn.Module]:
        """The module to run the window on, the trial's trajectory kept (:func:`trajectory_kept`)."""
        with trajectory_kept(self.trained):
            if not self.is_copy:
                yield self.module
                return
            with torch.no_grad():
                for mine, theirs in zip(self.module.parameters(), self.trained.parameters()):
                    mine.copy_(theirs)
                for mine, theirs in zip(self.module.buffers(), self.trained.buffers()):
                    mine.copy_(theirs)
            self.module.zero_grad(set_to_none=True)
            try:
                yield self.module
            finally:
                self.module.zero_grad(set_to_none=True)  # the copy's gradients: freed, not kept


class UnshardedSide:
    """Where an fsdp trial's compute windows run (the step timeline's, train/step_sampling.py: the
    rank's forward and backward with no collective): the unsharded copy given the current full
    parameters (a collective: every rank samples the same steps), torch's RNG kept, its gradients
    freed after. The SideModule of a ddp trial, for a model whose parameters are shards."""

    def __init__(self, model: "ShardedModel"):
        self.model = model

    @contextmanager
    def window(self) -> Iterator[torch.nn.Module]:
        module = self.model.eval_module()
        with trajectory_kept(module):
            yield module


class BaselineArm(Protocol):
    """What a window runs on: ``window()`` yields the wrapper carrying the baseline's comms, the
    trial's trajectory kept (:func:`trajectory_kept`) around it."""

    def window(self) -> ContextManager[torch.nn.Module]: ...


class DDPBaseline:
    """A ddp trial's baseline arm: a second DDP wrapper of the side module carrying the baseline
    hook, with the trial's own DDP arguments (buckets, unused parameters): only the hook differs."""

    def __init__(self, side: SideModule, device, process_group=None, ddp_kwargs: dict | None = None,
                 build_hook: Callable = hooks.build):
        device = torch.device(device)
        self.side = side
        # DDP broadcasts rank 0's parameters at construction: equal on every rank already
        self.ddp = DDP(side.module, device_ids=[device.index] if device.type == "cuda" else None,
                       process_group=process_group, **(ddp_kwargs or {}))
        state, hook = build_hook(hooks.BASELINE, process_group=process_group)
        self.ddp.register_comm_hook(state, hook)

    @contextmanager
    def window(self) -> Iterator[DDP]:
        with self.side.window():
            yield self.ddp


class ShardedBaseline:
    """An fsdp trial's baseline arm: the trial's own sharded model with FSDP's fp32 reduce-scatter
    and fp32 all-gather (``allreduce``'s sharded form, in a state of its own) for the window."""

    def __init__(self, model: "ShardedModel", process_group=None):
        self.model = model
        self.state, self.form = hooks.fsdp.build(hooks.BASELINE, process_group=process_group)

    @contextmanager
    def window(self) -> Iterator["ShardedModel"]:
        with trajectory_kept(self.model.module), self.model.baseline_comms(self.state, self.form):
            yield self.model


class PairedTimer:
    """The baseline arm of one trial: a window every ``every``-th step past the warm-up, before
    the trial's own forward/backward (``before(step)``) or after its step (``after(step)``)."""

    def __init__(self, side: SideModule, *, every: int, warmup_steps: int, device, process_group=None,
                 ddp_kwargs: dict | None = None, skip: Optional[Callable[[int], bool]] = None,
                 arm: Optional[Callable[[], BaselineArm]] = None):
        """``arm``: builds the baseline's arm, only when windows are on (an fsdp trial's:
        :class:`ShardedBaseline`); None: :class:`DDPBaseline` on ``side`` (a collective: DDP's
        construction)."""
        self.every, self.warmup = int(every or 0), warmup_steps
        self.side, self.skip = side, skip or (lambda step: False)
        self.own_fb_ms = 0.0
        self._before: Optional[tuple[int, float]] = None  # a before-window waiting for its own forward/backward
        # step -> (baseline fb ms, own fb ms, whether the baseline ran before the trial's own)
        self.windows: dict[int, tuple[float, float, bool]] = {}
        self._numbered, self._count, self._numbers = 0, 0, {}
        self.arm: Optional[BaselineArm] = None
        if not self.every:
            return
        self.arm = arm() if arm is not None else DDPBaseline(side, device, process_group, ddp_kwargs)

    def _carries(self, step: int) -> bool:
        """Does ``step`` carry a window: one per ``every`` steps past the warm-up, on the first step
        of its period that ``skip`` does not name (none when every step of it is named)."""
        if not self.every or self.skip(step):
            return False
        period = step - step % self.every
        return period > self.warmup and all(self.skip(s) for s in range(period, step))

    def _number(self, step: int) -> Optional[int]:
        """1 for the trial's first window, 2 for its second, ... (None: no window at ``step``): a
        function of the step, so the same on every rank and after a restart."""
        if not self._carries(step):
            return None
        while self._numbered < step:  # counted once, up to the furthest step asked about
            self._numbered += 1
            if self._carries(self._numbered):
                self._count += 1
                self._numbers[self._numbered] = self._count
        return self._numbers[step]

    def due(self, step: int) -> bool:
        return self._carries(step)

    def before(self, step: int) -> bool:
        """A window at ``step`` that runs before the trial's own forward/backward (the odd-numbered)."""
        number = self._number(step)
        return number is not None and number % 2 == 1

    def after(self, step: int) -> bool:
        """A window at ``step`` that runs after the trial's optimizer step (the even-numbered)."""
        number = self._number(step)
        return number is not None and number % 2 == 0

    @contextmanager
    def own(self):
        """Times the trial's own forward/backward of a step (the loop wraps it)."""
        t0 = time.perf_counter()
        yield
        self.own_fb_ms = (time.perf_counter() - t0) * 1000.0
        if self._before is not None:  # the window that ran before this forward/backward: paired now
            step, baseline_ms = self._before
            self.windows[step], self._before = (baseline_ms, self.own_fb_ms, True), None

    def window(self, step: int, forward_backward: Callable[[torch.nn.Module], object]) -> None:
        """The baseline's forward/backward of this step's batches (``forward_backward(wrapper)``:
        the arm's DDP, or an fsdp trial's sharded model with the baseline's comms), timed; the
        module's gradients, buffers and the RNG are as before it. A window before the trial's own
        is paired with the own forward/backward's time by ``own()`` once that ran."""
        with self.arm.window() as wrapper:
            t0 = time.perf_counter()
            forward_backward(wrapper)
            baseline_ms = (time.perf_counter() - t0) * 1000.0
        if self.before(step):
            self._before = (step, baseline_ms)
        else:
            self.windows[step] = (baseline_ms, self.own_fb_ms, False)

    def summary(self, step_ms: dict[int, float]) -> dict[str, float]:
        """step_ratio_vs_baseline (median over the windows, > 1: slower than the baseline) and
        its IQR, baseline_fb_ms and own_fb_ms (medians), paired_windows (how many); with windows
        in both orders, the median ratio of each (paired_ratio_before, paired_ratio_after: the
        baseline's forward/backward before or after the trial's own) and paired_order_effect,
        after over before."""
        ratios = {s: step_ms[s] / (step_ms[s] - own + base) for s, (base, own, _) in self.windows.items()
                  if s in step_ms and step_ms[s] - own + base > 0}
        if not ratios:
            return {}
        values = list(ratios.values())
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else (0, 0, 0)
        out = {"step_ratio_vs_baseline": statistics.median(values),
               "step_ratio_vs_baseline_iqr": q3 - q1,
               "baseline_fb_ms": statistics.median(w[0] for w in self.windows.values()),
               "own_fb_ms": statistics.median(w[1] for w in self.windows.values()),
               "paired_windows": len(values)}
        before = [r for s, r in ratios.items() if self.windows[s][2]]
        after = [r for s, r in ratios.items() if not self.windows[s][2]]
        if before and after:
            out.update(paired_ratio_before=statistics.median(before), paired_ratio_after=statistics.median(after),
                       paired_order_effect=statistics.median(after) / statistics.median(before))
        return out


@contextmanager
def trajectory_kept(module: torch.nn.Module):
    """A side window (a forward/backward the trial does not train on) that leaves the trajectory
    as it was: the module's gradients set aside (the window's land in fresh storage) and given
    back, its buffers (BatchNorm's running statistics) and torch's RNG (dropout draws from it)
    saved and restored. Also used by the step timeline's compute window (train/step_sampling.py)."""
    grads = [p.grad for p in module.parameters()]
    buffers = [b.detach().clone() for b in module.buffers()]
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    for p in module.parameters():
        p.grad = None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        with torch.no_grad():
            for b, saved in zip(module.buffers(), buffers):
                b.copy_(saved)
        for p, g in zip(module.parameters(), grads):
            p.grad = g
