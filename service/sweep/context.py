"""What every Tune trial of one sweep runs with, built once by the driver and handed to each
trial (pickled by Ray with ``tune.with_parameters``): one frozen object instead of the same
eight values threaded through the tuner, the trial and its trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from service.config import SweepConfig


@dataclass(frozen=True)
class SweepContext:
    """``trials_storage``: where Ray Train keeps each trial's checkpoints (under the parent run's
    directory, so a resumed trial finds its own); ``board``: the progress board actor
    (service/sweep/progress.py); ``trial_runs``: the actor that opens and closes the trials' MLflow
    runs (service/sweep/trial_runs.py); ``train_loop``: the per-worker function TorchTrainer runs;
    ``reusable_runs``: {trial key: run id} of interrupted trials that --resume continues;
    ``network``: {"links": {link_gbps: LinkMeasurement}, "owner_pid": the driver's pid} with a
    network: section, else None; ``autoscaling_requests``: whether the trials' trainers tell Ray's
    autoscaling coordinator what they need (False on the local instance the sweep started:
    service/sweep/lean_trainer.py)."""

    cfg: SweepConfig
    tracking_uri: str
    trials_storage: str
    board: Any
    trial_runs: Any
    train_loop: Callable[[dict], None]
    reusable_runs: dict[str, str] = field(default_factory=dict)
    network: Optional[dict] = None
    autoscaling_requests: bool = True
