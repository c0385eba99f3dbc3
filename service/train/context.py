"""What one rank's training is given, in one frozen object: where it runs (rank, world size,
device, process group), what it talks to (MLflow logger, progress, checkpoints, fault records)
and the parts benches and tests swap (hook builder, NaN monitor, step timer). The caller builds it
once (service/train/ray_entry.py under Ray; a bench or a test without), ``run_training`` and
``set_up`` read it instead of a dozen threaded arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

import hooks
from service.train.checkpoint import RankCheckpoint
from service.train.metrics import StepMeter
from service.train.nan import NanMonitor


@dataclass
class Start:
    """Where a (re)started trial begins: a checkpoint to resume from, how many times the
    trial has been restarted, and which configured faults already fired (by index)."""

    checkpoint: Optional[RankCheckpoint] = None
    restarts: int = 0
    fired_faults: frozenset[int] = frozenset()
    trial_started_at: Optional[float] = None  # unix seconds the sweep created the trial's trainer


@dataclass(frozen=True)
class TrainingContext:
    """One rank of one trial (an initialised process group; no Ray needed).

    * ``device``: a ``torch.device`` or its name ("cpu", "cuda:0"), kept as a ``torch.device``;
    * ``logger`` (rank 0): a ``tracking.MetricLogger`` (ray_entry.py's ``RunWriter`` under Ray) or None; ``progress(step, loss)``: called
      on rank 0 at most every ~2 s;
    * ``start``: the resume point (:class:`Start`);
    * ``checkpoint_fn(step, state)``: called on every rank every ``checkpoint.every`` steps with
      this rank's training state (None: no checkpoints); ``on_fault(index, fault)``: called just
      before a configured fault fires;
    * ``process_group``: the group DDP and the hook communicate on (None: the default group; an
      emulated network's, service/network/netem.py);
    * ``build_hook(name, process_group=..., **params) -> (state, hook)``, ``make_monitor`` (takes
      NanMonitor's arguments) and ``make_meter(warmup_steps, first_step)``: the trial's hook, its
      NaN checks and its step timer (benches and tests pass their own instead of replacing
      module attributes).
    """

    rank: int
    world_size: int
    device: Any
    logger: Any = None
    progress: Optional[Callable[[int, float], None]] = None
    start: Start = field(default_factory=Start)
    checkpoint_fn: Optional[Callable[[int, RankCheckpoint], None]] = None
    on_fault: Optional[Callable[[int, Any], None]] = None
    process_group: Any = None
    build_hook: Callable = hooks.build
    make_monitor: Callable[..., NanMonitor] = NanMonitor
    make_meter: Callable[[int, int], StepMeter] = StepMeter

    def __post_init__(self):
        object.__setattr__(self, "device", torch.device(self.device))
