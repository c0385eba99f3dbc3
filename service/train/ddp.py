"""DDP's arguments for a trial: its knobs (search axes) and the model's needs (unused
parameters, buffers), and the one line that says find_unused_parameters went on by itself."""

from __future__ import annotations

import logging
from typing import Any

from service.config import DDP_BUCKET_CAP_MB
from service.text import count

log = logging.getLogger("service.train")


def ddp_arguments(trial, find_unused: bool, broadcast_buffers: bool) -> dict[str, Any]:
    """DDP's keyword arguments for this trial. bucket_cap_mb 25 is DDP's default and is left
    to DDP, which then also caps its first bucket at 1 MiB after the rebuild (any other cap
    applies to every bucket, as DDP does with an explicit value). The config's
    broadcast_buffers is DDP's forward_sync_buffers (torch 2.13 deprecates the old name); its
    one difference, a buffer sync at construction, is a no-op here: preflight proved every
    rank's buffers equal."""
    return {"bucket_cap_mb": None if trial.bucket_cap_mb == DDP_BUCKET_CAP_MB else trial.bucket_cap_mb,
            "gradient_as_bucket_view": trial.gradient_as_bucket_view, "static_graph": trial.static_graph,
            "find_unused_parameters": find_unused, "forward_sync_buffers": broadcast_buffers}


def say_find_unused_is_on(name: str, unused: list[str], logger) -> None:
    """Once per trial (rank 0): the log line and the run's tag that DDP looks for unused
    parameters every step, and which parameters made it."""
    shown = ", ".join(unused[:5]) + (", ..." if len(unused) > 5 else "")
    line = (f"workload {name!r}: {count(len(unused), 'parameter')} without a gradient in a training step ({shown}): "
            "DDP's find_unused_parameters is on (set workload.find_unused_parameters to silence this)")
    log.warning(line)
    if logger is not None:
        logger.set_tags(find_unused_parameters=f"on (auto): {shown}")
