"""Sampling the trial's own step timeline, what the step model prices it from (a ddp trial's
buckets; an fsdp trial's collectives in call order, its compute windows on the unsharded copy:
service/train/paired_timing.py's UnshardedSide).

``tracking.timeline_steps`` steps after the warm-up (spread over the trial, never a fidelity or a
paired-timing step: those run extra hooks and collectives) are sampled by
``hooks.step_sampling.StepSampler``: ``perf_counter`` stamps at the step's phases and each hook
call, no sync (an unsampled step pays a set lookup and an ``is not None`` per phase). Right after
a sampled step (outside its measured time), a compute window times the rank's forward and backward
on the bare module (no hook, no collective, no DDP) at its micro-batch, at half and (from 4
samples) a quarter of it, the trajectory kept (``paired_timing.SideModule``: with
``find_unused_parameters`` a re-synced copy of the module, whose backward no reducer of the
trial's sees): the points of the model's ``ComputeScaling`` (the quarter is W = 8's batch where
W = 2 was measured: priced from a measurement, not extrapolated); on every other sampled step only
(:func:`window_steps`: each window costs about two training steps' compute, which
bench/instrumentation.py --timeline counts against the budget).
At the end of the trial :meth:`TimelineSampler.gather` sends every rank's samples to every rank
with ONE ``all_gather_object`` and combines them (``service.step_model.combine.combine_ranks``)
into the trial's ``TrialTimeline``; the loop's rank 0 records it.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Optional

from dataclasses import replace

import torch
import torch.distributed as dist

from hooks.local_sgd import PeriodicState
from hooks.registry import spec, validate
from hooks.state import HookState
from hooks.step_sampling import StepSampler
from service.step_model.combine import combine_ranks
from service.step_model.stamps import sampled_timelines
from service.step_model.transport import ProbeHosts
from service.step_model.timeline import SyncTiming
from service.step_model.trial import ComputePoint, TrialTimeline
from service.train.transport_probe import this_host
from service.train.paired_timing import SideModule
from service.workloads import to_device


def timeline_steps(count: int, first_step: int, last_step: int, warmup_steps: int,
                   skip: Callable[[int], bool]) -> tuple[int, ...]:
    """``count`` steps spread evenly over this attempt's steps after the warm-up and after its
    first two (DDP rebuilds its buckets after its first iteration in a process, a step later with
    static_graph), leaving out those ``skip`` names."""
    eligible = [s for s in range(max(first_step + 1, warmup_steps) + 1, last_step + 1) if not skip(s)]
    if count <= 0 or not eligible:
        return ()
    if count >= len(eligible):
        return tuple(eligible)
    if count == 1:
        return (eligible[len(eligible) // 2],)
    return tuple(eligible[round(i * (len(eligible) - 1) / (count - 1))] for i in range(count))


def window_steps(steps: tuple[int, ...]) -> frozenset[int]:
    """The sampled steps followed by a compute window: the first, the third, ... (3 of the default 5)."""
    return frozenset(steps[::2])


class TimelineSampler:
    """One rank's sampled step timelines and compute windows (the module doc). The loop calls
    ``forward(step)``, ``backward()``, ``optimizer()`` (the last two through ``forward_backward``)
    and ``step_done(step, micro_batches)`` every step, and ``gather`` once at the end."""

    def __init__(self, hook_state, side: SideModule, wl, precision, steps: tuple[int, ...], *, trial, cfg, ctx):
        """``trial`` (its link), ``cfg`` (the batch, the accumulation, the network's latency) and
        ``ctx`` (the rank's world size and device: a TrainingContext) say where the timeline is
        measured; the compute windows run on ``side``."""
        device, world_size = ctx.device, ctx.world_size
        # a state of torch's own hooks (bench/instrumentation.py's plain arm) stamps nothing
        self.steps = frozenset(steps) if isinstance(hook_state, HookState) else frozenset()
        self.window_steps = window_steps(tuple(sorted(self.steps)))
        self.state, self.side, self.wl, self.precision, self.device = hook_state, side, wl, precision, device
        self.sampler = StepSampler(hook_state, self.steps)
        wl_cfg = cfg.workload
        self.world_size, self.rank_batch = world_size, wl_cfg.global_batch_size // world_size
        self.accumulation = wl_cfg.grad_accumulation
        self.link_gbps = math.inf if trial.link_gbps is None else trial.link_gbps
        self.latency_s = cfg.network.latency_ms / 1000.0 if trial.link_gbps is not None else 0.0
        self.windows: list[tuple[ComputePoint, ...]] = []
        self.forward, self.backward = self.sampler.forward, self.sampler.backward
        self.optimizer = self.sampler.optimizer

    def step_done(self, step: int, micro_batches) -> None:
        """A sampled step's end (``StepSampler.done``), then, on a window step, its compute window:
        the rank's forward and backward of the step's last micro-batch, of its first half and (from
        4 samples) its first quarter, on the bare module or its copy (local, the trajectory kept;
        none where the micro-batch has one sample)."""
        if step not in self.steps:
            return
        self.sampler.done()
        indices = micro_batches[-1]
        if len(indices) < 2 or step not in self.window_steps:
            return
        sizes = [len(indices), len(indices) // 2] + ([len(indices) // 4] if len(indices) >= 4 else [])
        with self.side.window() as module:
            self.windows.append(tuple(self._timed(module, indices[:n]) for n in sizes))

    def _timed(self, module: torch.nn.Module, indices) -> ComputePoint:
        batch = to_device(self.wl.fetch(self.wl.train_set, indices), self.device, self.precision.input_dtype)
        module.zero_grad(set_to_none=True)
        t0 = _now(self.device)
        with self.precision.autocast():
            loss = self.wl.step_loss(module, batch)
        t1 = _now(self.device)
        loss.backward()
        t2 = _now(self.device)
        a = self.accumulation  # a step is ``a`` micro-batches of this size
        return ComputePoint(len(indices) * a, a * 1000.0 * (t1 - t0), a * 1000.0 * (t2 - t1))

    def gather(self, process_group) -> Optional[TrialTimeline]:
        """Every rank's samples to every rank (ONE all_gather_object; none when sampling is off,
        on every rank alike), combined; None when nothing was sampled."""
        if not self.steps:
            return None
        stats = self.state.stats()
        from_stats = spec(self.state.name).from_stats
        measured = from_stats(stats) if from_stats is not None and stats.get("calls") else {}
        mine = (sampled_timelines(self.sampler, self.world_size, self.rank_batch, self.link_gbps, self.latency_s,
                                  **measured), self.windows, this_host())
        per_rank = [mine]
        if dist.is_initialized() and dist.get_world_size(process_group) > 1:
            per_rank = [None] * dist.get_world_size(process_group)
            dist.all_gather_object(per_rank, mine, group=process_group)
        combined = combine_ranks([(t, w) for t, w, _ in per_rank], tuple(s.step for s in self.sampler.samples))
        # the hosts the compute was measured on: what the report names beside every projection of it
        return None if combined is None else replace(combined, hosts=ProbeHosts.of([h for _, _, h in per_rank]),
                                                     sync=sync_timing(self.state))


def sync_timing(state) -> Optional[SyncTiming]:
    """A periodic hook's exchange as the step model prices it (this rank's medians: the exchange is
    a collective, the same on every rank); None for any other hook, or before its first exchange."""
    if not isinstance(state, PeriodicState) or state.sync_medians() is None:
        return None
    compute_ms, comm_ms = state.sync_medians()
    hook, params = spec(state.name).sync(state.params)
    return SyncTiming(state.period, hook, sum(w.numel() for w in state.weights), compute_ms, comm_ms,
                      state.weights[0].element_size(), hook_params=validate(hook, **params))


def _now(device) -> float:
    if device.type == "cuda":  # this device's queue only: no cross-rank sync
        torch.cuda.synchronize(device)
    return time.perf_counter()
