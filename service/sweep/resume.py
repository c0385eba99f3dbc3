"""``--resume``: which earlier sweep to continue, which trials are done, which runs to continue.

A trial never gets a second run: an interrupted (KILLED) or still RUNNING run is continued,
with its checkpoints; FINISHED and FAILED trials are not run again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from service.config import SweepConfig, TrialSpec
from service.sweep.adaptive import Outcome
from service.sweep.errors import SweepError


@dataclass
class ResumePlan:
    """What --resume continues: the sweep's run, the runs of interrupted trials (by trial key),
    the trials still to run, and how the ended ones ended (the adaptive rounds replay them)."""

    parent_run_id: str
    reusable_runs: dict[str, str] = field(default_factory=dict)
    pending: list[TrialSpec] = field(default_factory=list)
    done: dict[str, Outcome] = field(default_factory=dict)


def plan_resume(cfg: SweepConfig, trials: list[TrialSpec], tracking_uri: str) -> ResumePlan:
    """The plan for --resume, from one read of the earlier sweep's trial records.

    The parent is the experiment's latest sweep run of the same config (its fingerprint). A
    trial is done when its run ended FINISHED or FAILED; a KILLED (interrupted) or still
    RUNNING run is continued, so no trial ever gets a second run.
    """
    from service import tracking

    same = tracking.latest_sweep_runs(cfg.name, tracking_uri, fingerprint=cfg.fingerprint())
    if not same:
        if tracking.latest_sweep_runs(cfg.name, tracking_uri):
            raise SweepError(f"nothing to resume: the sweeps of experiment {cfg.name!r} in {tracking_uri} ran a "
                             f"different config (workload, grid, faults or checkpoints changed since); "
                             f"run it without --resume to start a new sweep")
        raise SweepError(f"nothing to resume: no earlier sweep of experiment {cfg.name!r} in {tracking_uri}; "
                         f"run it without --resume")
    parent = same[0]
    try:
        records = tracking.SweepReader(tracking_uri).trials(parent.info.run_id)
    except tracking.StoreError as e:
        raise SweepError(f"cannot resume: {e}") from None
    # an interrupted trial is not done: it runs again, in its own run
    done = {r.key: Outcome(r.state, r.metrics.get("final_eval_loss", math.nan)) for r in records if r.ended}
    return ResumePlan(parent.info.run_id, {r.key: r.run_id for r in records if not r.ended},
                      [t for t in trials if t.key not in done], done)
