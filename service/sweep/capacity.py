"""What a sweep's trials need from Ray: logical CPUs (and GPUs) for the trials that run at once."""

from __future__ import annotations

from service.config import SweepConfig, TrialSpec
from service.sweep.errors import SweepError

# A Tune trial only waits on its TorchTrainer: it needs a sliver of a CPU, not a whole one.
TRIAL_DRIVER_CPUS = 0.01


def cpus_needed(cfg: SweepConfig, trials: list[TrialSpec]) -> float:
    """Logical CPUs for max_concurrent_trials of the largest trials running at once."""
    largest = max(t.world_size for t in trials)
    concurrent = min(cfg.resources.max_concurrent_trials, len(trials))
    return concurrent * (largest * cfg.resources.cpus_per_worker + TRIAL_DRIVER_CPUS)


def check_fits(cfg: SweepConfig, trials: list[TrialSpec], *, where: str, gpus: float,
               cpus: float | None = None, largest_node_cpus: float = 0.0) -> None:
    """Refuse in one line (SweepError) a sweep whose largest trial ``where`` ("this Ray
    cluster", "this machine") can never place: with ``cpus``, its workers' logical CPUs in
    all and one worker's on the largest node; with use_gpu, one GPU per worker (``gpus``)."""
    largest = max(t.world_size for t in trials)
    cpw = cfg.resources.cpus_per_worker
    need_cpu = largest * cpw + TRIAL_DRIVER_CPUS
    if cpus is not None and (cpus + 1e-9 < need_cpu or largest_node_cpus + 1e-9 < cpw):
        raise SweepError(
            f"world_size {largest} x cpus_per_worker {cpw:g} needs {need_cpu:g} CPUs but {where} "
            f"has {cpus:g} (largest node {largest_node_cpus:g}): it can never place that trial; "
            f"lower search.world_size or resources.cpus_per_worker, or add nodes")
    if cfg.resources.use_gpu and gpus < largest:
        raise SweepError(f"world_size {largest} with use_gpu needs {largest} GPUs but {where} has "
                         f"{gpus:g}; lower search.world_size or set resources.use_gpu: false")
