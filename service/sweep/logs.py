"""The sweep's log file: this process's records (ours, Ray's, MLflow's) go there, so the
terminal shows only the sweep's own lines (progress, the table, one-line errors)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from service.config import SweepConfig
from service.sweep.paths import local_dir

_log_file: Path | None = None  # set by start_log_file(): where this process's log records go


def start_log_file(cfg: SweepConfig) -> Path:
    """Send this process's logging (ours and Ray's) to a file instead of the terminal."""
    directory = local_dir(cfg)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"sweep-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    global _log_file
    _log_file = path
    return path


def route_library_logs_to_file() -> None:
    """Ray and MLflow install their own stderr handlers when imported; send their records
    to our log file (the root logger's handlers) instead, so the terminal shows only the
    sweep's own lines. Nothing without a log file (run_sweep called from Python, not main())."""
    if _log_file is None:
        return
    import ray  # noqa: F401  (imported here so its handlers exist before they are removed: the
    #             package split made ray's first import later than this call)
    for name in ("ray", "ray.tune", "ray.train", "ray.data", "ray.air", "mlflow"):
        logger = logging.getLogger(name)
        for h in list(logger.handlers):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                logger.removeHandler(h)
        logger.propagate = True
