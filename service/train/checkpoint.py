"""A rank's training state captured at a checkpoint step, restored on a restart, and written
into (read from) the directory Ray Train merges across the ranks."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from hooks.state import HookState
from service import hook_facts
from service.train.batches import GlobalBatches
from service.train.training_options import Precision
from service.workloads import Workload, to_device

SHARED_STATE_FILE = "trainer.pt"  # model, optimizer, step, data position (rank 0 writes it)
# a periodic hook's ranks hold their own models and optimizer states between exchanges: each rank's
RANK_STATE_FILE = "trainer_rank{rank}.pt"
HOOK_STATE_FILE = "hook_state_rank{rank}.pt"  # each rank's hook state (error feedback differs)


@dataclass
class TrainerState:
    """What DDP keeps identical on every rank: only rank 0's is written."""

    model: dict[str, Any]
    optimizer: dict[str, Any]
    step: int
    data_position: Any


@dataclass
class RankCheckpoint:
    """One rank's checkpoint: the shared trainer state (rank 0's when captured; every rank
    reads it back) and this rank's own hook state (None: a hook without state, or dropped)."""

    rank: int
    hook_state: Optional[dict[str, Any]]
    trainer: Optional[TrainerState] = None
    own_trainer: bool = False  # ``trainer`` is this rank's own (a periodic hook's), not rank 0's shared one


def capture(step: int, model: DDP, optimizer, hook_state, batches: GlobalBatches,
            rank: int) -> RankCheckpoint:
    """This rank's training state at the end of ``step``.

    ``trainer`` (model, optimizer, step, data position) is identical on every rank under
    DDP, so only rank 0's is kept (a periodic hook's ranks train their own copies between
    exchanges: each rank's is kept); ``hook_state`` is per rank (PowerSGD's error-feedback
    memory is each rank's own residual; local SGD's anchor, DiLoCo's outer momentum).
    """
    own = isinstance(hook_state, HookState)
    if not isinstance(model, DDP):  # an fsdp trial's ShardedModel: gathered by every rank; rank 0's holds the tensors
        from service.train import fsdp  # FSDP2's modules: imported by a trial that shards alone (train/loop.py)

        model_state, optimizer_state = fsdp.full_state(model, optimizer)
        trainer = TrainerState(model_state, optimizer_state, step, batches.position(step + 1)) if rank == 0 else None
        return RankCheckpoint(rank, hook_state.state_dict() if own else None, trainer)
    per_rank = own and hook_facts.periodic(hook_state.name)  # local steps: the ranks' models differ
    trainer = (TrainerState(model.module.state_dict(), optimizer.state_dict(), step, batches.position(step + 1))
               if rank == 0 or per_rank else None)
    return RankCheckpoint(rank, hook_state.state_dict() if own else None, trainer, per_rank)


def restore(checkpoint: Optional[RankCheckpoint], model: DDP, optimizer, hook_state, wl: Workload, device,
            precision: Optional[Precision] = None) -> int:
    """Load a checkpoint; returns its step (0: none).

    DDP rebuilds its gradient buckets after the first synced iteration; the hook's per-bucket
    memory (error feedback, PowerSGD's P/Q) was saved from the rebuilt layout. One
    zero-gradient iteration first puts a fresh DDP in that layout, so the memory is used from
    the very first resumed step. Every rank resumes, so every rank runs it (a collective).
    """
    if not checkpoint:
        return 0
    prime_buckets(model, wl, device, precision)
    trainer = checkpoint.trainer
    model.module.load_state_dict(trainer.model)
    optimizer.load_state_dict(trainer.optimizer)
    if isinstance(hook_state, HookState) and checkpoint.hook_state is not None:
        hook_state.load_state_dict(checkpoint.hook_state)  # also brings the hook's counters back to the checkpoint's
    return int(trainer.step)


def restore_sharded(checkpoint: Optional[RankCheckpoint], model, optimizer, hook_state) -> int:
    """An fsdp trial's checkpoint (a gathered full state dict, the same file on every rank):
    every rank loads it and keeps its shards (a collective); returns its step (0: none). FSDP
    has no buckets to prime: its residuals are keyed by sharded module."""
    if not checkpoint:
        return 0
    from service.train import fsdp  # FSDP2's modules: imported by a trial that shards alone (train/loop.py)

    trainer = checkpoint.trainer
    fsdp.load_full_state(model, optimizer, trainer.model, trainer.optimizer)
    if isinstance(hook_state, HookState) and checkpoint.hook_state is not None:
        hook_state.load_state_dict(checkpoint.hook_state)
    return int(trainer.step)


def prime_buckets(model: DDP, wl: Workload, device, precision: Optional[Precision] = None) -> None:
    """One synced forward/backward with a zero loss: no update, buckets get rebuilt."""
    precision = precision or Precision("fp32", device)
    batch = to_device(wl.fetch(wl.train_set, torch.arange(min(2, len(wl.train_set)))), device,
                      precision.input_dtype)
    with precision.autocast():
        loss = wl.step_loss(model, batch)
    (loss * 0.0).backward()
    model.zero_grad(set_to_none=True)


def save_checkpoint_dir(directory: str, state: RankCheckpoint) -> None:
    """Write one rank's part of a checkpoint into ``directory`` (Ray merges the ranks').
    The files hold plain dicts (torch.save), so they do not depend on these classes' paths."""
    if state.trainer is not None:
        name = RANK_STATE_FILE.format(rank=state.rank) if state.own_trainer else SHARED_STATE_FILE
        torch.save(asdict(state.trainer), os.path.join(directory, name))
    torch.save(state.hook_state, os.path.join(directory, HOOK_STATE_FILE.format(rank=state.rank)))


def load_checkpoint_dir(directory: str, rank: int) -> RankCheckpoint:
    """This rank's view of a merged checkpoint directory."""
    hook_file = os.path.join(directory, HOOK_STATE_FILE.format(rank=rank))
    own_file = os.path.join(directory, RANK_STATE_FILE.format(rank=rank))
    own = os.path.exists(own_file)
    trainer = torch.load(own_file if own else os.path.join(directory, SHARED_STATE_FILE), weights_only=False)
    return RankCheckpoint(rank, torch.load(hook_file, weights_only=False) if os.path.exists(hook_file) else None,
                          TrainerState(**trainer), own)
