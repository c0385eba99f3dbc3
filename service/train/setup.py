"""What a trial's loop runs with, built the same on every rank: the workload (checked), DDP with
the trial's comm hook, optimizer, batches, the restored checkpoint, NaN checks, timers, reporter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from hooks.local_sgd import PeriodicState
from service import hook_facts
from service.train import preflight
from service.train.nan import NanMonitor
from service.train.batches import GlobalBatches
from service.train.checkpoint import restore
from service.train.compiled import compile_trial
from service.train.context import TrainingContext
from service.train.ddp import ddp_arguments, say_find_unused_is_on
from service.train.faults import FaultInjector
from service.train.fidelity import FidelitySampler
from service.train.metrics import HookAccounting, LoadMeter, StepMeter
from service.train.paired_timing import PairedTimer, SideModule, is_baseline
from service.train.phases import PhaseClock
from service.train.reporter import Reporter
from service.train.step_sampling import TimelineSampler, timeline_steps
from service.train.training_options import Precision
from service.workloads import Workload, build_workload


@dataclass
class TrialParts:
    """The loop's parts (``set_up``); the loop calls each where its side effect happens."""

    wl: Workload
    precision: Precision
    model: DDP
    hook_state: Any
    fidelity: FidelitySampler
    optimizer: torch.optim.Optimizer
    batches: GlobalBatches
    first_step: int
    monitor: NanMonitor
    faults: FaultInjector
    meter: StepMeter
    accounting: HookAccounting
    pairing: PairedTimer
    step_sampler: TimelineSampler
    load: LoadMeter
    reporter: Reporter
    clock: PhaseClock  # where the trial's wall time goes; started as the loop starts
    compile_s: Optional[float] = None  # a compiled trial's compilation (train/compiled.py); None: eager
    # a hook that exchanges every period steps after the optimizer step (hooks/local_sgd.py): its
    # state, whose after_step(step) the loop calls and whose anchor evals read; None for every other
    periodic: Optional[PeriodicState] = None


def set_up(trial, cfg, ctx: TrainingContext) -> TrialParts:
    """Same weights and data on every rank, DDP with the trial's hook. Cross-rank: the
    preflight's weights-and-data comparison, DDP's construction (twice with paired timing) and,
    with a checkpoint, restore's bucket priming."""
    wl_cfg, rank, world_size, device = cfg.workload, ctx.rank, ctx.world_size, ctx.device
    process_group = ctx.process_group
    wl, precision = checked_workload(trial, cfg, ctx)
    unused = preflight.unused_parameters(wl_cfg.name, wl, wl.model, device, precision)
    find_unused = preflight.find_unused_setting(wl_cfg.name, unused, wl_cfg.find_unused_parameters)
    if rank == 0 and unused and wl_cfg.find_unused_parameters == "auto":
        say_find_unused_is_on(wl_cfg.name, unused, ctx.logger)
    ddp_kwargs = ddp_arguments(trial, find_unused, wl_cfg.broadcast_buffers)
    model = DDP(wl.model, device_ids=[device.index] if device.type == "cuda" else None,
                process_group=process_group, **ddp_kwargs)
    hook_state, hook = ctx.build_hook(trial.hook, process_group=process_group, **dict(trial.hook_params))
    periodic = bound_periodic(trial, hook_state, model)
    # a local step's gradient is no estimate of the mean, and its exchange is no DDP call: no
    # fidelity sample, no paired window (its time to target is its own steps', exchanges included)
    fidelity = FidelitySampler(hook_state, hook, 0 if periodic else cfg.tracking.fidelity_every)
    model.register_comm_hook(hook_state, fidelity.hook)
    optimizer = make_optimizer(wl_cfg, model.parameters())
    batches = GlobalBatches(len(wl.train_set), wl_cfg.global_batch_size, trial.seed,
                            rank, world_size, wl_cfg.grad_accumulation)
    first_step = restore(ctx.start.checkpoint, model, optimizer, hook_state, wl, device, precision) + 1
    monitor = ctx.make_monitor(model, hook_state, rank=rank, world_size=world_size, device=device,
                           hook_name=trial.hook)
    faults = FaultInjector(cfg.faults, rank, ctx.start.fired_faults, ctx.on_fault)
    meter = ctx.make_meter(wl_cfg.warmup_steps, first_step)
    accounting = HookAccounting(hook_state, wl_cfg.warmup_steps, first_step)
    # the baseline hook timed beside this trial's own: same ranks, model, batches (paired_timing.py);
    # its DDP wrapper broadcasts rank 0's parameters at construction (a collective). With
    # find_unused_parameters its windows and the timeline's run on a copy of the module (SideModule:
    # one more set of parameters in memory, so only then), never through the trial's reducer
    pairing_every = 0 if is_baseline(trial) or periodic else cfg.tracking.paired_timing_every
    side = SideModule(wl.model, copy_module=find_unused and bool(pairing_every or cfg.tracking.timeline_steps))
    pairing = PairedTimer(side, every=pairing_every, warmup_steps=wl_cfg.warmup_steps, device=device,
                          process_group=process_group, ddp_kwargs=ddp_kwargs, skip=fidelity.due)
    # DDP's step as a timeline on a few steps (train/step_sampling.py): not where another hook or collective
    # runs, and none when compiled (its compute windows time the bare module, eager: report/projected.py's
    # COMPILED_NOTE)
    steps = timeline_steps(0 if trial.compile else cfg.tracking.timeline_steps, first_step, wl_cfg.steps,
                           wl_cfg.warmup_steps, skip=lambda s: fidelity.due(s) or pairing.due(s) or local_step_not(periodic, s))
    step_sampler = TimelineSampler(hook_state, side, wl, precision, steps, trial=trial, cfg=cfg, ctx=ctx)
    parts = TrialParts(wl, precision, model, hook_state, fidelity, optimizer, batches, first_step, monitor,
                       faults, meter, accounting, pairing, step_sampler, LoadMeter(),
                       Reporter(ctx.logger, ctx.progress, rank), PhaseClock(ctx.start.trial_started_at),
                       periodic=periodic)
    if trial.compile:  # its own phase, before the first step: no step, window or time to target pays it
        with parts.clock.time("compile"):  # every rank: a DDP wrapper's construction is a collective
            parts.compile_s = compile_trial([wl.model] + ([side.module] if side.is_copy else []),
                                            {**ddp_kwargs, "process_group": process_group}, wl,
                                            batches.micro_batches(first_step)[0], precision, wl_cfg.compile_mode)
    return parts


def checked_workload(trial, cfg, ctx: TrainingContext) -> tuple[Workload, Precision]:
    """The trial's workload, seeded, and its precision, after the start-of-trial checks
    (service.train.preflight): one line naming the workload, on every rank alike (the cross-rank
    one first: the others are then local and deterministic). DDP's and FSDP's set-ups both start here."""
    wl_cfg = cfg.workload
    torch.manual_seed(trial.seed)
    wl = build_workload(wl_cfg.name, trial.seed)
    precision = Precision(wl_cfg.precision, ctx.device)
    preflight.check_same_on_every_rank(wl_cfg.name, wl, rank=ctx.rank, world_size=ctx.world_size, device=ctx.device)
    preflight.check_items(wl_cfg.name, wl)
    preflight.check_loss(wl_cfg.name, wl, precision.cast(wl.model), ctx.device, precision)
    return wl, precision


def bound_periodic(trial, hook_state, model: DDP) -> Optional[PeriodicState]:
    """A periodic hook's state bound to the model (after DDP's construction: every rank's anchor
    is rank 0's weights); None for every other hook."""
    if not hook_facts.periodic(trial.hook):
        return None
    hook_state.bind(model.module)
    return hook_state


def local_step_not(periodic: Optional[PeriodicState], step: int) -> bool:
    """Is ``step`` other than a steady local step of a periodic hook (an exchange, or before
    start_iter)? The timeline samples local steps; the exchange is timed on its own."""
    return periodic is not None and (periodic.syncs_at(step) or step <= periodic.start_iter)


def make_optimizer(wl_cfg, params) -> torch.optim.Optimizer:
    if wl_cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=wl_cfg.lr)
    return torch.optim.SGD(params, lr=wl_cfg.lr)
