"""The sweep config's schema (pydantic, strict): the search (hooks, axes, seeds), the whole
SweepConfig with its cross-section checks, and the trial grid it expands into
(``SweepConfig.trials``); the workload section is in workload.py, the plainer ones in sections.py."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from typing import Annotated, Any, Union

from pydantic import (BaseModel, Discriminator, Field, Tag, ValidationInfo, field_validator,
                      model_validator)

from service.config import sharding
from service.config.compiled import compile_refusals
from service.config.periodic import periodic_refusals
from service.config.errors import FieldProblem, exception_text
from service.config.limits import (DDP_BUCKET_CAP_MB, MAX_ADAPTIVE_SEEDS, MAX_BUCKET_CAP_MB, MAX_SEED, MAX_TRIALS,
                                   MAX_WORLD_SIZE)
from service.config.sections import (STRICT, CheckpointConfig, Fault, NetworkConfig, PlanRound, ReportConfig, ResourcesConfig,
                                     StopConfig, TrackingConfig, check_axis, no_repeats, scalar_to_list)
from service.config.trial import KNOBS, Parallelism, Scalar, TrialSpec
from service.config.workload import WorkloadConfig
from service.text import did_you_mean, short_value


_SCALAR_VALUES = "a parameter is a number, bool or string, or a list of them"


class HookEntry(BaseModel):
    """One line of `search.hooks`: a hook name, or {name, param: value-or-list-of-values}. A
    value may be a mapping where the hook's parameter takes one (a plan's buckets): the hook
    reads it into its canonical text, one value like any other."""

    model_config = STRICT

    name: str = Field(min_length=1)
    params: dict[str, tuple[Scalar, ...]] = Field(default_factory=dict)  # every value as a sweep list

    @model_validator(mode="before")
    @classmethod
    def _from_yaml_shape(cls, raw: Any) -> Any:
        if isinstance(raw, str):
            return {"name": raw, "params": {}}
        if not isinstance(raw, dict):
            raise ValueError(
                f"a hook entry is a hook name or a mapping {{name: ..., param: value}}, got {short_value(raw)}"
            )
        if "name" not in raw:
            raise FieldProblem("name", "missing: every hook entry needs a name")
        if set(raw) == {"name", "params"} and isinstance(raw["params"], dict):
            raw = {"name": raw["name"], **raw["params"]}  # model_dump()'s shape: round trips through Ray
        params = {}
        for key, value in raw.items():
            if key == "name":
                continue
            if not isinstance(key, str):
                raise FieldProblem(str(key), "a hook parameter's name must be a string")
            values = list(value) if isinstance(value, (list, tuple)) else [value]
            values = [_structured(raw["name"], key, v) if isinstance(v, dict) else v for v in values]
            if not values:
                raise FieldProblem(key, "an empty list sweeps nothing; give a value or a list of values")
            for v in values:
                if not isinstance(v, (bool, int, float, str)) or (isinstance(v, float) and not math.isfinite(v)):
                    raise FieldProblem(key, f"{short_value(v)} is not allowed; {_SCALAR_VALUES}")
            if len(set(map(repr, values))) != len(values):
                raise FieldProblem(key, f"the list {short_value(values)} repeats a value")
            params[key] = tuple(values)
        return {"name": raw["name"], "params": params}

    @model_validator(mode="after")
    def _known_hook_and_params(self) -> "HookEntry":
        import hooks  # imported late: it pulls in torch

        known = _known_hook(self.name).params
        sharded = sharding.form_parameters(self.name)  # what only its sharded form takes (fsdp's)
        n_combos = math.prod(len(v) for v in self.params.values())
        if n_combos > MAX_TRIALS:  # before building them: lists multiply
            raise FieldProblem(next(iter(self.params)), f"the parameter lists make {n_combos} combinations; "
                                                        f"allowed: at most {MAX_TRIALS} trials in all")
        for key, values in self.params.items():
            if key not in sharded:
                _known_param(self.name, known, key)
            for value in values:
                _validate_hook(self.name, {key: value}, field=key)
        for combo in self.combos():
            _validate_hook(self.name, combo, field=None)
        return self

    def combos(self) -> list[dict[str, Scalar]]:
        """Every combination of this entry's parameter values, in the order the YAML lists them."""
        keys = list(self.params)
        return [dict(zip(keys, values)) for values in itertools.product(*(self.params[k] for k in keys))]


def _known_hook(name: Any):
    """The registered spec of hook ``name``; FieldProblem naming the hooks otherwise."""
    import hooks  # imported late: it pulls in torch

    available = hooks.available()
    if not isinstance(name, str) or name not in available:
        raise FieldProblem("name", f"unknown hook {name!r}{did_you_mean(str(name), available)}; "
                                   f"allowed: {', '.join(available)}")
    return available[name]


def _known_param(hook: str, known: dict, key: str) -> None:
    if key not in known:
        allowed = ", ".join(known) if known else f"none ({hook} takes no parameters)"
        raise FieldProblem(key, f"unknown parameter of {hook}{did_you_mean(key, known)}; allowed: {allowed}")


def _structured(hook: Any, key: str, value: dict) -> Scalar:
    """A mapping given as one value of parameter ``key``: where the hook's ``Param`` takes one,
    it reads it into its canonical scalar form; FieldProblem naming the problem otherwise."""
    spec = _known_hook(hook)
    _known_param(hook, spec.params, key)
    param = spec.parameters[key]
    if not param.ok(value):
        raise FieldProblem(key, f"{short_value(value)} is not allowed; {_SCALAR_VALUES}")
    try:
        canonical = param.checked(hook, key, value)
    except Exception as exc:  # the library promises ValueError; anything else still gets one line
        raise FieldProblem(key, exception_text(exc)) from None
    if not isinstance(canonical, (bool, int, float, str)):
        raise FieldProblem(key, f"{short_value(value)} is not allowed; {_SCALAR_VALUES}")
    return canonical


def _validate_hook(name: str, params: dict[str, Scalar], *, field: str | None,
                   parallelism: str | None = None) -> dict[str, Scalar]:
    """The full parameters under ``parallelism`` (None: fsdp where ``params`` set a parameter only
    the hook's sharded form takes, else ddp)."""
    if parallelism is None:
        parallelism = "fsdp" if sharding.sharded_only(name, params) else "ddp"
    try:
        return sharding.validate(name, params, parallelism)
    except Exception as exc:  # the library promises ValueError; anything else still gets one line
        raise FieldProblem(field or "", exception_text(exc)) from None


class SeedRange(BaseModel):
    """Adaptive seeds (service/sweep/adaptive.py): every configuration at ``min`` seeds, then one
    more at a time for those whose quality verdict is undecided, up to ``max``; the seeds are
    0 to max - 1."""

    model_config = STRICT

    min: int = Field(ge=2, le=MAX_ADAPTIVE_SEEDS, description="seeds every configuration runs (an interval needs 2)")
    max: int = Field(ge=2, le=MAX_ADAPTIVE_SEEDS, description="seeds an undecided configuration may get")

    @model_validator(mode="after")
    def _ordered(self) -> "SeedRange":
        if self.max < self.min:
            raise FieldProblem("max", f"{self.max} is below min {self.min}; allowed: {self.min} to {MAX_ADAPTIVE_SEEDS}")
        return self


class SearchConfig(BaseModel):
    model_config = STRICT

    hooks: list[HookEntry] = Field(min_length=1)
    world_size: list[int] = Field(min_length=1)
    # a list of seeds (a fixed grid), or {min, max}: adaptive seeds (pydantic tags the form it tried)
    seed: Annotated[Union[Annotated[list[int], Tag("list")], Annotated[SeedRange, Tag("range")]],
                    Discriminator(lambda v: "range" if isinstance(v, (dict, SeedRange)) else "list")] = Field(
        default_factory=lambda: [0], description="a list of seeds (a fixed grid), or {min, max}: adaptive seeds")
    # DDP's knobs: how the gradient is cut into buckets, each a hook call
    bucket_cap_mb: list[float] = Field(default_factory=lambda: [DDP_BUCKET_CAP_MB], min_length=1,
                                       description="DDP's bucket size cap, MiB (25: DDP's default)")
    gradient_as_bucket_view: list[bool] = Field(default_factory=lambda: [False], min_length=1)
    static_graph: list[bool] = Field(default_factory=lambda: [False], min_length=1)
    # whether the trials compile the module inside their DDP wrapper (hook and reducer stay eager);
    # left out: workload.compile's (SweepConfig fills it in)
    compile: list[bool] = Field(default_factory=lambda: [False], min_length=1,
                                description="torch.compile the module inside DDP: [false], [true] or both "
                                            "(default: as workload.compile says)")
    # how the ranks hold the model: ddp (DDP, the hook as a comm hook) and/or fsdp (FSDP2, the
    # hook's sharded form: service/config/sharding.py)
    parallelism: list[Parallelism] = Field(default_factory=lambda: ["ddp"], min_length=1,
                                           description="ddp, fsdp or both: DDP or FSDP2 (sharded) trials")
    plan: PlanRound | None = Field(None, description="after the trials, design a per-bucket plan for a cell and "
                                   "train it as one more configuration (a last round); absent: no plan round")

    _scalar_allowed = field_validator("world_size", "bucket_cap_mb", "gradient_as_bucket_view",
                                      "static_graph", "compile", "parallelism", mode="before")(scalar_to_list)

    @field_validator("seed", mode="before")
    @classmethod
    def _seed_list_or_range(cls, value: Any) -> Any:
        return value if isinstance(value, dict) else scalar_to_list(value)

    @field_validator("bucket_cap_mb")
    @classmethod
    def _bucket_caps(cls, caps: list[float]) -> list[float]:
        check_axis(caps, lambda cap: 0 < cap <= MAX_BUCKET_CAP_MB,
                    f"a bucket cap is above 0 and at most {MAX_BUCKET_CAP_MB:g} MiB (DDP's default: "
                    f"{DDP_BUCKET_CAP_MB:g})")
        if len(set(caps)) != len(caps):
            raise FieldProblem("", f"{short_value(caps)} lists a cap twice; each value runs once")
        return caps

    @field_validator("gradient_as_bucket_view", "static_graph", "compile", "parallelism")
    @classmethod
    def _flags(cls, values: list[bool]) -> list[bool]:
        if len(set(values)) != len(values):
            raise FieldProblem("", f"{short_value(values)} lists a value twice; each value runs once")
        return values

    def ddp_knobs(self) -> list[dict[str, Any]]:
        """Every combination of the DDP axes and compile, in the order the config lists them."""
        return [{"bucket_cap_mb": cap, "gradient_as_bucket_view": view, "static_graph": static, "compile": compiled}
                for cap in self.bucket_cap_mb for view in self.gradient_as_bucket_view
                for static in self.static_graph for compiled in self.compile]

    @field_validator("world_size", "seed")
    @classmethod
    def _in_range(cls, values, info: ValidationInfo):
        if isinstance(values, SeedRange):
            return values
        if not values:
            raise FieldProblem("", "an empty list runs nothing; allowed: at least one value")
        low, high, what = _AXIS_RANGES[info.field_name]
        check_axis(values, lambda v: low <= v <= high, f"{what} is {low} to {high}")
        no_repeats(values)
        return values

    @property
    def adaptive(self) -> SeedRange | None:
        """The seed range when seeds are adaptive; None for a fixed list."""
        return self.seed if isinstance(self.seed, SeedRange) else None

    @property
    def seeds(self) -> list[int]:
        """Every seed a trial may run with: the list, or 0 to max - 1."""
        return list(range(self.seed.max)) if isinstance(self.seed, SeedRange) else list(self.seed)


_AXIS_RANGES = {"world_size": (1, MAX_WORLD_SIZE, "a world size"), "seed": (0, MAX_SEED, "a seed")}


class SweepConfig(BaseModel):
    model_config = STRICT

    name: str = Field(min_length=1, max_length=200, description="MLflow experiment name")
    workload: WorkloadConfig
    search: SearchConfig
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    stop: StopConfig = Field(default_factory=StopConfig)
    faults: list[Fault] = Field(default_factory=list)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    storage_path: str | None = Field(None, min_length=1, description="Ray Tune/Train storage: local dir, shared fs or s3://")
    network: NetworkConfig | None = Field(None, description="emulated hosts on shaped links; absent: the ordinary network")

    @model_validator(mode="before")
    @classmethod
    def _compile_axis_from_workload(cls, raw: Any) -> Any:
        """search.compile left out: every trial compiles exactly when workload.compile is not false."""
        search, workload = (raw.get("search"), raw.get("workload")) if isinstance(raw, dict) else (None, None)
        if not isinstance(search, dict) or "compile" in search or not isinstance(workload, dict):
            return raw
        return {**raw, "search": {**search, "compile": [workload.get("compile", False) is not False]}}

    @field_validator("name")
    @classmethod
    def _printable_name(cls, name: str) -> str:
        if not name.strip() or any(not ch.isprintable() for ch in name):
            raise ValueError(f"{name!r} is not allowed; an experiment name is printable text on one line")
        return name

    @model_validator(mode="after")
    def _consistent(self) -> "SweepConfig":
        wl = self.workload
        per_step = wl.grad_accumulation
        for world in self.search.world_size:
            if wl.global_batch_size % (world * per_step):
                raise FieldProblem(
                    "workload.global_batch_size",
                    f"{wl.global_batch_size} does not split into world_size {world} x grad_accumulation "
                    f"{per_step} equal micro-batches; allowed: a multiple of {_lcm_of_splits(self)}",
                )
        largest = max(self.search.world_size)
        for i, fault in enumerate(self.faults):
            if fault.rank >= largest:
                raise FieldProblem(f"faults[{i}].rank", f"rank {fault.rank} never exists: the largest world size "
                                                         f"is {largest}; allowed: 0 to {largest - 1}")
            if fault.step > wl.steps:
                raise FieldProblem(f"faults[{i}].step", f"step {fault.step} never runs: trials stop after "
                                                         f"{wl.steps} steps; allowed: 1 to {wl.steps}")
        if True in self.search.static_graph and per_step > 1:
            raise FieldProblem("search.static_graph", f"true with grad_accumulation {per_step}: PyTorch's DDP fails "
                                                       "under no_sync with static_graph (an expect_autograd_hooks_ "
                                                       "assert, pytorch/pytorch#143580); allowed: static_graph "
                                                       "false, or grad_accumulation 1")
        if True in self.search.compile:
            compile_refusals(self)
        periodic_refusals(self)
        sharding.fsdp_refusals(self)
        if self.network is not None and self.resources.use_gpu:
            raise FieldProblem("network", "emulated links carry gloo's (CPU) traffic between namespaces; "
                                          "NCCL would bypass them: set resources.use_gpu: false or remove network:")
        if self.splits_links and self.network.timing_steps <= wl.warmup_steps:
            raise FieldProblem("network.timing_steps", f"{self.network.timing_steps} leaves no step after the "
                                                       f"{wl.warmup_steps} warm-up steps to time; allowed: "
                                                       f"{wl.warmup_steps + 1} or more")
        if self.checkpoint.every > wl.steps:
            raise FieldProblem("checkpoint.every", f"{self.checkpoint.every} is more than the {wl.steps} steps, "
                                                   f"so no checkpoint would be taken; allowed: 0 (off) to {wl.steps}")
        if self.search.plan is not None:
            self.search.plan.check(self)
        n_combos = sum(math.prod(len(v) for v in e.params.values()) for e in self.search.hooks)
        n_links = len(self.network.link_gbps) if self.network is not None else 1
        n_knobs = len(self.search.ddp_knobs())
        n_trials = n_combos * n_knobs * len(self.search.parallelism) * len(self.search.world_size) * len(self.search.seeds) * n_links
        if n_trials > MAX_TRIALS:
            raise FieldProblem("search", f"the grid has {n_trials} trials; allowed: at most {MAX_TRIALS}")
        seen: dict[str, int] = {}
        for i, entry in enumerate(self.search.hooks):
            for combo in entry.combos():
                key = _trial_key_prefix(entry.name, combo)
                if key in seen and seen[key] != i:
                    raise FieldProblem(f"search.hooks[{i}]", f"repeats the trials of search.hooks[{seen[key]}] "
                                                             f"({key}); each hook configuration runs once")
                seen[key] = i
        return self

    def fingerprint(self) -> str:
        """A short hash of everything that decides what the trials compute (not how fast, where
        they run or how often they flush): ``--resume`` only continues a sweep of the same one."""
        # search.plan is left out too: its round adds trials designed from the recorded ones and
        # changes none of them, so a finished sweep given search.plan resumes into its plan round
        decisive = self.model_dump(mode="json", exclude={"resources": {"cpus_per_worker", "max_concurrent_trials"},
                                                         "search": {"plan"},
                                                         "tracking": {"flush_seconds", "paired_timing_every",
                                                                      "timeline_steps", "transport_probe"},
                                                         "storage_path": True,
                                                         "report": True})
        for section, key in _ADDED_WITH_DEFAULTS:  # at their defaults: a sweep started before they existed resumes
            if decisive[section][key] == _ADDED_WITH_DEFAULTS[section, key]:
                del decisive[section][key]
        if self.network is not None and not self.splits_links:  # no timing runs: it decides nothing
            del decisive["network"]["timing_steps"]
        return hashlib.sha256(json.dumps(decisive, sort_keys=True).encode()).hexdigest()[:16]

    def trials(self) -> list[TrialSpec]:
        """The grid (adaptive seeds: every configuration at every seed up to max), in run
        order: world size x link (network.link_gbps, when set) x seed, and within each of
        those the configurations (hook entries as listed x parameter combos x DDP's knobs:
        bucket_cap_mb x gradient_as_bucket_view x static_graph) rotated by one place per block,
        so no configuration's trials cluster at one end of the sweep: a machine busier for a
        while then slows every configuration's trials, not one's."""
        configurations = [(entry.name, _validate_hook(entry.name, combo, field=None, parallelism=p), knobs, p)
                          for entry in self.search.hooks for combo in entry.combos()
                          for p in sharding.parallelisms(self.search, entry.name, combo)
                          for knobs in self.search.ddp_knobs()]
        out, named = [], tuple(k for k in KNOBS if len(getattr(self.search, k)) > 1)  # the knobs it varies
        for i, (world, link, seed, kind) in enumerate(self._blocks()):
            turn = i % len(configurations)
            for hook, full, knobs, parallelism in configurations[turn:] + configurations[:turn]:
                out.append(TrialSpec(hook=hook, hook_params=full, world_size=world, seed=seed, link_gbps=link,
                                     kind=kind, named_knobs=named, parallelism=parallelism, **knobs))
        return out

    @property
    def splits_links(self) -> bool:
        """Quality once, time per link (NetworkConfig.splits): a quality run per configuration,
        world size and seed, and a timing run per link."""
        return self.network is not None and self.network.splits(self.workload.steps)

    def _blocks(self) -> list[tuple[int, float | None, int, str]]:
        """(world size, link, seed, run kind) of each block of trials, in run order. Split: per
        world size the quality runs (loopback, every seed), then a timing run per link (at the
        first seed: a step's time does not depend on it)."""
        world_sizes, seeds = self.search.world_size, self.search.seeds
        if not self.splits_links:
            links = self.network.link_gbps if self.network is not None else [None]
            return [(w, link, s, "full") for w, link, s in itertools.product(world_sizes, links, seeds)]
        return [block for w in world_sizes
                for block in [(w, None, s, "quality") for s in seeds]
                + [(w, link, seeds[0], "timing") for link in self.network.link_gbps]]

    def run_config(self, trial: TrialSpec) -> "SweepConfig":
        """The config ``trial`` trains with: the sweep's, but a timing run stops after
        network.timing_steps steps (its one eval at the end, no faults: it measures step times)."""
        if trial.kind != "timing":
            return self
        steps = self.network.timing_steps
        return self.model_copy(update={"workload": self.workload.model_copy(update={"steps": steps,
                                                                                    "eval_every": steps}),
                                       "faults": []})


# Settings added after sweeps were recorded, with the value that means what those sweeps ran (so --resume
# and the report read an older sweep as what it was).
_ADDED_WITH_DEFAULTS = {("workload", "find_unused_parameters"): "auto", ("workload", "broadcast_buffers"): True,
                        ("search", "bucket_cap_mb"): [DDP_BUCKET_CAP_MB], ("search", "gradient_as_bucket_view"): [False],
                        ("search", "static_graph"): [False], ("workload", "compile"): False,
                        ("search", "compile"): [False], ("search", "parallelism"): ["ddp"], ("workload", "shard"): None}


def _trial_key_prefix(hook: str, combo: dict[str, Scalar]) -> str:
    full = _validate_hook(hook, combo, field=None)
    return TrialSpec(hook=hook, hook_params=full, world_size=1, seed=0).config_key


def _lcm_of_splits(cfg: SweepConfig) -> int:
    return math.lcm(*(w * cfg.workload.grad_accumulation for w in cfg.search.world_size))
