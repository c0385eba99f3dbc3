"""Paired step timing: the baseline hook timed inside every trial, on the same ranks, model and
batches, in short windows between the trial's own steps (issue 23).

A sweep's trials run one after another; a machine that is busier during one of them (another
job, a noisy neighbour) made that trial's hook look slower or faster than the others, and no
spread rule can tell *when* a trial ran. So each trial also times the baseline: every
``every``-th measured step, right after the trial's own step, one more forward/backward of the
same micro-batches runs on a second DDP wrapper of the same module that carries the baseline
hook (allreduce), and is timed. The two arms alternate a step apart, so whatever load the
machine carries, both see it. Per window::

    ratio = own step / (own step - own forward/backward + baseline forward/backward)

the trial's step against the same step with its forward/backward swapped for the baseline's
(the optimizer step and the rest are the same code for both). ``step_ratio_vs_baseline`` is
the median over the windows, with their interquartile range.

The window leaves the training untouched: it runs after the optimizer step, on the gradients'
own storage set aside (and given back), with the RNG state and the module's buffers (e.g.
BatchNorm's running statistics) saved before it and restored after; the trial's hook and its
state (error feedback, counters) never see it. tests/test_paired_timing.py checks the weights
bit for bit against a run without windows.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Callable

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import hooks


def is_baseline(trial) -> bool:
    """The baseline trial itself: nothing to time it against."""
    return trial.hook == hooks.BASELINE and not trial.non_default_params()


class PairedTimer:
    """The baseline arm of one trial: ``window`` after every ``every``-th step past the warm-up."""

    def __init__(self, module: torch.nn.Module, *, every: int, warmup_steps: int, device,
                 process_group=None, ddp_kwargs: dict | None = None, build_hook: Callable = hooks.build,
                 baseline: str = hooks.BASELINE):
        self.every, self.warmup = int(every or 0), warmup_steps
        self.module = module
        self.own_fb_ms = 0.0
        self.windows: dict[int, tuple[float, float]] = {}   # step -> (baseline fb ms, own fb ms)
        self.ddp = None
        if not self.every:
            return
        device = torch.device(device)
        # DDP broadcasts rank 0's parameters at construction: equal on every rank already.
        # ddp_kwargs: the trial's own (buckets, unused parameters): only the hook differs
        self.ddp = DDP(module, device_ids=[device.index] if device.type == "cuda" else None,
                       process_group=process_group, **(ddp_kwargs or {}))
        state, hook = build_hook(baseline, process_group=process_group)
        self.ddp.register_comm_hook(state, hook)

    def due(self, step: int) -> bool:
        return bool(self.every) and step > self.warmup and step % self.every == 0

    @contextmanager
    def own(self):
        """Times the trial's own forward/backward of a step (the loop wraps it)."""
        t0 = time.perf_counter()
        yield
        self.own_fb_ms = (time.perf_counter() - t0) * 1000.0

    def window(self, step: int, forward_backward: Callable[[DDP], object]) -> None:
        """The baseline's forward/backward of this step's batches (``forward_backward(ddp)``),
        timed; the module's gradients, buffers and the RNG are as before it."""
        with trajectory_kept(self.module):
            t0 = time.perf_counter()
            forward_backward(self.ddp)
            baseline_ms = (time.perf_counter() - t0) * 1000.0
        self.windows[step] = (baseline_ms, self.own_fb_ms)

    def summary(self, step_ms: dict[int, float]) -> dict[str, float]:
        """step_ratio_vs_baseline (median over the windows, > 1: slower than the baseline) and
        its IQR, baseline_fb_ms and own_fb_ms (medians), paired_windows (how many)."""
        ratios = [step_ms[s] / (step_ms[s] - own + base) for s, (base, own) in self.windows.items()
                  if s in step_ms and step_ms[s] - own + base > 0]
        if not ratios:
            return {}
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else (0, 0, 0)
        return {"step_ratio_vs_baseline": statistics.median(ratios),
                "step_ratio_vs_baseline_iqr": q3 - q1,
                "baseline_fb_ms": statistics.median(b for b, _ in self.windows.values()),
                "own_fb_ms": statistics.median(o for _, o in self.windows.values()),
                "paired_windows": len(ratios)}


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
