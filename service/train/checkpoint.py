"""A rank's training state captured at a checkpoint step, restored on a restart, and written
into (read from) the directory Ray Train merges across the ranks."""

from __future__ import annotations

import os
from typing import Any, Optional

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from hooks.state import HookState
from service.train.batches import GlobalBatches
from service.training_options import Precision
from service.workloads import Workload, to_device

SHARED_STATE_FILE = "trainer.pt"  # model, optimizer, step, data position (rank 0 writes it)
HOOK_STATE_FILE = "hook_state_rank{rank}.pt"  # each rank's hook state (error feedback differs)


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
