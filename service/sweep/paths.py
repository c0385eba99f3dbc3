"""Where a sweep writes: Ray's storage root, a local directory for its log and report, and
the names of Tune's per-trial directories."""

from __future__ import annotations

import re
from pathlib import Path

from service import uris
from service.config import SweepConfig, TrialSpec


def storage_root(cfg: SweepConfig) -> str:
    """Where Ray Tune and Ray Train keep their state: the config's storage_path (a local
    directory made absolute, or a URI such as s3://...), default ./results."""
    where = cfg.storage_path or "results"
    if uris.is_remote(where):
        return where
    return str(Path(where).expanduser().resolve())


def local_base(cfg: SweepConfig) -> Path:
    """A directory on this machine under which the sweep's own files go: storage_path when
    it is local, ./results when it is a URI."""
    root = storage_root(cfg)
    return Path("results").resolve() if uris.is_remote(root) else Path(root)


def local_dir(cfg: SweepConfig) -> Path:
    """A directory on this machine for the sweep's log (storage_path when it is local)."""
    return local_base(cfg) / safe_name(cfg.name)


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "sweep"


def trial_dirname(trial) -> str:
    """Tune's directory of a trial: its run name and Tune's trial id."""
    spec = trial.config.get("trial", {})
    try:
        return f"{TrialSpec.from_dict(spec).run_name}-{trial.trial_id}"
    except Exception:
        return trial.trial_id
