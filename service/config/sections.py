"""The config's plain sections (resources, stop, faults, checkpoint, tracking, report, network)
and the checks sweep axes share (a scalar for a list, each value in range, no value twice)."""

from __future__ import annotations

from typing import Any, Callable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from service.config.errors import FieldProblem
from service.config.limits import (DEFAULT_FLUSH_SECONDS, DEFAULT_PROJECTED_LATENCY_MS, DEFAULT_TARGET_TOLERANCE,
                                   MAX_HOST_CPUS, MAX_LATENCY_MS, MAX_LINK_GBPS, MIN_HOST_CPUS,
                                   MAX_PROJECTED_WORLD_SIZE, MAX_STEPS, MAX_WORLD_SIZE)
from service.text import short_value

RECORDED = "recorded"  # validation context: a config read back from a sweep's parent run, not run anew

# Strict types: YAML already yields ints, floats, bools and strings, so "300" for a step count
# is a mistake worth naming, not something to coerce.
STRICT = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


def scalar_to_list(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


def check_axis(values: list, ok: Callable[[Any], bool], allowed: str) -> None:
    """Each value of a sweep axis passes ``ok``; else a FieldProblem at the first that does not."""
    for i, v in enumerate(values):
        if not ok(v):
            raise FieldProblem(f"[{i}]", f"{v:g} is not allowed; {allowed}" if isinstance(v, float)
                               else f"{v} is not allowed; {allowed}")


def no_repeats(values: list[int]) -> None:
    seen: set[int] = set()
    for i, v in enumerate(values):
        if v in seen:
            raise FieldProblem(f"[{i}]", f"{v} is listed twice; each value runs once")
        seen.add(v)


class ResourcesConfig(BaseModel):
    model_config = STRICT

    cpus_per_worker: float = Field(1.0, gt=0, le=1024, description="logical CPUs per worker; fractional allowed")
    use_gpu: bool = Field(False, description="true: NCCL backend, one GPU per worker")
    max_concurrent_trials: int = Field(1, ge=1, le=1024)


class StopConfig(BaseModel):
    model_config = STRICT

    on_nan: bool = Field(True, description="end a trial, all ranks together, at its first non-finite step")


class Fault(BaseModel):
    """A fault injected on purpose (to test NaN handling and restarts): off unless the config lists one."""

    model_config = STRICT

    kind: Literal["nan_grad", "scale_grad", "crash"]
    step: int = Field(ge=1, le=MAX_STEPS, description="optimizer step at which it fires")
    rank: int = Field(ge=0, lt=MAX_WORLD_SIZE, description="the rank it hits")
    factor: float | None = Field(None, description="gradient multiplier; scale_grad only")

    @model_validator(mode="after")
    def _factor_only_for_scale(self) -> "Fault":
        if self.kind == "scale_grad":
            if self.factor is None:
                raise FieldProblem("factor", "missing: scale_grad needs a factor, a finite number such as 1.0e6")
            if self.factor == 0:
                raise FieldProblem("factor", "0 is not allowed; scale_grad needs a non-zero factor")
        elif self.factor is not None:
            raise FieldProblem("factor", f"only scale_grad takes a factor, not {self.kind}")
        return self


class CheckpointConfig(BaseModel):
    model_config = STRICT

    every: int = Field(0, ge=0, le=MAX_STEPS, description="steps between checkpoints; 0 = off")
    max_failures: int = Field(0, ge=0, le=100, description="restarts of a crashed trial from its last checkpoint")


class TrackingConfig(BaseModel):
    model_config = STRICT

    flush_seconds: float = Field(DEFAULT_FLUSH_SECONDS, gt=0, le=3600, description="how often rank 0 flushes metrics to MLflow")
    fidelity_every: int = Field(0, ge=0, le=MAX_STEPS, description="measure gradient fidelity (grad_rel_error, grad_cosine) on every bucket of every N-th optimizer step; 0 = off")
    paired_timing_every: int = Field(5, ge=0, le=MAX_STEPS, description="time the baseline hook beside the trial's own every N-th measured step (step_ratio_vs_baseline; service/train/paired_timing.py); 0 = off")
    transport_probe: bool = Field(True, description="before the trials, time each collective kind once per world size "
                                  "above 1 (transport.json: what every projected cell's collectives cost; a Ray Train "
                                  "start-up and ~5 s of probing per world size); false: the report scales each "
                                  "trial's recorded communication instead, and says so")
    timeline_steps: int = Field(5, ge=0, le=MAX_STEPS, description="record DDP's step as a timeline (each bucket's ready, encode, collective, decode) on this many steps after the warm-up, spread over the trial, plus the rank's compute at a half and a quarter of its micro-batch: the step model's input (step_timeline.json; service/train/step_sampling.py); 0 = off")


def projected_latency() -> Any:
    """report.project's and report.cluster's latency_ms: one field, one description."""
    return Field(DEFAULT_PROJECTED_LATENCY_MS, ge=0, le=MAX_LATENCY_MS,
                 description="one-way latency per message between two ranks there, ms, that every collective "
                 "pays per round; default 0.025: a kernel TCP stack on both hosts and a switch in one "
                 "datacenter (gloo's transport; docs/hooks.md says where the figure comes from)")


class ProjectCells(BaseModel):
    """The (world size, link) cells the report projects every configuration to (service/answer/projection.py);
    left out: W from 8 in powers of two up to the global batch, x 10, 25, 100 Gbit/s."""

    model_config = STRICT

    world_size: list[int] | None = Field(None, min_length=1, description="world sizes to project to")
    link_gbps: list[float] | None = Field(None, min_length=1, description="link rates to project to, Gbit/s")
    latency_ms: float = projected_latency()

    _scalar_allowed = field_validator("world_size", "link_gbps", mode="before")(
        lambda v: v if v is None else scalar_to_list(v))

    @field_validator("world_size")
    @classmethod
    def _sizes(cls, sizes: list[int] | None) -> list[int] | None:
        if sizes is not None:
            check_axis(sizes, lambda w: 1 <= w <= MAX_PROJECTED_WORLD_SIZE,
                       f"a world size is 1 to {MAX_PROJECTED_WORLD_SIZE}")
            no_repeats(sizes)
        return sizes

    @field_validator("link_gbps")
    @classmethod
    def _rates(cls, rates: list[float] | None) -> list[float] | None:
        if rates is not None:
            check_axis(rates, lambda g: 0 < g <= MAX_LINK_GBPS, f"a link rate is above 0 and at most {MAX_LINK_GBPS:g} Gbit/s")
            if len(set(rates)) != len(rates):
                raise FieldProblem("", f"{short_value(rates)} lists a rate twice; each value is projected once")
        return rates


class ClusterCell(BaseModel):
    """The cluster the user will train on: the report's headline answers for it too."""

    model_config = STRICT

    world_size: int = Field(ge=1, le=MAX_PROJECTED_WORLD_SIZE, description="ranks on that cluster")
    link_gbps: float = Field(gt=0, le=MAX_LINK_GBPS, description="each rank's link there, Gbit/s")
    latency_ms: float = projected_latency()
    transport: str | None = Field(None, description="a transport.json of that cluster's hosts (python -m "
                                  "service.probe): the cell, and the decision map, priced with it; default: the "
                                  "sweep's own probe, where its trials ran")

    @field_validator("transport")
    @classmethod
    def _transport(cls, path: str | None, info: ValidationInfo) -> str | None:
        # a report rebuilt from MLflow reads the copy the sweep made of the file (RECORDED): the
        # file may be gone by then
        if path is not None and not (info.context or {}).get(RECORDED):
            from service.step_model.transport import read_file

            try:
                read_file(path)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise FieldProblem("", f"{path}: not a transport.json python -m service.probe wrote ({exc}); "
                                       "allowed: the path of one") from None
        return path


class PlanRound(BaseModel):
    """``search.plan``: after its trials, the sweep designs a per-bucket plan for ``cell`` from their
    step timelines (service/step_model/planner.py) and trains it, at every world size, link and
    seed the baseline ran (service/sweep/plan_round.py)."""

    model_config = STRICT

    cell: Union[Literal["cluster"], ClusterCell] = Field(
        description="the (world_size, link_gbps, latency_ms) the plan is designed for, or 'cluster': report.cluster's")

    def check(self, cfg) -> None:
        """A plan needs its cell, the baseline and one other hook to mix, and the step timelines
        (``cfg``: the SweepConfig it is part of)."""
        import hooks  # imported late: it pulls in torch
        from hooks.plan import NAME as PLAN

        if self.cell == "cluster" and cfg.report.cluster is None:
            raise FieldProblem("search.plan.cell", "'cluster' names report.cluster, which is not set; allowed: "
                                                   "set report.cluster, or give the cell {world_size, link_gbps}")
        names = {e.name for e in cfg.search.hooks}
        if hooks.BASELINE not in names or not names - {hooks.BASELINE, PLAN}:
            raise FieldProblem("search.plan", f"a plan mixes {hooks.BASELINE} with the other hooks of search.hooks; "
                                              f"allowed: search.hooks with {hooks.BASELINE} and at least one other")
        if cfg.tracking.timeline_steps == 0:
            raise FieldProblem("search.plan", "the plan is designed from the trials' step timelines, and "
                                              "tracking.timeline_steps is 0; allowed: 1 or more")


class ReportConfig(BaseModel):
    model_config = STRICT

    target_tolerance: float = Field(DEFAULT_TARGET_TOLERANCE, gt=0, le=1, description="time to target: the eval loss "
                                    "target is allreduce's final eval loss times 1 + this; also the "
                                    "quality gap a configuration may have and still match it")
    project: ProjectCells = Field(default_factory=ProjectCells, description="the cells of the projected time to "
                                  "target (projection.csv, the report's table)")
    cluster: ClusterCell | None = Field(None, description="the cluster you will train on: the headline answers for it")


class NetworkConfig(BaseModel):
    """Emulated hosts joined by shaped links (service/network/netem.py): every rank of a trial on its
    own network namespace, DDP's traffic over a tc-shaped veth link. Needs root (CAP_NET_ADMIN)."""

    model_config = STRICT

    link_gbps: list[float] = Field(min_length=1, description="each host's link rate, Gbit/s; a list is a sweep axis")
    latency_ms: float = Field(0.0, ge=0, le=MAX_LATENCY_MS,
                              description="delay added to each host's egress (tc netem), ms; 0 = the veth path's own")
    timing_steps: int = Field(30, ge=1, le=MAX_STEPS,
                              description="with several links: each link's timing run trains this many steps (the "
                                          "quality run, once per configuration, world size and seed, trains them all "
                                          "on loopback); used when it trains fewer steps than a full run per link")
    # opt-in: without it the ranks share the machine's cores as before; on by default it would
    # slow every W = 2 network sweep to a share below a core and refuse machines whose cgroups are
    # read-only (most unprivileged containers), which today run network: sweeps
    host_cpus: Union[float, Literal["auto"], None] = Field(
        None, description="cores per emulated host (a CPU cgroup quota on each rank's process): 'auto' = what the "
                          "machine gives every host of the sweep's largest world size, headroom kept for Ray and the "
                          "links; unset = the ranks share the machine's cores")

    _scalar_allowed = field_validator("link_gbps", mode="before")(scalar_to_list)

    @field_validator("host_cpus", mode="before")
    @classmethod
    def _share(cls, cpus):  # before pydantic: one problem, not one per member of the union
        if cpus is None or cpus == "auto":
            return cpus
        if isinstance(cpus, bool) or not isinstance(cpus, (int, float)):
            raise FieldProblem("", f"{short_value(cpus)} is not allowed; cores per host (a number) or auto")
        if not MIN_HOST_CPUS <= cpus <= MAX_HOST_CPUS:
            raise FieldProblem("", f"{cpus:g} is not allowed; a host has {MIN_HOST_CPUS:g} to {MAX_HOST_CPUS:g} cores")
        return float(cpus)

    @field_validator("link_gbps")
    @classmethod
    def _rates(cls, rates: list[float]) -> list[float]:
        check_axis(rates, lambda rate: 0 < rate <= MAX_LINK_GBPS,
                    f"a link rate is above 0 and at most {MAX_LINK_GBPS:g} Gbit/s")
        if len(set(rates)) != len(rates):
            raise FieldProblem("", f"{short_value(rates)} lists a rate twice; each value runs once")
        return rates

    def splits(self, steps: int) -> bool:
        """Train quality once and time each link (the losses do not depend on the link): with
        several links, when one full run plus a timing run per link trains fewer steps than a
        full run per link."""
        links = len(self.link_gbps)
        return links > 1 and steps + links * self.timing_steps < links * steps
