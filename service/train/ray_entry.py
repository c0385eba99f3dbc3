"""The Ray Train entry point of a trial: ``train_loop_per_worker``, the function given to
``TorchTrainer`` (pickled by Ray by its module path, ``service.train.ray_entry``).

It reads rank and world size from Ray, resumes from Ray's checkpoint after a crash, opens the
trial's MLflow run for rank 0, and reports to Ray at checkpoints only (``ray.train.report`` is
a barrier across the ranks, never per step: its cost is in docs/performance.md, section 1). The
trial's summary goes to its MLflow run, where the sweep reads how it ended; nothing reads it
from Ray. The loop itself is plain PyTorch (service/train/loop.py).
"""

from __future__ import annotations

import tempfile
from typing import Any, Callable

import torch

import hooks
from service.train.checkpoint import RankCheckpoint, load_checkpoint_dir, save_checkpoint_dir
from service.train.context import Start, TrainingContext
from service.train.loop import run_training
from service.train.reporter import STEP_METRICS


def train_loop_per_worker(config: dict) -> None:
    """The function given to ``TorchTrainer`` (Ray Train V2).

    config: ``trial`` (TrialSpec.to_dict()), ``run_config`` (the config the trial trains with,
    ``SweepConfig.run_config(trial).model_dump()``, built once by the Tune trial), ``tracking_uri``,
    ``run_id`` (the trial's child run), ``progress`` (callable or None), ``network``.
    """
    import ray.train
    import ray.train.torch

    from service.config import SweepConfig, TrialSpec

    trial = TrialSpec.from_dict(config["trial"])
    cfg = SweepConfig.model_validate(config["run_config"])
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
    start = Start(checkpoint, max(attempt - 1, 0), fired, config.get("trial_started_at"))

    logger = None
    if rank == 0:
        from service import tracking

        # which quantization kernels ran (hooks/_native.py, or the torch fallback): their speeds
        # differ several-fold (docs/hooks.md), so a trial's times mean nothing without it
        tracking.record_attempt(run_id, uri, attempt, kernel_backend=hooks.kernel_backend())
        done = tracking.last_logged_steps(run_id, STEP_METRICS, uri) if attempt > 1 else {}
        logger = tracking.MetricLogger(run_id, uri, cfg.tracking.flush_seconds, skip_through=done)
        if attempt > 1:
            logger.log(checkpoint.trainer.step if checkpoint else 0, restarts=attempt - 1)

    def on_fault(index: int, fault) -> None:
        from service import tracking  # any rank: faults fire where they are configured

        tracking.record_fault_fired(run_id, uri, index, fault)

    def checkpoint_fn(step: int, state: RankCheckpoint) -> None:
        with tempfile.TemporaryDirectory() as directory:
            save_checkpoint_dir(directory, state)
            ray.train.report({"step": step, "checkpoint_step": step},
                             checkpoint=ray.train.Checkpoint.from_directory(directory),
                             checkpoint_dir_name=f"step_{step:08d}")

    ctx = TrainingContext(rank=rank, world_size=world_size, device=device, logger=logger,
                          progress=config.get("progress"), start=start,
                          checkpoint_fn=checkpoint_fn if cfg.checkpoint.every else None,
                          on_fault=on_fault, process_group=_network_group(config, rank))
    run_training(trial, cfg, ctx)


def _network_group(config: dict, rank: int):
    """With an emulated network (config network:), a gloo group whose sockets live in this
    rank's host namespace: DDP's traffic crosses the shaped links (service/network/netem.py; Ray Train
    made the default group on the ordinary network before this function ran). None otherwise."""
    network = config.get("network")
    if not network:
        return None
    from service.network import netem

    return netem.process_group_on_host(network["hosts"][rank])


def _restart_state(run_id: str, uri: str) -> tuple[int, frozenset[int]]:
    """(this attempt's number, indices of faults that already fired), from the run's tags."""
    from service import tracking

    return tracking.restart_state(run_id, uri)


def _broadcast_from_rank0(read: Callable[[], Any], rank: int, device) -> Any:
    """``read()`` on rank 0, its result on every rank (one object broadcast on the trial's group)."""
    import torch.distributed as dist

    box = [read() if rank == 0 else None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0, device=torch.device(device))
    return box[0]
