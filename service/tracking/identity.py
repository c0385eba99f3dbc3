"""A trial's identity in the store: written as tags when its run is created (``identity_tags``)
and read back, typed, as a ``TrialRecord`` (never parsed from the run name or its string params)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from service.tracking.store import StoreError

# A trial's identity, written as tags when its run is created (never parsed from the run name).
TRIAL_KEY_TAG = "trial_key"   # TrialSpec.key: what --resume matches on
IDENTITY_TAGS = {"config": "trial_config", "hook": "trial_hook", "hook_params": "trial_hook_params",
             "world_size": "trial_world_size", "seed": "trial_seed", "link_gbps": "trial_link_gbps"}
DDP_TAG = "trial_ddp"  # DDP's knobs and compile as JSON (runs recorded before an axis existed lack it: its default)
KIND_TAG = "trial_kind"  # TrialSpec.kind: full | quality | timing (runs recorded before it have none: full)


def identity_tags(trial) -> dict[str, str]:
    """The tags that say which trial (a TrialSpec) a run is: key, configuration label (the run
    name without its world size, seed and link: one label per configuration), hook, hook params
    as JSON, world size, seed, emulated link ("" on the ordinary network), DDP's knobs and compile as JSON and
    what the run is for (TrialSpec.kind: full, or a split network sweep's quality / timing run)."""
    return {TRIAL_KEY_TAG: trial.key,
            IDENTITY_TAGS["config"]: trial.config_label,
            IDENTITY_TAGS["hook"]: trial.hook,
            IDENTITY_TAGS["hook_params"]: json.dumps(dict(trial.hook_params), sort_keys=True),
            IDENTITY_TAGS["world_size"]: str(trial.world_size),
            IDENTITY_TAGS["seed"]: str(trial.seed),
            IDENTITY_TAGS["link_gbps"]: "" if trial.link_gbps is None else repr(float(trial.link_gbps)),
            DDP_TAG: json.dumps(trial.knobs(), sort_keys=True),
            KIND_TAG: trial.kind}


@dataclass(frozen=True)
class TrialRecord:
    """One trial's run as the sweep recorded it: its identity (from the tags written when the run
    was created, typed again: hook params as the config had them) and what it logged."""

    run_id: str
    run_name: str
    key: str                        # TrialSpec.key
    config: str                     # the configuration's label, e.g. quantization_perchannel-c512
    hook: str
    hook_params: dict[str, Any]     # every hook parameter, defaults included, typed
    world_size: int
    seed: int
    link_gbps: float | None         # the emulated link, None on the ordinary network
    kind: str                       # TrialSpec.kind: full | quality | timing
    status: str                     # MLflow's: RUNNING | FINISHED | FAILED | KILLED
    start_time: int                 # epoch ms
    end_time: int | None
    metrics: dict[str, float]       # latest value of every metric
    params: dict[str, str]
    tags: dict[str, str]

    @classmethod
    def from_run(cls, run) -> "TrialRecord":
        tags = run.data.tags
        missing = [t for t in (TRIAL_KEY_TAG, *IDENTITY_TAGS.values()) if t not in tags]
        if missing:
            raise StoreError(f"trial run {run.info.run_name or run.info.run_id} ({run.info.run_id}) has no "
                             f"{missing[0]} tag: it was written by an older version of the service, "
                             f"which this one cannot read; run the sweep again")
        link = tags[IDENTITY_TAGS["link_gbps"]]
        return cls(run_id=run.info.run_id, run_name=run.info.run_name or run.info.run_id,
                   key=tags[TRIAL_KEY_TAG], config=tags[IDENTITY_TAGS["config"]], hook=tags[IDENTITY_TAGS["hook"]],
                   hook_params=json.loads(tags[IDENTITY_TAGS["hook_params"]]),
                   world_size=int(tags[IDENTITY_TAGS["world_size"]]), seed=int(tags[IDENTITY_TAGS["seed"]]),
                   link_gbps=float(link) if link else None, kind=tags.get(KIND_TAG, "full"), status=run.info.status,
                   start_time=run.info.start_time or 0, end_time=run.info.end_time,
                   metrics=dict(run.data.metrics), params=dict(run.data.params), tags=dict(tags))

    @property
    def state(self) -> str:
        """ok | nan | failed | killed | running: how the trial ended (or that it has not)."""
        if self.status in ("RUNNING", "KILLED", "FAILED"):
            return self.status.lower()
        tag = self.tags.get("status")
        if tag in ("ok", "nan", "failed"):
            return tag
        return "nan" if self.metrics.get("nan_detected", 0) >= 1 else "ok"

    @property
    def parallelism(self) -> str:
        """ddp | fsdp (search.parallelism), as the run's params record it (ddp: a run from before)."""
        return self.params.get("parallelism", "ddp")

    @property
    def knobs(self) -> dict[str, Any]:
        """DDP's knobs and compile the trial ran with, as the run records them (a knob missing in
        a run recorded before it was an axis: its default, DDP's own or eager)."""
        return json.loads(self.tags.get(DDP_TAG, "{}"))

    @property
    def ended(self) -> bool:
        """FINISHED or FAILED: done for --resume (KILLED and RUNNING runs are continued)."""
        return self.status in ("FINISHED", "FAILED")
