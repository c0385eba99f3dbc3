"""The per-worker training loop of one trial (plain PyTorch; Ray only in service/train/ray_entry.py).

``run_training`` is the loop, readable top to bottom: set up (seed, workload, DDP, the
trial's comm hook, optimizer), then every optimizer step: inject configured faults,
forward/backward over ``grad_accumulation`` micro-batches (all but the last under
``no_sync()``), the previous step's NaN verdict, optimizer step, this step's NaN check
(``service.nan``: one tiny asynchronous all-reduce, so all ranks agree; its verdict is
read after the next step's backward, or at once before an eval or a checkpoint, and a
non-finite step stops every rank before the following update is applied), gradient
fidelity every ``tracking.fidelity_every`` steps (when asked), logging
(``service.tracking``, rank 0, batched), evaluation every ``eval_every`` steps,
checkpoints every ``checkpoint.every`` steps. Each verdict is read the same three lines
wherever the loop needs one, so every side effect shows where it happens (as nanoGPT's
train.py writes its loop)::

    check = monitor.resolve()   # the pending step's agreed NaN verdict and mean loss (None: none)
    reporter.log(check)         # rank 0: that step's metrics, with its agreed loss
    if stops(check, cfg):       # non-finite and stop.on_nan: every rank leaves the loop
        break

It needs an initialised process group and nothing else, so tests and users can run it
without Ray; its hook builder, NaN monitor and step timer are parameters (benches swap them).

Step numbering: step 1 is the first optimizer step, ``workload.steps`` the last; MLflow
metric steps, ``first_nan_step``, fault steps and checkpoint steps all use it.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import hooks
from service import preflight
from service.nan import NanMonitor
from service.train.batches import GlobalBatches
from service.train.checkpoint import capture, restore
from service.train.ddp import ddp_arguments, say_find_unused_is_on
from service.train.faults import FaultInjector
from service.train.fidelity import FidelitySampler
from service.train.metrics import HookAccounting, LoadMeter, StepMeter, trial_summary
from service.train.paired_timing import PairedTimer, is_baseline
from service.train.reporter import Reporter
from service.training_options import Precision, clip_gradients, lr_at, set_lr
from service.workloads import Workload, build_workload, evaluate_workload, to_device


@dataclass
class TrialResult:
    """What one rank's ``run_training`` returns (``summary`` is what rank 0 logged)."""

    status: str  # "ok" | "nan"
    steps_done: int  # last optimizer step that ran
    summary: dict[str, float]
    nan_report: Optional[dict[str, Any]] = None
    losses: list[float] = field(default_factory=list)  # mean loss across ranks, per step run


@dataclass
class Start:
    """Where a (re)started trial begins: a checkpoint to resume from, how many times the
    trial has been restarted, and which configured faults already fired (by index)."""

    checkpoint: Optional[dict[str, Any]] = None  # {"trainer": ..., "hook_state": ...}
    restarts: int = 0
    fired_faults: frozenset[int] = frozenset()


# ----------------------------------------------------------------------------- the loop


def run_training(trial, cfg, *, rank: int, world_size: int, device, logger=None, progress=None,
                 start: Optional[Start] = None,
                 checkpoint_fn: Optional[Callable[[int, dict], None]] = None,
                 on_fault: Optional[Callable[[int, Any], None]] = None,
                 process_group=None, build_hook: Callable = hooks.build,
                 make_monitor: Callable[..., NanMonitor] = NanMonitor,
                 make_meter: Optional[Callable[[int, int], "StepMeter"]] = None) -> TrialResult:
    """Train one trial on this rank (the process group is already initialised).

    ``logger`` (rank 0): a ``tracking.MetricLogger`` or None; ``progress(step, loss)``:
    called on rank 0 at most every ~2 s; ``start``: resume point (``Start``);
    ``checkpoint_fn(step, state)``: called on every rank every ``checkpoint.every`` steps
    with this rank's training state; ``on_fault(index, fault)``: called just before a
    configured fault fires (a crash fault never returns); ``process_group``: the group DDP and
    the hook communicate on (None: the default group; an emulated network's, service/netem.py).
    ``build_hook(name, process_group=..., **params) -> (state, hook)``, ``make_monitor`` (takes
    NanMonitor's arguments) and ``make_meter(warmup_steps, first_step)``: the trial's hook, its
    NaN checks and its step timer (default: hooks.build, NanMonitor, StepMeter; benches and
    tests pass their own instead of replacing module attributes).
    """
    wl_cfg, start = cfg.workload, start or Start()
    device = torch.device(device)

    # --- setup: same weights and data on every rank, DDP with the trial's hook
    torch.manual_seed(trial.seed)
    wl = build_workload(wl_cfg.name, trial.seed)
    precision = Precision(wl_cfg.precision, device)
    # the start-of-trial checks (service.preflight): one line naming the workload, on every
    # rank alike (the cross-rank one first: the others are then local and deterministic)
    preflight.check_same_on_every_rank(wl_cfg.name, wl, rank=rank, world_size=world_size, device=device)
    preflight.check_items(wl_cfg.name, wl)
    preflight.check_loss(wl_cfg.name, wl, precision.cast(wl.model), device, precision)
    unused = preflight.unused_parameters(wl_cfg.name, wl, wl.model, device, precision)
    find_unused = preflight.find_unused_setting(wl_cfg.name, unused, wl_cfg.find_unused_parameters)
    if rank == 0 and unused and wl_cfg.find_unused_parameters == "auto":
        say_find_unused_is_on(wl_cfg.name, unused, logger)
    ddp_kwargs = ddp_arguments(trial, find_unused, wl_cfg.broadcast_buffers)
    model = DDP(wl.model, device_ids=[device.index] if device.type == "cuda" else None,
                process_group=process_group, **ddp_kwargs)
    hook_state, hook = build_hook(trial.hook, process_group=process_group, **dict(trial.hook_params))
    fidelity = FidelitySampler(hook_state, hook, cfg.tracking.fidelity_every)
    model.register_comm_hook(hook_state, fidelity.hook)
    optimizer = make_optimizer(wl_cfg, model.parameters())
    batches = GlobalBatches(len(wl.train_set), wl_cfg.global_batch_size, trial.seed,
                            rank, world_size, wl_cfg.grad_accumulation)
    first_step = restore(start.checkpoint, model, optimizer, hook_state, wl, device, precision) + 1
    monitor = make_monitor(model, hook_state, rank=rank, world_size=world_size, device=device,
                           hook_name=trial.hook)
    faults = FaultInjector(cfg.faults, rank, start.fired_faults, on_fault)
    meter = (make_meter or StepMeter)(wl_cfg.warmup_steps, first_step)
    accounting = HookAccounting(hook_state, wl_cfg.warmup_steps, first_step)
    # the baseline hook timed beside this trial's own: same ranks, model, batches (paired_timing.py)
    pairing = PairedTimer(wl.model, every=0 if is_baseline(trial) else cfg.tracking.paired_timing_every,
                          warmup_steps=wl_cfg.warmup_steps, device=device, process_group=process_group,
                          ddp_kwargs=ddp_kwargs)
    load = LoadMeter()
    reporter = Reporter(logger, progress, rank)

    # --- steps
    step, eval_metrics = first_step - 1, {}
    for step in range(first_step, wl_cfg.steps + 1):
        meter.begin()
        fidelity.begin(step)
        # A configured fault never fires after the trial went non-finite (same steps on every rank)
        if faults.due(step):
            check = monitor.resolve()
            reporter.log(check)
            if stops(check, cfg):
                break
        faults.before_step(step, model.module)
        with pairing.own():
            loss = forward_backward(model, optimizer, wl, batches.micro_batches(step), device, precision)
        # The previous step's NaN verdict, read only now: its all-reduce travelled beside
        # this backward's gradient collectives instead of adding a rendezvous of its own.
        check = monitor.resolve()
        reporter.log(check)  # the previous step's metrics, with its agreed loss
        if stops(check, cfg):
            break  # this step's update is never applied: the weights stay the NaN step's
        clip_gradients(model.parameters(), wl_cfg.grad_clip_norm)  # the hook's averaged gradient
        if wl_cfg.lr_schedule != "constant" or wl_cfg.lr_warmup_steps:
            set_lr(optimizer, lr_at(step, wl_cfg.lr, wl_cfg.steps, wl_cfg.lr_schedule, wl_cfg.lr_warmup_steps))
        optimizer.step()
        monitor.submit(step, loss)  # local checks now, the cross-rank agreement in flight
        meter.end(step)
        accounting.step_ended(step)
        reporter.record(step, meter.last_ms, fidelity.end(step))
        if pairing.due(step):  # the baseline's forward/backward of this step's batches, outside its time
            pairing.window(step, lambda ddp: forward_backward(ddp, optimizer, wl, batches.micro_batches(step),
                                                              device, precision))
        evaluating = step % wl_cfg.eval_every == 0 or step == wl_cfg.steps
        checkpointing = bool(checkpoint_fn and cfg.checkpoint.every
                             and step % cfg.checkpoint.every == 0 and step < wl_cfg.steps)
        # Nothing leaves the loop (an eval, a checkpoint, the summary) before its step is
        # agreed finite: there the verdict is waited for at once.
        if evaluating or checkpointing:
            check = monitor.resolve()
            reporter.log(check)
            if stops(check, cfg):
                break
        if rank == 0 and evaluating:
            eval_metrics = run_eval(model.module, wl, device, precision)
            reporter.eval(step, eval_metrics)
        if checkpointing:
            reporter.flush()  # nothing past a checkpoint may be missing from MLflow after a crash
            checkpoint_fn(step, capture(step, model, optimizer, hook_state, batches, rank))

    # --- summary (rank 0 logs it); "final" eval = the final weights, so none after a NaN stop
    if check_stopped_on_nan(monitor, cfg):
        eval_metrics = {}
    elif rank == 0 and not eval_metrics:
        eval_metrics = run_eval(model.module, wl, device, precision)
    summary = trial_summary(meter, accounting, trial, wl_cfg.global_batch_size, reporter.last_loss,
                            eval_metrics, monitor.report, start.restarts)
    summary.update(fidelity.summary())
    summary.update(pairing.summary(meter.times_ms))
    summary.update(load.summary(process_group, device))  # a collective: every rank gets here
    status = "nan" if monitor.report else "ok"
    reporter.finish(summary, status, monitor.report)
    return TrialResult(status, int(summary["steps_done"]), summary,
                       monitor.report.to_dict() if monitor.report else None, reporter.losses)


# ----------------------------------------------------------------------------- pieces


def check_stopped_on_nan(monitor: NanMonitor, cfg) -> bool:
    return monitor.report is not None and cfg.stop.on_nan


def stops(check, cfg) -> bool:
    """Does this agreed step check (or None: nothing was pending) stop the trial?"""
    return check is not None and check.nonfinite and cfg.stop.on_nan


def make_optimizer(wl_cfg, params) -> torch.optim.Optimizer:
    if wl_cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=wl_cfg.lr)
    return torch.optim.SGD(params, lr=wl_cfg.lr)


def forward_backward(model: DDP, optimizer, wl: Workload, micro_batches, device,
                     precision: Optional[Precision] = None) -> torch.Tensor:
    """One step's gradients; returns this rank's mean loss over its micro-batches (a tensor).

    All micro-batches but the last run under ``no_sync()`` (gradients accumulate locally);
    the last backward runs the comm hook, bucket by bucket, and waits for it. The optimizer
    step is the caller's (the loop reads the previous step's NaN verdict in between).
    Either workload form goes through ``wl.fetch`` and ``wl.step_loss``; the forward runs
    in ``precision``'s autocast, floating inputs in its dtype.
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
            loss.backward()
        total += loss.detach()
    return total


def run_eval(module: torch.nn.Module, wl: Workload, device,
             precision: Optional[Precision] = None) -> dict[str, float]:
    """The workload's eval metrics of the bare module (no DDP collectives): eval_loss and
    eval_accuracy (loss_fn form), eval_loss (batch_loss form), or its eval_fn's metrics."""
    dtype = precision.input_dtype if precision else None
    with (precision.autocast() if precision else nullcontext()):
        return evaluate_workload(wl, module, device=device, float_dtype=dtype)
