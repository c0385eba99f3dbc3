"""What a sweep's trials need from Ray: logical CPUs (and GPUs) for the trials that run at once."""

from __future__ import annotations

from service.config import SweepConfig, TrialSpec

# A Tune trial only waits on its TorchTrainer: it needs a sliver of a CPU, not a whole one.
TRIAL_DRIVER_CPUS = 0.01


def cpus_needed(cfg: SweepConfig, trials: list[TrialSpec]) -> float:
    """Logical CPUs for max_concurrent_trials of the largest trials running at once."""
    largest = max(t.world_size for t in trials)
    concurrent = min(cfg.resources.max_concurrent_trials, len(trials))
    return concurrent * (largest * cfg.resources.cpus_per_worker + TRIAL_DRIVER_CPUS)
