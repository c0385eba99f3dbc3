"""``--resume``: which earlier sweep to continue, which trials are done, which runs to continue.

A trial never gets a second run: an interrupted (KILLED) or still RUNNING run is continued,
with its checkpoints; FINISHED and FAILED trials are not run again.
"""

from __future__ import annotations

import math

from service.config import SweepConfig, TrialSpec
from service.sweep.adaptive import Outcome
from service.sweep.errors import SweepError


def plan_resume(cfg: SweepConfig, trials: list[TrialSpec],
                tracking_uri: str) -> tuple[str, dict[str, str], list[TrialSpec]]:
    """(parent run id, {trial key: run id to continue}, trials still to run) for --resume.

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
    done = {r.key for r in records if r.ended}
    reusable = {r.key: r.run_id for r in records if not r.ended}
    pending = [t for t in trials if t.key not in done]
    return parent.info.run_id, reusable, pending


def done_outcomes(parent_run_id: str, tracking_uri: str) -> dict[str, Outcome]:
    """The ended trials of an adaptive sweep, by key, as its rounds see them: how each ended
    and its final eval loss (an interrupted trial is not among them: it runs again)."""
    from service import tracking

    records = tracking.SweepReader(tracking_uri).trials(parent_run_id)
    return {r.key: Outcome(r.state, r.metrics.get("final_eval_loss", math.nan))
            for r in records if r.ended}
