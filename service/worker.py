"""The per-worker training loop of one trial (plain PyTorch; Ray only in the thin wrapper).

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

``train_loop_per_worker`` is the function given to Ray Train's ``TorchTrainer``: it reads
rank and world size from Ray, resumes from Ray's checkpoint after a crash, opens the
trial's MLflow run for rank 0, and reports to Ray at checkpoints and at the end only
(``ray.train.report`` is a barrier across the ranks, never per step: its cost is in
docs/performance.md, section 1).

Step numbering: step 1 is the first optimizer step, ``workload.steps`` the last; MLflow
metric steps, ``first_nan_step``, fault steps and checkpoint steps all use it.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import hooks
from hooks.state import HookState
from service import preflight
from service.nan import NanMonitor
from service.paired_timing import PairedTimer
from service import step_projection
from service.training_options import Precision, clip_gradients, lr_at, set_lr
from service.workloads import Workload, build_workload, evaluate_workload, to_device

STEP_METRICS = ("loss", "step_time_ms", "eval_loss", "eval_accuracy", "grad_rel_error", "grad_cosine")
PROGRESS_EVERY_S = 2.0
SHARED_STATE_FILE = "trainer.pt"  # model, optimizer, step, data position (rank 0 writes it)
HOOK_STATE_FILE = "hook_state_rank{rank}.pt"  # each rank's hook state (error feedback differs)


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
    model = DDP(wl.model, device_ids=[device.index] if device.type == "cuda" else None,
                process_group=process_group)
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
    # the baseline hook timed beside this trial's own: same ranks, model, batches (service/paired_timing.py)
    pairing = PairedTimer(wl.model, every=0 if is_baseline(trial) else cfg.tracking.paired_timing_every,
                          warmup_steps=wl_cfg.warmup_steps, device=device, process_group=process_group)
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


class GlobalBatches:
    """Which samples each rank trains on at each step, as a pure function of the step.

    The global batch (``global_batch_size`` samples) is the same for every world size: a
    seeded permutation per epoch, cut into global batches (the tail is dropped); rank r
    takes the r-th 1/W of it, split into ``grad_accumulation`` equal micro-batches. Because
    it depends only on (seed, step), resuming at step s needs no sampler state.
    """

    def __init__(self, n_samples: int, global_batch: int, seed: int, rank: int, world_size: int,
                 grad_accumulation: int):
        if global_batch > n_samples:
            raise ValueError(f"global_batch_size {global_batch} is larger than the "
                             f"{n_samples} training samples")
        if global_batch % (world_size * grad_accumulation):
            raise ValueError(f"global_batch_size {global_batch} does not split into world_size "
                             f"{world_size} x grad_accumulation {grad_accumulation} micro-batches")
        self.n, self.global_batch, self.seed = n_samples, global_batch, seed
        self.rank, self.world_size, self.accumulation = rank, world_size, grad_accumulation
        self.per_epoch = n_samples // global_batch
        self._epoch, self._order = -1, None

    def position(self, step: int) -> dict[str, int]:
        """(epoch, batch within epoch) of ``step``: the data position a checkpoint records."""
        return {"epoch": (step - 1) // self.per_epoch, "batch": (step - 1) % self.per_epoch}

    def micro_batches(self, step: int) -> list[torch.Tensor]:
        pos = self.position(step)
        if pos["epoch"] != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 100_003 + pos["epoch"])
            self._epoch, self._order = pos["epoch"], torch.randperm(self.n, generator=g)
        start = pos["batch"] * self.global_batch
        per_rank = self.global_batch // self.world_size
        mine = self._order[start + self.rank * per_rank: start + (self.rank + 1) * per_rank]
        return list(mine.chunk(self.accumulation))


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
            # the spread the report compares speeds against (issue 16: "same speed here")
            "step_time_ms_iqr": _iqr(measured),
            "warmup_steps_excluded": len(self.times_ms) - len(measured) if after_warmup else 0,
            "steps_done": max(self.times_ms, default=self.first_step - 1),
        }


def is_baseline(trial) -> bool:
    """The baseline trial itself: nothing to time it against."""
    return trial.hook == hooks.BASELINE and not trial.non_default_params()


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
    warm-up steps: the summary's per-step communication figures and the projection's basis."""

    def __init__(self, hook_state, warmup_steps: int, first_step: int):
        self.hook_state, self.warmup = hook_state, warmup_steps
        self.start = _stats(hook_state)
        # the counters at the start of the measured (post-warm-up) steps
        self.measured_start = self.start if first_step > warmup_steps else None

    def step_ended(self, step: int) -> None:
        if step == self.warmup:
            self.measured_start = _stats(self.hook_state)

    def summary(self, trial, meter: StepMeter) -> dict[str, float]:
        """comm_bytes_per_step: this rank's wire bytes per step; compression_ratio: raw bucket
        bytes / bytes handed to collectives; hook_time_ms: hook entry to future completion,
        summed over a step's buckets, per step (all over the steps of this attempt); and the
        measured steps' accounting projected onto faster links (``service.step_projection``)."""
        steps_run = len(meter.times_ms)
        now = _stats(self.hook_state)
        delta = {k: now.get(k, 0) - self.start.get(k, 0) for k in now}
        out = {
            "comm_bytes_per_step": delta.get("wire_bytes", 0) / max(steps_run, 1),
            "compression_ratio": (delta.get("raw_bytes", 0) / delta["payload_bytes"]
                                  if delta.get("payload_bytes") else 1.0),
            "hook_time_ms": delta.get("seconds", 0.0) * 1000.0 / max(steps_run, 1),
        }
        measured, after_warmup = meter.measured()
        if after_warmup:  # warm-up steps standing in for measured ones are no clean basis
            out.update(step_projection.projection(trial, measured, self.measured_start, now))
        return out


def trial_summary(meter: StepMeter, accounting: HookAccounting, trial, global_batch: int,
                  final_loss: float, eval_metrics: dict, nan_report, restarts: int) -> dict[str, float]:
    """The trial's summary metrics (issue 3's list, plus steps_done, restarts, warmup)."""
    out = {**meter.summary(global_batch), **accounting.summary(trial, meter),
           "final_loss": final_loss, "nan_detected": 1 if nan_report else 0, "restarts": restarts}
    for metric, value in eval_metrics.items():  # eval_loss (+ eval_accuracy, or eval_fn's)
        out[f"final_{metric}"] = value
    if nan_report:
        out["first_nan_step"] = nan_report.first_nan_step
        out["nan_rank"] = nan_report.nan_rank
        if nan_report.bucket_index is not None:
            out["nan_bucket_index"] = nan_report.bucket_index
    return out


class FidelitySampler:
    """Gradient fidelity (``hooks.with_fidelity``) on every ``every``-th optimizer step.

    Sampling is by step, not by hook call: on steps ``every, 2*every, ...`` every bucket of
    the step goes through ``with_fidelity`` (an extra fp32 reference allreduce per bucket;
    the same steps on every rank, so the ranks issue the same collectives), on the other
    steps the plain hook runs. A step therefore has one value, whatever the bucket count
    (DDP's first iteration and its rebuilt layout differ). ``end(step)`` returns that step's
    ``grad_rel_error`` and ``grad_cosine``: the mean over the step's buckets, from the
    difference of the state's cumulative sums (read only on sampled steps: one host sync).
    ``every = 0``: the plain hook, nothing measured.
    """

    def __init__(self, hook_state, hook, every: int):
        self.every, self.state = int(every or 0), hook_state
        self._sampling = False
        self._rel, self._cos, self._samples = 0.0, 0.0, 0
        self.values: dict[int, tuple[float, float]] = {}  # step -> (rel error, cosine)
        if not self.every:
            self.hook = hook
            return
        _, sampled = hooks.with_fidelity(hook_state, hook, every=1)

        def hook_sampled_by_step(state, bucket):
            return (sampled if self._sampling else hook)(state, bucket)

        hook_sampled_by_step.__name__ = f"{getattr(hook, '__name__', 'hook')}_fidelity_by_step"
        self.hook = hook_sampled_by_step

    def begin(self, step: int) -> None:
        self._sampling = bool(self.every) and step % self.every == 0

    def end(self, step: int) -> dict[str, float]:
        if not self._sampling:
            return {}
        self._sampling = False
        stats = self.state.stats()
        samples = stats.get("fidelity_samples", 0)
        new = samples - self._samples
        if new <= 0:  # no bucket was communicated this step
            return {}
        rel_sum, cos_sum = stats["fidelity_rel_error"] * samples, stats["fidelity_cosine"] * samples
        rel, cos = (rel_sum - self._rel) / new, (cos_sum - self._cos) / new
        self._rel, self._cos, self._samples = rel_sum, cos_sum, samples
        self.values[step] = (rel, cos)
        return {"grad_rel_error": rel, "grad_cosine": cos}

    def summary(self) -> dict[str, float]:
        """Means over the sampled steps of this attempt (absent when nothing was sampled)."""
        if not self.values:
            return {}
        return {"grad_rel_error_mean": statistics.fmean(v[0] for v in self.values.values()),
                "grad_cosine_mean": statistics.fmean(v[1] for v in self.values.values()),
                "grad_fidelity_steps": len(self.values)}


def _iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


def _stats(hook_state) -> dict[str, float]:
    # a HookState counts; a state of torch's own hooks (bench/instrumentation.py's plain arm) does not
    return hook_state.stats() if isinstance(hook_state, HookState) else {}


class Reporter:
    """Rank 0's outputs: MLflow step metrics (batched by the logger), progress, the end."""

    def __init__(self, logger, progress, rank: int):
        self.logger = logger if rank == 0 else None
        self.progress = progress if rank == 0 else None
        self.losses: list[float] = []
        self.last_loss = float("nan")
        self._last_progress = 0.0
        self._recorded: tuple[int, float, dict] = (0, 0.0, {})

    def record(self, step: int, step_time_ms: float, fidelity: dict | None = None) -> None:
        """A step ran: its metrics wait for its agreed loss (``log``)."""
        self._recorded = (step, step_time_ms, fidelity or {})

    def log(self, check) -> None:
        """Log the recorded step with its agreed mean loss (``check``; None: no step was pending)."""
        if check is None:
            return
        step, step_time_ms, fidelity = self._recorded
        assert step == check.step, (step, check.step)
        self.losses.append(check.mean_loss)
        self.last_loss = check.mean_loss
        if self.logger:
            self.logger.log(step, loss=check.mean_loss, step_time_ms=step_time_ms, **fidelity)
        if self.progress and time.monotonic() - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = time.monotonic()
            _call_quietly(self.progress, step, check.mean_loss)

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        if self.logger:
            self.logger.log(step, **metrics)

    def flush(self) -> None:
        if self.logger:
            self.logger.flush()

    def finish(self, summary: dict, status: str, nan_report) -> None:
        if self.progress:
            _call_quietly(self.progress, int(summary["steps_done"]), self.last_loss)
        if not self.logger:
            return
        self.logger.log_summary(**summary)
        tags = {"status": status}
        if nan_report:
            tags.update(nan_source=nan_report.nan_source, nan_rank=nan_report.nan_rank,
                        first_nan_step=nan_report.first_nan_step,
                        nan_bucket_index=nan_report.bucket_index,
                        nan_params=",".join(nan_report.param_names))
            self.logger.log_dict(nan_report.to_dict(), "nan_provenance.json")
        self.logger.set_tags(**{k: v for k, v in tags.items() if v is not None})
        self.logger.close()


def _call_quietly(fn, *args) -> None:
    """Progress is a convenience: its failure must not fail the trial."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - deliberately broad, see docstring
        pass


class FaultInjector:
    """Configured faults (``cfg.faults``) that hit this rank: off unless configured.

    - ``nan_grad``: this rank's local gradient becomes NaN at that step, *before* the
      comm hook sees it (a tensor hook on the first parameter's gradient);
    - ``scale_grad``: this rank's local gradients are multiplied by ``factor`` (large
      but finite: fp16 overflows, fp32 does not);
    - ``crash``: this rank's process dies (``os._exit``) at the start of that step, once:
      ``on_fault`` records it before dying, and a restarted trial skips faults in
      ``fired`` so it can get past the step.
    """

    def __init__(self, faults, rank: int, fired=frozenset(), on_fault=None):
        self.faults = [(i, f) for i, f in enumerate(faults or []) if f.rank == rank and i not in fired]
        # steps where a fault fires on some rank: the same set on every rank
        self.steps = {f.step for i, f in enumerate(faults or []) if i not in fired}
        self.on_fault = on_fault
        self._handles: list = []

    def due(self, step: int) -> bool:
        """Does a fault fire at ``step`` on any rank?"""
        return step in self.steps

    def before_step(self, step: int, module: torch.nn.Module) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for index, fault in self.faults:
            if fault.step != step:
                continue
            if self.on_fault:
                self.on_fault(index, fault)
            if fault.kind == "crash":
                os._exit(17)
            params = [p for p in module.parameters() if p.requires_grad]
            if fault.kind == "nan_grad":
                self._handles.append(params[0].register_hook(_poison))
            elif fault.kind == "scale_grad":
                factor = float(fault.factor)  # the config requires one for scale_grad
                self._handles += [p.register_hook(_scaler(factor)) for p in params]


def _poison(grad: torch.Tensor) -> torch.Tensor:
    return grad + float("nan")  # fills the whole gradient with NaN


def _scaler(factor: float):
    def scale(grad: torch.Tensor) -> torch.Tensor:
        return grad * factor
    return scale


# ----------------------------------------------------------------------------- checkpoints


def capture(step: int, model: DDP, optimizer, hook_state, batches: GlobalBatches,
            rank: int) -> dict[str, Any]:
    """This rank's training state at the end of ``step``.

    ``trainer`` (model, optimizer, step, data position) is identical on every rank under
    DDP, so only rank 0's is kept; ``hook_state`` is per rank (PowerSGD's error-feedback
    memory is each rank's own residual).
    """
    own = isinstance(hook_state, HookState)
    state: dict[str, Any] = {"hook_state": hook_state.state_dict() if own else None, "rank": rank}
    if rank == 0:
        state["trainer"] = {
            "model": model.module.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": step,
            "data_position": batches.position(step + 1),
        }
    return state


def restore(checkpoint: Optional[dict], model: DDP, optimizer, hook_state, wl: Workload, device,
            precision: Optional[Precision] = None) -> int:
    """Load a checkpoint (``{"trainer": ..., "hook_state": ...}``); returns its step (0: none).

    DDP rebuilds its gradient buckets after the first synced iteration; the hook's per-bucket
    memory (error feedback, PowerSGD's P/Q) was saved from the rebuilt layout. One
    zero-gradient iteration first puts a fresh DDP in that layout, so the memory is used from
    the very first resumed step. Every rank resumes, so every rank runs it (a collective).
    """
    if not checkpoint:
        return 0
    prime_buckets(model, wl, device, precision)
    trainer = checkpoint["trainer"]
    model.module.load_state_dict(trainer["model"])
    optimizer.load_state_dict(trainer["optimizer"])
    if isinstance(hook_state, HookState) and checkpoint.get("hook_state") is not None:
        hook_state.load_state_dict(checkpoint["hook_state"])  # also brings the hook's counters back to the checkpoint's
    return int(trainer["step"])


def prime_buckets(model: DDP, wl: Workload, device, precision: Optional[Precision] = None) -> None:
    """One synced forward/backward with a zero loss: no update, buckets get rebuilt."""
    precision = precision or Precision("fp32", device)
    batch = to_device(wl.fetch(wl.train_set, torch.arange(min(2, len(wl.train_set)))), device,
                      precision.input_dtype)
    with precision.autocast():
        loss = wl.step_loss(model, batch)
    (loss * 0.0).backward()
    model.zero_grad(set_to_none=True)


def save_checkpoint_dir(directory: str, state: dict[str, Any]) -> None:
    """Write one rank's part of a checkpoint into ``directory`` (Ray merges the ranks')."""
    if "trainer" in state:
        torch.save(state["trainer"], os.path.join(directory, SHARED_STATE_FILE))
    torch.save(state["hook_state"], os.path.join(directory, HOOK_STATE_FILE.format(rank=state["rank"])))


def load_checkpoint_dir(directory: str, rank: int) -> dict[str, Any]:
    """This rank's view of a merged checkpoint directory."""
    hook_file = os.path.join(directory, HOOK_STATE_FILE.format(rank=rank))
    return {
        "trainer": torch.load(os.path.join(directory, SHARED_STATE_FILE), weights_only=False),
        "hook_state": torch.load(hook_file, weights_only=False) if os.path.exists(hook_file) else None,
    }


# ----------------------------------------------------------------------------- Ray wrapper


def train_loop_per_worker(config: dict) -> None:
    """The function given to ``TorchTrainer`` (Ray Train V2).

    config: ``trial`` (TrialSpec.to_dict()), ``sweep`` (SweepConfig.model_dump()),
    ``tracking_uri``, ``run_id`` (the trial's child run), ``progress`` (callable or None).
    """
    import ray.train
    import ray.train.torch

    from service.config import SweepConfig, TrialSpec

    trial = TrialSpec.from_dict(config["trial"])
    cfg = SweepConfig.model_validate(config["sweep"])
    uri, run_id = config["tracking_uri"], config["run_id"]
    ctx = ray.train.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device() if cfg.resources.use_gpu else torch.device("cpu")
    torch.set_num_threads(max(1, int(cfg.resources.cpus_per_worker)))

    # Restarts and faults that already fired live in the MLflow run's tags: they survive a
    # crash before the first checkpoint. Rank 0 reads them and broadcasts them, so the other
    # ranks never import mlflow or open the store (seconds of CPU per rank per trial).
    attempt, fired = _broadcast_from_rank0(lambda: _restart_state(run_id, uri), rank, device)
    checkpoint = None
    ray_checkpoint = ray.train.get_checkpoint()
    if ray_checkpoint is not None:
        with ray_checkpoint.as_directory() as directory:
            checkpoint = load_checkpoint_dir(directory, rank)
    start = Start(checkpoint=checkpoint, restarts=max(attempt - 1, 0), fired_faults=fired)

    logger = None
    if rank == 0:
        from service import tracking

        # which quantization kernels ran (hooks/_native.py, or the torch fallback): their speeds
        # differ several-fold (docs/hooks.md), so a trial's times mean nothing without it
        tracking.set_tags(run_id, uri, attempts=attempt, kernel_backend=hooks.kernel_backend())
        done = tracking.last_logged_steps(run_id, STEP_METRICS, uri) if attempt > 1 else {}
        logger = tracking.MetricLogger(run_id, uri, cfg.tracking.flush_seconds, skip_through=done)
        if attempt > 1:
            logger.log(checkpoint["trainer"]["step"] if checkpoint else 0, restarts=attempt - 1)

    def on_fault(index: int, fault) -> None:
        from service import tracking  # any rank: faults fire where they are configured

        tracking.set_tags(run_id, uri, **{f"fault.{index}.fired": f"{fault.kind}@step{fault.step}"})

    def checkpoint_fn(step: int, state: dict) -> None:
        with tempfile.TemporaryDirectory() as directory:
            save_checkpoint_dir(directory, state)
            ray.train.report({"step": step, "checkpoint_step": step},
                             checkpoint=ray.train.Checkpoint.from_directory(directory),
                             checkpoint_dir_name=f"step_{step:08d}")

    result = run_training(trial, cfg, rank=rank, world_size=world_size, device=device,
                          logger=logger, progress=config.get("progress"), start=start,
                          checkpoint_fn=checkpoint_fn if cfg.checkpoint.every else None,
                          on_fault=on_fault, process_group=_network_group(config, rank))
    ray.train.report({**result.summary, "status": result.status,
                      "nan_source": (result.nan_report or {}).get("nan_source") or ""})


def _network_group(config: dict, rank: int):
    """With an emulated network (config network:), a gloo group whose sockets live in this
    rank's host namespace: DDP's traffic crosses the shaped links (service/netem.py; Ray Train
    made the default group on the ordinary network before this function ran). None otherwise."""
    network = config.get("network")
    if not network:
        return None
    from service import netem

    return netem.process_group_on_host(network["hosts"][rank])


def _restart_state(run_id: str, uri: str) -> tuple[int, frozenset[int]]:
    """(this attempt's number, indices of faults that already fired), from the run's tags."""
    from service import tracking

    tags = tracking.run_tags(run_id, uri)
    fired = frozenset(int(k.split(".")[1]) for k in tags if k.startswith("fault.") and k.endswith(".fired"))
    return int(tags.get("attempts", "0")) + 1, fired


def _broadcast_from_rank0(read: Callable[[], Any], rank: int, device) -> Any:
    """``read()`` on rank 0, its result on every rank (one object broadcast on the trial's group)."""
    import torch.distributed as dist

    box = [read() if rank == 0 else None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0, device=torch.device(device))
    return box[0]
