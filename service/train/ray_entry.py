"""The Ray Train entry point of a trial: ``train_loop_per_worker``, the function given to
``TorchTrainer`` (pickled by Ray by its module path, ``service.train.ray_entry``).

It reads rank and world size from Ray, resumes from Ray's checkpoint after a crash, writes the
trial's MLflow run from rank 0 through the sweep's TrialRuns actor (``RunWriter``: no rank
imports MLflow or opens the store), and reports to Ray at checkpoints only
(``ray.train.report`` is a barrier across the ranks, never per step: its cost is in
docs/performance.md, "Per-trial overhead"). The trial's summary goes to its MLflow run, where the sweep
reads how it ended; nothing reads it from Ray. The loop itself is plain PyTorch
(service/train/loop.py).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
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
    ``SweepConfig.run_config(trial).model_dump()``, built once by the Tune trial), ``trial_runs``
    (the sweep's TrialRuns actor, service/sweep/trial_runs.py), ``run_id`` (the trial's child
    run), ``progress`` (callable or None), ``network``.
    """
    import ray.train
    import ray.train.torch

    from service.config import SweepConfig, TrialSpec

    trial = TrialSpec.from_dict(config["trial"])
    cfg = SweepConfig.model_validate(config["run_config"])
    runs, run_id = config["trial_runs"], config["run_id"]
    ctx = ray.train.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device() if cfg.resources.use_gpu else torch.device("cpu")
    torch.set_num_threads(max(1, int(cfg.resources.cpus_per_worker)))

    # Restarts and faults that already fired live in the MLflow run's tags: they survive a
    # crash before the first checkpoint. Rank 0 asks the sweep's TrialRuns actor, which reads
    # them (and tags this attempt, with which quantization kernels ran: hooks/_native.py or the
    # torch fallback, whose speeds differ several-fold), and broadcasts the answer.
    attempt, fired, done = _broadcast_from_rank0(
        lambda: ray.get(runs.begin_attempt.remote(run_id, hooks.kernel_backend(), STEP_METRICS)), rank, device)
    checkpoint = None
    ray_checkpoint = ray.train.get_checkpoint()
    if ray_checkpoint is not None:
        with ray_checkpoint.as_directory() as directory:
            checkpoint = load_checkpoint_dir(directory, rank)
    start = Start(checkpoint, max(attempt - 1, 0), fired, config.get("trial_started_at"))

    logger = None
    if rank == 0:
        logger = RunWriter(runs, run_id, cfg.tracking.flush_seconds, skip_through=done)
        if attempt > 1:
            logger.log(checkpoint.trainer.step if checkpoint else 0, restarts=attempt - 1)

    def on_fault(index: int, fault) -> None:  # any rank: faults fire where they are configured
        ray.get(runs.fault_fired.remote(run_id, index, fault))

    def checkpoint_fn(step: int, state: RankCheckpoint) -> None:
        with tempfile.TemporaryDirectory() as directory:
            save_checkpoint_dir(directory, state)
            ray.train.report({"step": step, "checkpoint_step": step},
                             checkpoint=ray.train.Checkpoint.from_directory(directory),
                             checkpoint_dir_name=f"step_{step:08d}")

    with on_host_cpu(config, rank):
        group, apart = host_group(config, rank)
        if logger is not None and apart:  # the emulation the run's step was measured on: every trial says it
            logger.log(0, comm_threads_apart=1.0)
        ctx = TrainingContext(rank=rank, world_size=world_size, device=device, logger=logger,
                              progress=config.get("progress"), start=start,
                              checkpoint_fn=checkpoint_fn if cfg.checkpoint.every else None,
                              on_fault=on_fault, process_group=group)
        run_training(trial, cfg, ctx)


def network_group(config: dict, rank: int):
    """With an emulated network (config network:), a gloo group whose sockets live in this
    rank's host namespace: DDP's traffic crosses the shaped links (service/network/netem.py; Ray Train
    made the default group on the ordinary network before this function ran). None otherwise."""
    network = config.get("network")
    if not network:
        return None
    from service.network import netem

    return netem.process_group_on_host(network["hosts"][rank])


def host_group(config: dict, rank: int):
    """:func:`network_group`, and on hosts that own their CPU (network.host_cpus) its gloo threads
    moved beside the host's share (service/network/host_cpu.py's gloo_threads_apart: the rank's
    compute in the share, its collectives off it, the emulation the cluster bands describe).
    Inside :func:`on_host_cpu`; every rank calls it. Returns (the group, whether its threads moved)."""
    group = network_group(config, rank)
    hosts = (config.get("network") or {}).get("hosts")
    if group is None or not hosts or not hosts[rank].get("cgroup"):
        return group, False
    from service.network import host_cpu

    return group, host_cpu.gloo_threads_apart(group, hosts[rank]["cgroup"])


def on_host_cpu(config: dict, rank: int):
    """With network.host_cpus, this rank's whole process inside its host's
    CPU cgroup while it trains (service/network/host_cpu.py), and back where it was after: Ray
    Train V2 kills its workers when the trial ends, but a process must not outlive its host's
    share in a cgroup the sweep removes."""
    hosts = (config.get("network") or {}).get("hosts")
    if not hosts or not hosts[rank].get("cgroup"):
        return contextlib.nullcontext()
    from service.network import host_cpu

    return host_cpu.joined(hosts[rank]["cgroup"])


class RunWriter:
    """Rank 0's writes to the trial's MLflow run, through the sweep's TrialRuns actor: step
    metrics batched here (``skip_through`` {key: step}: points a crashed attempt already logged
    are dropped) and sent every ``flush_seconds`` without waiting; ``flush`` (before a
    checkpoint) and ``close`` wait until the actor wrote everything sent. The interface of
    ``service.tracking.MetricLogger``, which runs without Ray (tests, benches)."""

    def __init__(self, runs, run_id: str, flush_seconds: float, skip_through: dict[str, int] | None = None):
        self.runs, self.run_id, self.flush_seconds = runs, run_id, float(flush_seconds)
        self.skip_through = dict(skip_through or {})
        self._buffer: list[tuple[str, float, int, int]] = []
        self._sent: list = []  # the actor's replies not yet waited for
        self._last_flush = time.monotonic()

    def log(self, step: int, **metrics: float) -> None:
        now_ms = int(time.time() * 1000)
        self._buffer += [(k, float(v), now_ms, int(step)) for k, v in metrics.items()
                         if step > self.skip_through.get(k, -1)]
        if time.monotonic() - self._last_flush >= self.flush_seconds:
            self._send()

    def log_summary(self, step: int = 0, **metrics: float) -> None:
        now_ms = int(time.time() * 1000)
        self._buffer += [(k, float(v), now_ms, int(step)) for k, v in metrics.items()]
        self.flush()

    def set_tags(self, **tags) -> None:
        self._sent.append(self.runs.set_tags.remote(self.run_id, tags))

    def log_dict(self, dictionary: dict, artifact_file: str) -> None:
        self._sent.append(self.runs.log_dict.remote(self.run_id, dictionary, artifact_file))

    def _send(self) -> None:
        if self._buffer:  # one actor call; the actor serves a caller's calls in order
            self._sent.append(self.runs.log_points.remote(self.run_id, self._buffer))
            self._buffer = []
        self._last_flush = time.monotonic()

    def flush(self) -> None:
        self._send()
        import ray

        sent, self._sent = self._sent, []
        ray.get(sent)  # an actor's error (a store refusing a write) surfaces here

    def close(self) -> None:
        self.flush()


def _broadcast_from_rank0(read: Callable[[], Any], rank: int, device) -> Any:
    """``read()`` on rank 0, its result on every rank (one object broadcast on the trial's group)."""
    import torch.distributed as dist

    box = [read() if rank == 0 else None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0, device=torch.device(device))
    return box[0]
