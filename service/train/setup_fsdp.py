"""An fsdp trial's parts (``search.parallelism: fsdp``): the same ``TrialParts`` a ddp trial's
set_up makes, with FSDP2 and the hook's sharded form (service/train/fsdp.py) where DDP and its
comm hook stand. Paired timing's baseline is FSDP's own fp32 reduce-scatter and all-gather,
swapped in on the same sharded model for each window (paired_timing.ShardedBaseline); its step
timeline is its collectives in call order (the step model prices FSDP's step from them:
service/step_model/price.py). Not yet for fsdp (a ddp trial's, off here): sampled gradient
fidelity."""

from __future__ import annotations


from service.train import fsdp
from service.train.checkpoint import restore_sharded
from service.train.context import TrainingContext
from service.train.faults import FaultInjector
from service.train.fidelity import FidelitySampler
from service.train.metrics import HookAccounting, LoadMeter
from service.train.batches import GlobalBatches
from service.train.paired_timing import PairedTimer, ShardedBaseline, SideModule, UnshardedSide, is_baseline
from service.train.phases import PhaseClock
from service.train.reporter import Reporter
from service.train.setup import TrialParts, checked_workload, make_optimizer
from service.train.step_sampling import TimelineSampler, timeline_steps


def set_up_sharded(trial, cfg, ctx: TrainingContext) -> TrialParts:
    """Same weights and data on every rank (the preflight, on the unsharded model), then the
    model sharded per block and at the root with the trial's sharded hook. Cross-rank: the
    preflight's comparison and, with a checkpoint, loading its full state dict."""
    wl_cfg, rank, world_size, device = cfg.workload, ctx.rank, ctx.world_size, ctx.device
    wl, precision = checked_workload(trial, cfg, ctx)
    model = fsdp.shard(wl.model, wl_cfg.shard or wl.shard, ctx.process_group)
    hook_state = fsdp.attach_hook(model, trial.hook, dict(trial.hook_params), ctx.process_group)
    optimizer = make_optimizer(wl_cfg, model.parameters())
    batches = GlobalBatches(len(wl.train_set), wl_cfg.global_batch_size, trial.seed,
                            rank, world_size, wl_cfg.grad_accumulation)
    first_step = restore_sharded(ctx.start.checkpoint, model, optimizer, hook_state) + 1
    monitor = ctx.make_monitor(model, hook_state, rank=rank, world_size=world_size, device=device,
                               hook_name=trial.hook)
    side = SideModule(wl.model, copy_module=False)  # no window runs on it: pairing has its arm, timelines theirs
    # the baseline timed beside the trial on its own sharded model, FSDP's fp32 comms swapped in per window
    pairing = PairedTimer(side, every=0 if is_baseline(trial) else cfg.tracking.paired_timing_every,
                          warmup_steps=wl_cfg.warmup_steps, device=device,
                          arm=lambda: ShardedBaseline(model, ctx.process_group))
    # FSDP's step as its collectives in call order (train/step_sampling.py), never where a paired window
    # runs; its compute windows on the unsharded copy
    steps = timeline_steps(cfg.tracking.timeline_steps, first_step, wl_cfg.steps, wl_cfg.warmup_steps,
                           skip=pairing.due)
    return TrialParts(wl, precision, model, hook_state, FidelitySampler(hook_state, None, 0), optimizer, batches,
                      first_step, monitor, FaultInjector(cfg.faults, rank, ctx.start.fired_faults, ctx.on_fault),
                      ctx.make_meter(wl_cfg.warmup_steps, first_step),
                      HookAccounting(hook_state, wl_cfg.warmup_steps, first_step),
                      pairing,
                      TimelineSampler(hook_state, UnshardedSide(model), wl, precision, steps,
                                      trial=trial, cfg=cfg, ctx=ctx),
                      LoadMeter(), Reporter(ctx.logger, ctx.progress, rank), PhaseClock(ctx.start.trial_started_at))
