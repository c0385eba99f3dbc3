"""A trial's measured figures: step times (StepMeter), the machine's load (LoadMeter), the hook's
counters per step (HookAccounting), and the summary metrics built from them (trial_summary)."""

from __future__ import annotations

import os
import statistics
import time

import torch

from hooks.state import HookState
from hooks.wire import SHARDED_KINDS, wire_bytes
from service.train.dtensors import local as _local


class StepMeter:
    """Step times on rank 0's clock: which steps are measured (after the warm-up) and their rate."""

    def __init__(self, warmup_steps: int, first_step: int):
        self.warmup, self.first_step = warmup_steps, first_step
        self.times_ms: dict[int, float] = {}
        self.last_ms = 0.0
        self._t0 = 0.0

    def begin(self) -> None:
        self._t0 = time.perf_counter()

    def end(self, step: int) -> None:
        self.last_ms = (time.perf_counter() - self._t0) * 1000.0
        self.times_ms[step] = self.last_ms

    def measured(self) -> tuple[list[float], bool]:
        """(the step times the figures are over, whether they are the post-warm-up steps):
        when every step was warm-up, all of them, rather than reporting nothing."""
        measured = [ms for s, ms in self.times_ms.items() if s > self.warmup]
        if not measured:
            return list(self.times_ms.values()), False
        return measured, True

    def summary(self, global_batch: int) -> dict[str, float]:
        """samples_per_s: global samples per second of step time after the warm-up steps
        (excluded; their count is ``warmup_steps_excluded``), the median step time and its
        spread, and the last step that ran. All over the steps of this attempt."""
        measured, after_warmup = self.measured()
        return {
            "samples_per_s": global_batch * len(measured) / (sum(measured) / 1000.0) if measured else 0.0,
            "step_time_ms_median": statistics.median(measured) if measured else 0.0,
            # a periodic hook's step: its exchange every period steps, amortized (the median is a local step)
            "step_time_ms_mean": statistics.fmean(measured) if measured else 0.0,
            # the spread the report compares speeds against (within it, "same speed here")
            "step_time_ms_iqr": _iqr(measured),
            "warmup_steps_excluded": len(self.times_ms) - len(measured) if after_warmup else 0,
            "steps_done": max(self.times_ms, default=self.first_step - 1),
        }


class LoadMeter:
    """How busy the machine was while the trial ran: the 1-minute load average (mean of its
    start and end) and the CPU seconds the trial's rank processes got per wall second, summed
    over the ranks (a trial of W ranks on an idle machine: about W x threads)."""

    def __init__(self):
        self.load_start = os.getloadavg()[0]
        self.wall_start, self.cpu_start = time.perf_counter(), time.process_time()

    def summary(self, process_group, device) -> dict[str, float]:
        import torch.distributed as dist

        wall = time.perf_counter() - self.wall_start
        cpu = torch.tensor([time.process_time() - self.cpu_start], dtype=torch.float64, device=device)
        if dist.is_initialized() and dist.get_world_size(process_group) > 1:
            dist.all_reduce(cpu, group=process_group)
        return {"load_avg_1m": (self.load_start + os.getloadavg()[0]) / 2,
                "cpu_share": float(cpu.item()) / wall if wall > 0 else 0.0}


class HookAccounting:
    """The hook's byte/time counters (``stats()``) at this attempt's start and at the end of the
    warm-up steps: the summary's per-step communication figures."""

    def __init__(self, hook_state, warmup_steps: int, first_step: int):
        self.hook_state, self.warmup = hook_state, warmup_steps
        self.start = _stats(hook_state)
        # the counters at the start of the measured (post-warm-up) steps
        self.measured_start = self.start if first_step > warmup_steps else None

    def step_ended(self, step: int) -> None:
        if step == self.warmup:
            self.measured_start = _stats(self.hook_state)

    def summary(self, meter: StepMeter) -> dict[str, float]:
        """comm_bytes_per_step: this rank's wire bytes per step; compression_ratio: raw bucket
        bytes / bytes handed to collectives; hook_time_ms: hook entry to future completion,
        summed over a step's buckets, per step (all over the steps of this attempt); and the
        measured steps' accounting per step (:func:`per_measured_step`)."""
        steps_run = len(meter.times_ms)
        now = _stats(self.hook_state)
        delta = {k: now.get(k, 0) - self.start.get(k, 0) for k in now}
        out = {
            "comm_bytes_per_step": delta.get("wire_bytes", 0) / max(steps_run, 1),
            "compression_ratio": (delta.get("raw_bytes", 0) / delta["payload_bytes"]
                                  if delta.get("payload_bytes") else 1.0),
            "hook_time_ms": delta.get("seconds", 0.0) * 1000.0 / max(steps_run, 1),
        }
        for kind in SHARDED_KINDS:  # an fsdp trial's two collectives: reduce_scatter_bytes_per_step, ...
            if delta.get(f"{kind}_calls"):
                sent = wire_bytes(kind, delta[f"{kind}_bytes"], self.hook_state.world_size())
                out[f"{kind}_bytes_per_step"] = sent / max(steps_run, 1)
        measured, after_warmup = meter.measured()
        if after_warmup:  # warm-up steps standing in for measured ones are no clean basis
            out.update(per_measured_step(len(measured), self.measured_start, now))
        return out


def memory_per_rank_mb(module: torch.nn.Module, optimizer, held=()) -> float:
    """MiB of parameters, gradients and optimizer state this rank holds, counted from the
    tensors (an fsdp trial's: its shards), plus ``held`` (a periodic hook's anchor and outer
    optimizer state)."""
    tensors = [t for p in module.parameters() for t in (p, p.grad) if t is not None] + list(held)
    tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return sum(_local(t).numel() * t.element_size() for t in tensors) / 2**20




_PER_STEP = {"calls": "hook_calls_per_step", "raw_bytes": "raw_bytes_per_step",
             "payload_bytes": "payload_bytes_per_step", "allreduce_calls": "allreduce_calls_per_step"}


def per_measured_step(steps: int, start: dict | None, now: dict) -> dict[str, float]:
    """The hook's calls (DDP buckets), raw and payload bytes and allreduce calls per measured step
    (``start``/``now``: its ``stats()`` when the measured steps began and now); nothing when every
    step was warm-up or the hook keeps no accounting."""
    if start is None or not steps or not now.get("calls"):
        return {}
    return {name: (now.get(k, 0) - start.get(k, 0)) / steps for k, name in _PER_STEP.items()}


def trial_summary(meter: StepMeter, accounting: HookAccounting, global_batch: int,
                  final_loss: float, eval_metrics: dict, nan_report, restarts: int) -> dict[str, float]:
    """The trial's summary metrics: its speed and step times, the hook's bytes, final loss and evals, NaN, restarts."""
    out = {**meter.summary(global_batch), **accounting.summary(meter),
           "final_loss": final_loss, "nan_detected": 1 if nan_report else 0, "restarts": restarts}
    for metric, value in eval_metrics.items():  # eval_loss (+ eval_accuracy, or eval_fn's)
        out[f"final_{metric}"] = value
    if nan_report:
        out["first_nan_step"] = nan_report.first_nan_step
        out["nan_rank"] = nan_report.nan_rank
        if nan_report.bucket_index is not None:
            out["nan_bucket_index"] = nan_report.bucket_index
    return out


def _iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


def _stats(hook_state) -> dict[str, float]:
    # a HookState counts; a state of torch's own hooks (bench/instrumentation.py's plain arm) does not
    return hook_state.stats() if isinstance(hook_state, HookState) else {}
