"""WHERE THE YAML IS VALIDATED: the sweep's typed configuration, its presets and its trial grid.

    cfg, path = load_config("tune_configs/quant.yaml")   # or a preset name: "quant", "configs/quant.yaml"
    for trial in cfg.trials():                            # hooks x parameter combos x world_size x seed
        print(trial.describe())

Everything a user can get wrong in a config file is caught here, before Ray starts or MLflow is
touched, and reported as one `ConfigError` line that names the field, the problem and what is
allowed. `load_config` lets nothing else escape (a hypothesis test holds it to that), because the
CLI turns ConfigError into exit status 2 and anything else would be a traceback in a user's face.

The hook names and parameters come from the hooks library (`hooks.available()`,
`hooks.validate()`), and workload names from `service.workloads.check_workload()`, so this module
never keeps a second list of either.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import math
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Union, get_args, get_origin

import yaml
from pydantic import (BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, ValidationInfo,
                      field_validator, model_validator)

from service.text import count, one_line

PRESETS_DIR = Path(__file__).resolve().parent.parent / "tune_configs"

# Upper bounds that no sensible sweep reaches: they turn a typo (an extra zero or three) into a
# clear error instead of a sweep that runs for a month or a batch that exhausts memory.
MAX_STEPS = 1_000_000
MAX_GLOBAL_BATCH = 1_048_576
MAX_GRAD_ACCUMULATION = 1024
MAX_WORLD_SIZE = 1024
MAX_SEED = 2**32 - 1
MAX_LR = 10.0
MAX_TRIALS = 10_000
MAX_FILE_BYTES = 1_000_000
# A config is a few dozen values; YAML aliases can expand a small file into billions of nodes.
MAX_YAML_NODES = 100_000

Scalar = Union[bool, int, float, str]


MAX_SHOWN_PROBLEMS = 10  # a config with more problems than this was not written for this tool


class ConfigError(Exception):
    """A config the sweep cannot run. str() is a single line: where, what is wrong, what is allowed
    (and which other fields have problems); ``lines()`` is every problem in full, a line each."""

    def __init__(self, message: str, *, field: str | None = None, source: str | Path | None = None,
                 more: list[tuple[str, str]] | None = None):
        self.problem = one_line(message)
        self.field = field
        self.source = str(source) if source is not None else None
        self.more = list(more or [])  # the other problems: (field, problem)
        summary = ""
        if self.more:
            fields = [f for f, _ in self.more]
            shown = ", ".join(fields[:3]) + (", ..." if len(fields) > 3 else "")
            summary = f" (and {count(len(fields), 'more problem')}: {shown})"
        super().__init__(self._line(field, self.problem + summary))

    def _line(self, field: str | None, problem: str) -> str:
        return ": ".join([p for p in (self.source, field) if p] + [problem])

    def lines(self) -> list[str]:
        """Every problem in full, one line each: at most MAX_SHOWN_PROBLEMS, then a count of the rest."""
        every = [self._line(self.field, self.problem)] + [self._line(f, one_line(p)) for f, p in self.more]
        shown = every[:MAX_SHOWN_PROBLEMS]
        hidden = len(every) - len(shown)
        return shown + ([f"... and {count(hidden, 'more problem')}"] if hidden else [])


class FieldProblem(ValueError):
    """Raised inside validators: `field` is relative to the model being validated.

    pydantic keeps the exception in the error's ctx, so the formatter can append `field` to the
    error's location and report e.g. `search.hooks[2].chunk_size` rather than `search.hooks[2]`.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(message)


# --------------------------------------------------------------------------------------------
# The schema. Strict types: YAML already yields ints, floats, bools and strings, so "300" for a
# step count is a mistake worth naming, not something to coerce.

_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


class WorkloadConfig(BaseModel):
    model_config = _STRICT

    name: str = Field(min_length=1, description="built-in workload or 'package.module:function'")
    steps: int = Field(ge=1, le=MAX_STEPS, description="optimizer steps per trial")
    global_batch_size: int = Field(ge=1, le=MAX_GLOBAL_BATCH, description="held fixed across world sizes; "
                                   "default: the workload's (service.workloads.training_defaults)")
    grad_accumulation: int = Field(1, ge=1, le=MAX_GRAD_ACCUMULATION, description="micro-batches per step")
    lr: float = Field(gt=0, le=MAX_LR, description="default: the workload's for the optimizer")
    optimizer: Literal["sgd", "adamw"] = "sgd"
    eval_every: int = Field(50, ge=1, le=MAX_STEPS, description="steps between evaluations")
    warmup_steps: int = Field(5, ge=0, le=MAX_STEPS, description="first steps, excluded from throughput")
    # Training realism (service/training_options.py says what each does, and where).
    precision: Literal["fp32", "bf16_autocast", "bf16"] = Field(
        "fp32", description="fp32 | bf16_autocast (fp32 weights, bf16 forward) | bf16 (bf16 weights and DDP buckets)")
    grad_clip_norm: float | None = Field(None, gt=0, le=1e6, description="clip the averaged gradient's L2 norm; null = off")
    lr_schedule: Literal["constant", "cosine"] = "constant"
    lr_warmup_steps: int = Field(0, ge=0, le=MAX_STEPS, description="linear LR warm-up steps (not warmup_steps)")

    @model_validator(mode="before")
    @classmethod
    def _workload_defaults(cls, raw: Any) -> Any:
        """A config may leave out global_batch_size and lr: the workload's own fill them in."""
        if not isinstance(raw, dict) or ("global_batch_size" in raw and "lr" in raw):
            return raw
        name, optimizer = raw.get("name"), raw.get("optimizer", "sgd")
        if not isinstance(name, str) or not isinstance(optimizer, str):
            return raw  # the field validators name the problem
        from service.workloads import training_defaults  # imported late: it pulls in torch

        return {**training_defaults(name, optimizer), **raw}

    @field_validator("name")
    @classmethod
    def _known_workload(cls, name: str) -> str:
        from service.workloads import check_workload  # imported late: it pulls in torch

        try:
            check_workload(name)
        except Exception as exc:  # a user's module may raise anything while it imports
            raise ValueError(_exception_text(exc)) from None
        return name

    @model_validator(mode="after")
    def _some_steps_are_measured(self) -> "WorkloadConfig":
        if self.warmup_steps >= self.steps:
            default = "" if "warmup_steps" in self.model_fields_set else " (the default)"
            raise FieldProblem(
                "warmup_steps",
                f"{self.warmup_steps} warm-up steps{default} leave none of the {self.steps} steps to "
                f"measure throughput on; allowed: 0 to {self.steps - 1}",
            )
        if self.lr_warmup_steps > self.steps:
            raise FieldProblem("lr_warmup_steps", f"{self.lr_warmup_steps} is more than the {self.steps} steps; "
                                                  f"allowed: 0 to {self.steps}")
        return self


class HookEntry(BaseModel):
    """One line of `search.hooks`: a hook name, or {name, param: value-or-list-of-values}."""

    model_config = _STRICT

    name: str = Field(min_length=1)
    params: dict[str, tuple[Scalar, ...]] = Field(default_factory=dict)  # every value as a sweep list

    @model_validator(mode="before")
    @classmethod
    def _from_yaml_shape(cls, raw: Any) -> Any:
        if isinstance(raw, str):
            return {"name": raw, "params": {}}
        if not isinstance(raw, dict):
            raise ValueError(
                f"a hook entry is a hook name or a mapping {{name: ..., param: value}}, got {_short(raw)}"
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
            if not values:
                raise FieldProblem(key, "an empty list sweeps nothing; give a value or a list of values")
            for v in values:
                if not isinstance(v, (bool, int, float, str)) or (isinstance(v, float) and not math.isfinite(v)):
                    raise FieldProblem(
                        key, f"{_short(v)} is not allowed; a parameter is a number, bool or string, or a list of them"
                    )
            if len(set(map(repr, values))) != len(values):
                raise FieldProblem(key, f"the list {_short(values)} repeats a value")
            params[key] = tuple(values)
        return {"name": raw["name"], "params": params}

    @model_validator(mode="after")
    def _known_hook_and_params(self) -> "HookEntry":
        import hooks  # imported late: it pulls in torch

        available = hooks.available()
        if self.name not in available:
            raise FieldProblem("name", f"unknown hook {self.name!r}{_did_you_mean(self.name, available)}; "
                                       f"allowed: {', '.join(available)}")
        known = available[self.name].params
        n_combos = math.prod(len(v) for v in self.params.values())
        if n_combos > MAX_TRIALS:  # before building them: lists multiply
            raise FieldProblem(next(iter(self.params)), f"the parameter lists make {n_combos} combinations; "
                                                        f"allowed: at most {MAX_TRIALS} trials in all")
        for key, values in self.params.items():
            if key not in known:
                allowed = ", ".join(known) if known else f"none ({self.name} takes no parameters)"
                raise FieldProblem(key, f"unknown parameter of {self.name}{_did_you_mean(key, known)}; "
                                        f"allowed: {allowed}")
            for value in values:
                _validate_hook(self.name, {key: value}, field=key)
        for combo in self.combos():
            _validate_hook(self.name, combo, field=None)
        return self

    def combos(self) -> list[dict[str, Scalar]]:
        """Every combination of this entry's parameter values, in the order the YAML lists them."""
        keys = list(self.params)
        return [dict(zip(keys, values)) for values in itertools.product(*(self.params[k] for k in keys))]


def _validate_hook(name: str, params: dict[str, Scalar], *, field: str | None) -> dict[str, Scalar]:
    import hooks

    try:
        return dict(hooks.validate(name, **params))
    except Exception as exc:  # the library promises ValueError; anything else still gets one line
        raise FieldProblem(field or "", _exception_text(exc)) from None


def _scalar_to_list(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


MAX_ADAPTIVE_SEEDS = 20


class SeedRange(BaseModel):
    """Adaptive seeds (service/sweep/adaptive.py): every configuration at ``min`` seeds, then one
    more at a time for those whose quality verdict is undecided, up to ``max``; the seeds are
    0 to max - 1."""

    model_config = _STRICT

    min: int = Field(ge=2, le=MAX_ADAPTIVE_SEEDS, description="seeds every configuration runs (an interval needs 2)")
    max: int = Field(ge=2, le=MAX_ADAPTIVE_SEEDS, description="seeds an undecided configuration may get")

    @model_validator(mode="after")
    def _ordered(self) -> "SeedRange":
        if self.max < self.min:
            raise FieldProblem("max", f"{self.max} is below min {self.min}; allowed: {self.min} to {MAX_ADAPTIVE_SEEDS}")
        return self


class SearchConfig(BaseModel):
    model_config = _STRICT

    hooks: list[HookEntry] = Field(min_length=1)
    world_size: list[int] = Field(min_length=1)
    seed: Annotated[Union[Annotated[list[int], Tag("list")], Annotated[SeedRange, Tag("range")]],
                    Discriminator(lambda v: "range" if isinstance(v, (dict, SeedRange)) else "list")] = Field(
        default_factory=lambda: [0], description="a list of seeds (a fixed grid), or {min, max}: adaptive seeds")

    _scalar_allowed = field_validator("world_size", mode="before")(_scalar_to_list)

    @field_validator("seed", mode="before")
    @classmethod
    def _seed_list_or_range(cls, value: Any) -> Any:
        return value if isinstance(value, dict) else _scalar_to_list(value)

    @field_validator("world_size", "seed")
    @classmethod
    def _in_range(cls, values, info: ValidationInfo):
        if isinstance(values, SeedRange):
            return values
        if not values:
            raise FieldProblem("", "an empty list runs nothing; allowed: at least one value")
        low, high, what = _AXIS_RANGES[info.field_name]
        _check_axis(values, lambda v: low <= v <= high, f"{what} is {low} to {high}")
        _no_repeats(values)
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


def _check_axis(values: list, ok: Callable[[Any], bool], allowed: str) -> None:
    """Each value of a sweep axis passes ``ok``; else a FieldProblem at the first that does not."""
    for i, v in enumerate(values):
        if not ok(v):
            raise FieldProblem(f"[{i}]", f"{v:g} is not allowed; {allowed}" if isinstance(v, float)
                               else f"{v} is not allowed; {allowed}")


def _no_repeats(values: list[int]) -> None:
    seen: set[int] = set()
    for i, v in enumerate(values):
        if v in seen:
            raise FieldProblem(f"[{i}]", f"{v} is listed twice; each value runs once")
        seen.add(v)


class ResourcesConfig(BaseModel):
    model_config = _STRICT

    cpus_per_worker: float = Field(1.0, gt=0, le=1024, description="logical CPUs per worker; fractional allowed")
    use_gpu: bool = Field(False, description="true: NCCL backend, one GPU per worker")
    max_concurrent_trials: int = Field(1, ge=1, le=1024)


class StopConfig(BaseModel):
    model_config = _STRICT

    on_nan: bool = Field(True, description="end a trial, all ranks together, at its first non-finite step")


class Fault(BaseModel):
    """A fault injected on purpose (issue 4): off unless the config lists one."""

    model_config = _STRICT

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
    model_config = _STRICT

    every: int = Field(0, ge=0, le=MAX_STEPS, description="steps between checkpoints; 0 = off")
    max_failures: int = Field(0, ge=0, le=100, description="restarts of a crashed trial from its last checkpoint")


class TrackingConfig(BaseModel):
    model_config = _STRICT

    flush_seconds: float = Field(5.0, gt=0, le=3600, description="how often rank 0 flushes metrics to MLflow")
    fidelity_every: int = Field(0, ge=0, le=MAX_STEPS, description="measure gradient fidelity (grad_rel_error, grad_cosine) on every bucket of every N-th optimizer step; 0 = off")
    paired_timing_every: int = Field(5, ge=0, le=MAX_STEPS, description="time the baseline hook beside the trial's own every N-th measured step (step_ratio_vs_baseline; service/paired_timing.py); 0 = off")


class ReportConfig(BaseModel):
    model_config = _STRICT

    target_tolerance: float = Field(0.01, gt=0, le=1, description="time to target: the eval loss "
                                    "target is allreduce's final eval loss times 1 + this; also the "
                                    "quality gap a configuration may have and still match it")


MAX_LINK_GBPS = 400.0
MAX_LATENCY_MS = 1000.0


class NetworkConfig(BaseModel):
    """Emulated hosts joined by shaped links (service/netem.py): every rank of a trial on its
    own network namespace, DDP's traffic over a tc-shaped veth link. Needs root (CAP_NET_ADMIN)."""

    model_config = _STRICT

    link_gbps: list[float] = Field(min_length=1, description="each host's link rate, Gbit/s; a list is a sweep axis")
    latency_ms: float = Field(0.0, ge=0, le=MAX_LATENCY_MS,
                              description="delay added to each host's egress (tc netem), ms; 0 = the veth path's own")

    _scalar_allowed = field_validator("link_gbps", mode="before")(_scalar_to_list)

    @field_validator("link_gbps")
    @classmethod
    def _rates(cls, rates: list[float]) -> list[float]:
        _check_axis(rates, lambda rate: 0 < rate <= MAX_LINK_GBPS,
                    f"a link rate is above 0 and at most {MAX_LINK_GBPS:g} Gbit/s")
        if len(set(rates)) != len(rates):
            raise FieldProblem("", f"{_short(rates)} lists a rate twice; each value runs once")
        return rates


class TrialSpec(BaseModel):
    """One trial of the grid. Passed through Ray as a plain dict (to_dict / from_dict)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    hook: str
    hook_params: dict[str, Union[Scalar, None]]  # full: defaults from hooks.validate included
    world_size: int = Field(ge=1)
    seed: int = Field(ge=0)
    link_gbps: float | None = None  # the emulated link (config network:), None: the ordinary network

    @property
    def run_name(self) -> str:
        """`{hook}-c{chunk_size}-w{world_size}-s{seed}`, the -c part only for hooks with a chunk size.

        Other parameters appear only when they differ from the hook's default (e.g. a swept
        PowerSGD rank: `powersgd-rank4-w2-s0`), so the names in a grid stay distinct.
        """
        parts = [self.hook]
        if "chunk_size" in self.hook_params:
            parts.append(f"c{self.hook_params['chunk_size']}")
        for key, value in self.non_default_params().items():
            if key == "chunk_size":
                continue
            if isinstance(value, bool):
                parts.append(key if value else f"no_{key}")
            else:
                parts.append(f"{key}{value}")
        parts += [f"w{self.world_size}", f"s{self.seed}"]
        if self.link_gbps is not None:  # last: the report reads the link from the param link_gbps
            parts.append(f"{self.link_gbps:g}gbps")
        return "-".join(parts)

    @property
    def config_label(self) -> str:
        """The configuration's label: the run name without world size, seed and link (e.g.
        quantization_perchannel-c512): one per configuration, shared by its trials."""
        return self.run_name.rpartition(f"-w{self.world_size}-s{self.seed}")[0] or self.run_name

    def non_default_params(self) -> dict[str, Any]:
        """The hook parameters that differ from the hook's defaults, plus chunk_size always
        (it names the configuration): what tables show."""
        defaults = _hook_defaults(self.hook)
        return {k: v for k, v in self.hook_params.items()
                if k == "chunk_size" or k not in defaults or defaults[k] != v}

    @property
    def key(self) -> str:
        """A stable identifier (every parameter spelled out): how --resume tells trials apart."""
        params = ",".join(f"{k}={self.hook_params[k]!r}" for k in sorted(self.hook_params))
        link = f"-l{self.link_gbps:g}" if self.link_gbps is not None else ""
        return f"{self.hook}[{params}]-w{self.world_size}-s{self.seed}{link}"

    def describe(self) -> str:
        """The --dry-run line: hook, its parameters, world size, seed."""
        params = " ".join(f"{k}={v}" for k, v in self.hook_params.items()) or "-"
        link = f" link_gbps={self.link_gbps:g}" if self.link_gbps is not None else ""
        return f"{self.hook:<26} {params:<40} world_size={self.world_size:<3} seed={self.seed}{link}"

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialSpec":
        return cls.model_validate(data)


def _hook_defaults(name: str) -> dict[str, Any]:
    import hooks

    spec = hooks.available().get(name)
    return spec.params if spec is not None else {}


class SweepConfig(BaseModel):
    model_config = _STRICT

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
        if self.network is not None and self.resources.use_gpu:
            raise FieldProblem("network", "emulated links carry gloo's (CPU) traffic between namespaces; "
                                          "NCCL would bypass them: set resources.use_gpu: false or remove network:")
        if self.checkpoint.every > wl.steps:
            raise FieldProblem("checkpoint.every", f"{self.checkpoint.every} is more than the {wl.steps} steps, "
                                                   f"so no checkpoint would be taken; allowed: 0 (off) to {wl.steps}")
        n_combos = sum(math.prod(len(v) for v in e.params.values()) for e in self.search.hooks)
        n_links = len(self.network.link_gbps) if self.network is not None else 1
        n_trials = n_combos * len(self.search.world_size) * len(self.search.seeds) * n_links
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
        decisive = self.model_dump(mode="json", exclude={"resources": {"cpus_per_worker", "max_concurrent_trials"},
                                                         "tracking": {"flush_seconds", "paired_timing_every"}, "storage_path": True,
                                                         "report": True})
        return hashlib.sha256(json.dumps(decisive, sort_keys=True).encode()).hexdigest()[:16]

    def trials(self) -> list[TrialSpec]:
        """The grid (adaptive seeds: every configuration at every seed up to max), in run
        order: world size x link (network.link_gbps, when set) x seed, and within each of
        those the configurations (hook entries as listed x parameter combos) rotated by one
        place per block, so no configuration's trials cluster at one end of the sweep: a
        machine busier for a while then slows every configuration's trials, not one's."""
        configurations = [(entry.name, _validate_hook(entry.name, combo, field=None))
                          for entry in self.search.hooks for combo in entry.combos()]
        links = self.network.link_gbps if self.network is not None else [None]
        blocks = [(world, link, seed) for world in self.search.world_size for link in links
                  for seed in self.search.seeds]
        out = []
        for i, (world, link, seed) in enumerate(blocks):
            turn = i % len(configurations)
            for hook, full in configurations[turn:] + configurations[:turn]:
                out.append(TrialSpec(hook=hook, hook_params=full, world_size=world, seed=seed, link_gbps=link))
        return out


def _trial_key_prefix(hook: str, combo: dict[str, Scalar]) -> str:
    full = _validate_hook(hook, combo, field=None)
    return TrialSpec(hook=hook, hook_params=full, world_size=1, seed=0).key.rsplit("-w", 1)[0]


def _lcm_of_splits(cfg: SweepConfig) -> int:
    return math.lcm(*(w * cfg.workload.grad_accumulation for w in cfg.search.world_size))


# --------------------------------------------------------------------------------------------
# Loading: path or preset name -> YAML (safe loader) -> SweepConfig, with every failure as one line.


def list_presets() -> list[str]:
    """Preset names (file stems in tune_configs/), sorted."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def resolve_config_path(arg: str | Path) -> Path:
    """An existing file, or a preset named by file name (`configs/quant.yaml`, `quant.yaml`, `quant`)."""
    text = str(arg)
    if not text.strip():
        raise ConfigError(f"no config given; give a YAML file or a preset: {', '.join(list_presets())}")
    path = Path(text).expanduser()
    if "\x00" not in text and path.exists():
        return path.resolve()
    stem = path.stem if path.suffix in (".yaml", ".yml") else path.name
    preset = PRESETS_DIR / f"{stem}.yaml"
    if stem and "\x00" not in text and preset.is_file():
        print(f"note: using the preset {_display(preset)} ({text} is not a file here)", file=sys.stderr)
        return preset.resolve()
    raise ConfigError(f"no such file, and not a preset name; presets: {', '.join(list_presets())}", source=text)


def load_config(arg: str | Path) -> tuple[SweepConfig, Path]:
    """Read, parse and validate a sweep config. Raises ConfigError (one line) and nothing else."""
    try:
        return _load(arg)
    except ConfigError:
        raise
    except Exception as exc:  # a bug of ours must still reach the user as one line, not a traceback
        raise ConfigError(f"could not load the config ({_exception_text(exc)})", source=str(arg)) from exc


def _load(arg: str | Path) -> tuple[SweepConfig, Path]:
    path = resolve_config_path(arg)
    shown = _display(path)
    if path.is_dir():
        raise ConfigError("is a directory; give a YAML file", source=shown)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read it ({exc.strerror or exc})", source=shown) from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"is {len(data)} bytes; a config is at most {MAX_FILE_BYTES}", source=shown)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"is not UTF-8 text (byte {exc.start})", source=shown) from None
    raw = _parse_yaml(text, shown)
    if raw is None:
        raise ConfigError("is empty; a config needs at least name, workload and search", source=shown)
    if not isinstance(raw, dict):
        raise ConfigError(f"the top level must be a mapping (name:, workload:, search:, ...), "
                          f"got {_type_name(raw)}", source=shown)
    try:
        cfg = SweepConfig.model_validate(raw)
    except ValidationError as exc:
        (field, problem), *more = _all_problems(exc)
        raise ConfigError(problem, field=field or "(top level)", source=shown, more=more) from None
    return cfg, path


# libyaml's safe loader when PyYAML was built with it: a C parser, and it caps nesting depth
# (the pure-Python parser takes seconds to reach a RecursionError on `[[[[...`).
_SafeBase = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _SafeLoaderNoDuplicates(_SafeBase):  # type: ignore[misc, valid-type]
    """A safe loader that refuses a key given twice (plain PyYAML silently keeps the last one)."""


def _construct_mapping(loader: Any, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may be overridden: not a duplicate
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # unhashable key: let the constructor produce its usual error
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_SafeLoaderNoDuplicates.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# PyYAML follows YAML 1.1, where `1.0e6` and `1e-3` are strings (the exponent needs a sign and the
# mantissa a dot). Users write them as numbers (issue 4's own example does), so read them as YAML
# 1.2 does.
_SafeLoaderNoDuplicates.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                  |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def _parse_yaml(text: str, shown: str) -> Any:
    try:
        raw = yaml.load(text, Loader=_SafeLoaderNoDuplicates)  # a SafeLoader: no Python objects built
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        what = exc.problem or exc.context or "invalid YAML"
        # the constructor sees well-formed YAML it will not build (a duplicate key, a python tag)
        label = "YAML error" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax error"
        raise ConfigError(f"{label} at {where}: {what}", source=shown) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"YAML syntax error: {exc}", source=shown) from None
    except RecursionError:
        raise ConfigError("YAML nested too deeply", source=shown) from None
    if _count_nodes(raw, MAX_YAML_NODES) > MAX_YAML_NODES:
        raise ConfigError(f"expands to more than {MAX_YAML_NODES} values (YAML aliases?); "
                          "a config is a few dozen", source=shown)
    return raw


def _count_nodes(obj: Any, limit: int) -> int:
    """Values in a parsed YAML tree, aliases counted each time they are used; stops past `limit`."""
    seen, stack = 0, [obj]
    while stack and seen <= limit:
        item = stack.pop()
        seen += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return seen


# --------------------------------------------------------------------------------------------
# Turning pydantic's errors into one line.


def _all_problems(exc: ValidationError) -> list[tuple[str, str]]:
    """Every (field, problem) of a validation error; an unknown key first: `worklaod:` is one
    typo, though pydantic also reports workload missing."""
    errors = sorted(exc.errors(), key=lambda e: e.get("type") != "extra_forbidden")
    return [(field or "(top level)", problem) for field, problem in map(_describe_error, errors)]


# search.seed is a list or a SeedRange: pydantic names the form it tried in the location
_SEED_FORMS = ("list", "range")


def _without_form(loc: tuple) -> tuple:
    return tuple(p for i, p in enumerate(loc) if not (i and loc[i - 1] == "seed" and p in _SEED_FORMS))


def _describe_error(err: dict[str, Any]) -> tuple[str, str]:
    loc = _without_form(tuple(err.get("loc", ())))
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    cause = ctx.get("error")
    value = err.get("input")
    if isinstance(cause, FieldProblem):
        return _join_path(loc, cause.field), cause.message
    path = _join_path(loc)
    if kind == "missing":
        return path, "missing: this field is required"
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = list(parent.model_fields) if parent else []
        return path or repr(loc[-1]), (f"unknown key{_did_you_mean(str(loc[-1]), allowed)}; "
                      f"allowed: {', '.join(allowed)}")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return path, f"must be a mapping of keys, got {_type_name(value)} {_short(value)}"
    if kind in ("too_short", "string_too_short"):
        return path, (f"must not be empty (got {_short(value)})" if ctx.get("min_length") == 1
                      else f"must have at least {ctx.get('min_length')} items (got {_short(value)})")
    if kind == "value_error" and cause is not None:
        return path, _exception_text(cause)
    msg = str(err.get("msg", "invalid value"))
    msg = re.sub(r"^(Value error|Assertion failed), ", "", msg)
    msg = msg.replace("Input should be", "must be").replace("List should have", "must have")
    if kind in ("int_type", "int_from_float"):
        msg = "must be a whole number"
    return path, f"{msg} (got {_short(value)})"


def _join_path(loc: tuple, extra: str = "") -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not re.fullmatch(r"[A-Za-z_][\w-]*", str(part)):  # an odd key a user typed: quote it
            out += f"[{str(part)!r}]"
        else:
            out += f".{part}" if out else str(part)
    if extra:
        out += extra if extra.startswith("[") or not out else f".{extra}"
    return out


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The schema model a location points into, for listing its valid keys."""
    current: Any = SweepConfig
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel) and isinstance(part, str):
            field = current.model_fields.get(part)
            if field is None:
                return None
            current = field.annotation
            # an optional section (`network: NetworkConfig | None`), or search.seed's range: its model
            models = [a for a in get_args(_bare(current)) if isinstance(_bare(a), type)
                      and issubclass(_bare(a), BaseModel)]
            models = [_bare(a) for a in models]
            if get_origin(current) is not list and len(models) == 1:
                current = models[0]
        elif isinstance(part, int) and get_origin(current) is list:
            current = get_args(current)[0]
        else:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _bare(annotation: Any) -> Any:
    """The type inside ``Annotated[type, ...]``."""
    return get_args(annotation)[0] if get_origin(annotation) is Annotated else annotation


def _did_you_mean(word: str, options) -> str:
    options = [str(o) for o in options]
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if not close and len(word) >= 3:  # a shortened name: `fp16` for fp16_compress
        close = [o for o in options if word.lower() in o.lower()][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


def _exception_text(exc: BaseException) -> str:
    text = one_line(str(exc)) or type(exc).__name__
    return text if isinstance(exc, (ValueError, ConfigError)) else f"{type(exc).__name__}: {text}"


def _short(value: Any, limit: int = 60) -> str:
    text = one_line(repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a bool", int: "an integer",
            float: "a number", type(None): "nothing (null)"}.get(type(value), type(value).__name__)


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
