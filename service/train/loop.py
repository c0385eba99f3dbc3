"""The per-worker training loop of one trial (plain PyTorch; Ray only in service/train/ray_entry.py).

``run_training`` is the loop, readable top to bottom: set up (seed, workload, DDP, the
trial's comm hook, optimizer), then every optimizer step: inject configured faults,
forward/backward over ``grad_accumulation`` micro-batches (all but the last under
``no_sync()``), the previous step's NaN verdict, optimizer step, this step's NaN check
(``service.train.nan``: one tiny asynchronous all-reduce, so all ranks agree; its verdict is
read after the next step's backward, or at once before an eval or a checkpoint, and a
non-finite step stops every rank before the following update is applied), gradient
fidelity every ``tracking.fidelity_every`` steps (when asked), paired timing's baseline window
every ``tracking.paired_timing_every`` steps (ahead of the step on every other one, after it on
the others: service/train/paired_timing.py), the step's DDP timeline on
``tracking.timeline_steps`` sampled steps (timestamps, then a local compute window; all ranks'
gathered once at the end: service/train/step_sampling.py), a periodic hook's exchange after the
optimizer step every ``period`` steps (local SGD, DiLoCo: hooks/local_sgd.py; evals then read the
parameters the ranks agree on), logging
(``service.tracking``, rank 0, batched), evaluation every ``eval_every`` steps,
checkpoints every ``checkpoint.every`` steps. Each verdict is read the same three lines
wherever the loop needs one, so every side effect shows where it happens (as nanoGPT's
train.py writes its loop)::

    check = monitor.resolve()   # the pending step's agreed NaN verdict and mean loss (None: none)
    reporter.log(check)         # rank 0: that step's metrics, with its agreed loss
    if stops(check, cfg):       # non-finite and stop.on_nan: every rank leaves the loop
        break

It needs an initialised process group and nothing else, so tests and users can run it
without Ray. What a rank is given (rank, device, logger, resume point, checkpoint and fault
callbacks, process group, and the hook builder, NaN monitor and step timer benches swap) is one
``TrainingContext`` (service/train/context.py).

Step numbering: step 1 is the first optimizer step, ``workload.steps`` the last; MLflow
metric steps, ``first_nan_step``, fault steps and checkpoint steps all use it.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from service.step_model.trial import TrialTimeline
from service.train.checkpoint import capture
from service.train.compiled import is_compiled
from service.train.context import TrainingContext
from service.train.faults import CRASH_EXIT_CODE
from service.train.metrics import trial_summary
from service.train.nan import NanMonitor, NanReport
from service.train.metrics import memory_per_rank_mb
from service.train.setup import TrialParts, set_up
from service.train.training_options import Precision, clip_gradients, lr_at, set_lr
from service.workloads import Workload, eval_share, evaluate_workload, metrics_from_sums, to_device


@dataclass
class TrialResult:
    """What one rank's ``run_training`` returns (``summary`` is what rank 0 logged)."""

    status: str  # "ok" | "nan"
    steps_done: int  # last optimizer step that ran
    summary: dict[str, float]
    nan_report: Optional[NanReport] = None  # where the trial first went non-finite (None: never)
    losses: list[float] = field(default_factory=list)  # mean loss across ranks, per step run
    timeline: Optional[TrialTimeline] = None  # the ranks' combined step timeline (None: not sampled)


# ----------------------------------------------------------------------------- the loop


def run_training(trial, cfg, ctx: TrainingContext) -> TrialResult:
    """Train one trial on this rank (its process group initialised; ``ctx``: the module doc). Each side
    effect that crosses ranks, touches the network or ends the process is a statement or a commented call."""
    wl_cfg, device, checkpoint_fn = cfg.workload, ctx.device, ctx.checkpoint_fn
    t = set_up_trial(trial, cfg, ctx)  # FSDP2 or DDP
    monitor, reporter, model, eval_metrics = t.monitor, t.reporter, t.model, None  # None: no eval yet
    for step in range(t.first_step, wl_cfg.steps + 1):
        batches = t.batches.micro_batches(step)  # this rank's samples of the step (a function of the step)
        baseline_window(t, step, batches, device, before=True)  # every other paired window: ahead of the step
        t.meter.begin()
        t.fidelity.begin(step)  # a sampled step: DDP runs the fidelity hook (+1 fp32 all-reduce per bucket)
        if t.faults.due(step):  # no configured fault fires after the trial went non-finite
            check = monitor.resolve()  # waits for the pending step's cross-rank NaN agreement
            reporter.log(check)  # rank 0: that step's metrics (the logger may write to MLflow now)
            if stops(check, cfg):
                break
        if t.faults.arm(step, model.module):  # on_fault records the fault in MLflow first
            os._exit(CRASH_EXIT_CODE)  # a crash fault: this rank's process ends here
        t.step_sampler.forward(step)  # a sampled step: perf_counter stamps at its phases and hook calls, no sync
        # the backward runs the comm hook: every bucket's collectives, across the ranks
        with t.pairing.own():  # timed: paired timing compares it with the baseline's
            loss = forward_backward(model, t.optimizer, t.wl, batches, device, t.precision, phases=t.step_sampler)
        # the previous step's NaN verdict, read only now: its all-reduce travelled beside this backward's collectives
        check = monitor.resolve()
        reporter.log(check)  # the previous step's metrics, with its agreed loss
        if stops(check, cfg):
            break  # this step's update is never applied: the weights stay the NaN step's
        clip_gradients(model.parameters(), wl_cfg.grad_clip_norm)  # the hook's averaged gradient
        if wl_cfg.lr_schedule != "constant" or wl_cfg.lr_warmup_steps:
            set_lr(t.optimizer, lr_at(step, wl_cfg.lr, wl_cfg.steps, wl_cfg.lr_schedule, wl_cfg.lr_warmup_steps))
        t.optimizer.step()
        monitor.submit(step, loss)  # local checks now (this rank's own weights), the agreement's all-reduce in flight
        if t.periodic is not None:  # local SGD / DiLoCo: every period steps the ranks' models meet (collectives)
            t.periodic.after_step(step)
        t.meter.end(step)
        t.accounting.step_ended(step)
        reporter.record(step, t.meter.last_ms, t.fidelity.end(step))
        baseline_window(t, step, batches, device, before=False)  # the other paired windows: after the step
        sample_window(t, step, batches)  # sampled: its end, then its compute at 2 batch sizes (local)
        evaluating = step % wl_cfg.eval_every == 0 or step == wl_cfg.steps
        checkpointing = bool(checkpoint_fn and cfg.checkpoint.every
                             and step % cfg.checkpoint.every == 0 and step < wl_cfg.steps)
        # Nothing leaves the loop (an eval, a checkpoint, the summary) before its step is agreed finite
        if evaluating or checkpointing:
            check = monitor.resolve()
            reporter.log(check)
            if stops(check, cfg):
                break
        if evaluating:  # every rank evaluates its share of the eval set; one all-reduce (an eval_fn: rank 0)
            eval_metrics = evaluate(t, step, ctx)  # the bare module's eval metrics, logged by rank 0
        if checkpointing:  # a barrier across the ranks (under Ray: ray.train.report with the checkpoint)
            with t.clock.time("checkpoint"):
                reporter.flush()  # to MLflow: nothing past a checkpoint may be missing from it after a crash
                checkpoint_fn(step, capture(step, model, t.optimizer, t.hook_state, t.batches, ctx.rank))
    return finish(t, cfg, ctx, eval_metrics)


def finish(t: TrialParts, cfg, ctx: TrainingContext, eval_metrics: Optional[dict[str, float]]) -> TrialResult:
    """The summary (rank 0 logs it and closes its logger); "final" eval = the final weights,
    so none after a NaN stop."""
    t.clock.loop_ended()
    if check_stopped_on_nan(t.monitor, cfg):
        eval_metrics = {}
    # every rank alike (None, not {}: an eval_fn's other ranks hold {}), as in the loop: the default evals
    # end in an all-reduce, and an fsdp trial's eval gathers its parameters first
    elif eval_metrics is None:
        with agreed(t):
            eval_metrics = run_eval(eval_module(t.model), t.wl, ctx, t.precision)
    report = t.monitor.report
    summary = trial_summary(t.meter, t.accounting, cfg.workload.global_batch_size,
                            t.reporter.last_loss, eval_metrics, report, ctx.start.restarts)
    summary["memory_per_rank_mb"] = memory_per_rank_mb(  # sharding's point; a periodic hook's anchor counts
        t.model.module, t.optimizer, t.periodic.held_tensors() if t.periodic is not None else ())
    summary.update(t.fidelity.summary())
    summary.update(t.pairing.summary(t.meter.times_ms))
    summary.update(t.load.summary(ctx.process_group, ctx.device))  # a collective: every rank gets here
    timeline = t.step_sampler.gather(ctx.process_group)  # with timeline_steps: ONE all_gather_object, every rank
    if timeline is not None:
        summary.update(timeline.summary(typical_step_ms(t, summary)))
    summary.update(t.clock.summary())  # where the trial's time went (train/phases.py)
    if t.periodic is not None:  # syncs, sync_ms, replica_drift
        summary.update(t.periodic.sync_summary())
    if t.compile_s is not None:  # a compiled trial's compilation, before its first step (train/compiled.py)
        summary["compile_s"] = t.compile_s
    status = "nan" if report else "ok"
    t.reporter.finish(summary, status, report, timeline)  # rank 0: summary, tags, timeline into MLflow, flushed
    return TrialResult(status, int(summary["steps_done"]), summary, report, t.reporter.losses, timeline)


# ----------------------------------------------------------------------------- pieces


def check_stopped_on_nan(monitor: NanMonitor, cfg) -> bool:
    return monitor.report is not None and cfg.stop.on_nan


def stops(check, cfg) -> bool:
    """Does this agreed step check (or None: nothing was pending) stop the trial?"""
    return check is not None and check.nonfinite and cfg.stop.on_nan


def baseline_window(t: TrialParts, step: int, batches, device, before: bool) -> None:
    """A paired-timing window of this order at this step (service/train/paired_timing.py): the baseline's
    forward/backward of the step's batches (a ddp trial's: allreduce on a DDP wrapper of its own; an fsdp
    trial's: FSDP's fp32 comms swapped in on its sharded model; its collectives, across the ranks), timed. Before: ahead of the trial's own forward/backward; after: once its step is done.
    The windows alternate, so the order effect (the arm that runs second finds caches warm) is measured."""
    if t.pairing.before(step) if before else t.pairing.after(step):
        with t.clock.time("paired"):
            t.pairing.window(step, lambda ddp: forward_backward(ddp, t.optimizer, t.wl, batches, device, t.precision))


def evaluate(t: TrialParts, step: int, ctx: TrainingContext) -> dict[str, float]:
    """The bare module's eval at ``step`` (``run_eval``: across the ranks), timed; rank 0 logs it."""
    with t.clock.time("eval"), agreed(t):
        metrics = run_eval(eval_module(t.model), t.wl, ctx, t.precision)
        t.reporter.eval(step, metrics)
    return metrics


def typical_step_ms(t: TrialParts, summary: dict) -> float:
    """The measured step the step model's own step is set beside: the median; a periodic hook's
    mean, whose exchange every period steps the model amortizes over them."""
    return summary["step_time_ms_mean" if t.periodic is not None else "step_time_ms_median"]


def set_up_trial(trial, cfg, ctx: TrainingContext) -> TrialParts:
    """The trial's parts under FSDP2 or DDP. FSDP2's set-up is imported here, not with this module:
    the sweep's processes that import the training code without training (its driver, the Tune
    trial that builds the trainer) then never import FSDP2 (~0.5 CPU-s: DTensor, sympy). A DDP
    rank imports it anyway, through DDP's own constructor (torch._dynamo)."""
    if trial.parallelism != "fsdp":
        return set_up(trial, cfg, ctx)
    from service.train.setup_fsdp import set_up_sharded

    return set_up_sharded(trial, cfg, ctx)


def agreed(t: TrialParts):
    """The module holding the parameters every rank agrees on for an eval: a periodic hook's
    anchor (the last exchange's), never one rank's drifting copy; any other trial's own."""
    return t.periodic.anchored() if t.periodic is not None else nullcontext()


def eval_module(model) -> torch.nn.Module:
    """The bare module an eval runs on: DDP's, or an fsdp trial's unsharded copy given the full
    parameters (a collective: every rank)."""
    return model.module if isinstance(model, DDP) else model.eval_module()


def sample_window(t: TrialParts, step: int, batches) -> None:
    """The step timeline's end of a sampled step and its local compute window (train/step_sampling.py)."""
    with t.clock.time("timeline"):
        t.step_sampler.step_done(step, batches)


def forward_backward(model: DDP, optimizer, wl: Workload, micro_batches, device,
                     precision: Optional[Precision] = None, phases=None) -> torch.Tensor:
    """One step's gradients; returns this rank's mean loss over its micro-batches (a tensor).

    All micro-batches but the last run under ``no_sync()`` (gradients accumulate locally);
    the last backward runs the comm hook, bucket by bucket, and waits for it. The optimizer
    step is the caller's (the loop reads the previous step's NaN verdict in between).
    Either workload form goes through ``wl.fetch`` and ``wl.step_loss``; the forward runs
    in ``precision``'s autocast, floating inputs in its dtype. ``phases`` (the step sampler,
    train/step_sampling.py): ``backward()`` just before the last backward (the one that runs the
    hook), ``optimizer()`` once it returned: timestamps on a sampled step, nothing otherwise.
    """
    precision = precision or Precision("fp32", device)
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=device)
    for i, indices in enumerate(micro_batches):
        batch = to_device(wl.fetch(wl.train_set, indices), device, precision.input_dtype)
        last = i == len(micro_batches) - 1
        with (nullcontext() if last else model.no_sync()):
            with precision.autocast():
                loss = wl.step_loss(model, batch) / len(micro_batches)
            if last and phases is not None:
                phases.backward()
            loss.backward()
        total += loss.detach()
    if phases is not None:
        phases.optimizer()
    return total


def run_eval(module: torch.nn.Module, wl: Workload, ctx: TrainingContext,
             precision: Optional[Precision] = None) -> dict[str, float]:
    """The workload's eval metrics of the bare module (no DDP collectives): eval_loss and
    eval_accuracy (loss_fn form) or eval_loss (batch_loss form), each rank evaluating its share
    of the eval set and one all-reduce of the sums on the trial's group (every rank gets them:
    rank 0 alone left the other ranks idle, W - 1 cores of the eval's time); a workload's
    eval_fn sees the whole set at once, on rank 0 only (the others get {})."""
    dtype = precision.input_dtype if precision else None
    # eager even in a compiled trial (train/compiled.py): an eval is no step, and its batch would compile
    # again; only then (set_stance imports dynamo: 1.6 s of an eager trial's first eval)
    eager = torch.compiler.set_stance("force_eager") if is_compiled(module) else nullcontext()
    with eager, (precision.autocast() if precision else nullcontext()):
        sums = eval_share(wl, module, ctx.rank, ctx.world_size, device=ctx.device, float_dtype=dtype)
        if sums is None:
            return evaluate_workload(wl, module, device=ctx.device, float_dtype=dtype) if ctx.rank == 0 else {}
    total = torch.tensor(sums, dtype=torch.float64, device=ctx.device)
    if ctx.world_size > 1:
        dist.all_reduce(total, group=ctx.process_group)  # float64: the sums add up exactly enough
    return metrics_from_sums(wl, total.tolist())
