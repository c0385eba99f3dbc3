"""TrialSpec: one trial of the grid (hook, its full parameters, world size, seed, link), its
run name and its key."""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from service import hook_facts
from service.config.limits import DDP_BUCKET_CAP_MB

Scalar = Union[bool, int, float, str]
# What a trial's run is for: "full" trains every step on its own link (quality and speed);
# a network sweep over several links splits that (the losses do not depend on the link): one "quality" run per
# (configuration, world size, seed), every step on loopback, and per link one "timing" run of
# network.timing_steps steps, which gives that link's step times.
RunKind = Literal["full", "quality", "timing"]
# How the ranks hold the model: DDP (every rank all of it), or FSDP2 (each rank a shard; the
# hook's sharded form, HookSpec.sharded, reduces the gradient). A ddp trial keeps its old names and key.
Parallelism = Literal["ddp", "fsdp"]
FSDP = "fsdp"
DDP_KNOBS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph")  # DDP's own arguments
# The search axes besides hooks, world size and seed: DDP's knobs and whether the module inside
# DDP is compiled (torch.compile, DDP(compile(module)); how: workload.compile's mode)
KNOBS = (*DDP_KNOBS, "compile")


class TrialSpec(BaseModel):
    """One trial of the grid. Passed through Ray as a plain dict (to_dict / from_dict)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    hook: str
    hook_params: dict[str, Union[Scalar, None]]  # full: defaults from hooks.validate included
    world_size: int = Field(ge=1)
    seed: int = Field(ge=0)
    link_gbps: float | None = None  # the emulated link (config network:), None: the ordinary network
    # DDP's knobs (search axes): their defaults are DDP's own
    bucket_cap_mb: float = DDP_BUCKET_CAP_MB
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    compile: bool = False  # torch.compile of the module inside DDP (hook eager), workload.compile's mode
    kind: RunKind = "full"
    parallelism: Parallelism = "ddp"
    # The knobs the sweep varies: only these name the configuration (a knob every trial shares is
    # a setting, not a difference: `bucket_cap_mb: 1` alone keeps the baseline's label allreduce).
    # All of them by default, as before this field (a trial recorded then keeps its label).
    named_knobs: tuple[str, ...] = Field(KNOBS, strict=False)  # a JSON round trip makes it a list

    @property
    def run_name(self) -> str:
        """`{config_label}-w{world_size}-s{seed}`, then `-{G}gbps` on an emulated link, then
        `-quality` / `-timing` for the two halves of a split network sweep."""
        parts = [self.config_label, f"w{self.world_size}", f"s{self.seed}"]
        if self.link_gbps is not None:  # the report reads the link from the identity tags
            parts.append(f"{self.link_gbps:g}gbps")
        return "-".join(parts + self._kind_part())

    def _kind_part(self) -> list[str]:
        return [] if self.kind == "full" else [self.kind]

    @property
    def config_label(self) -> str:
        """The configuration's label, one per configuration whatever its world size, seed and link:
        `{hook}-c{chunk_size}`, the -c part only for chunked hooks (e.g. `quantization_perchannel-c512`),
        or the parts a hook's spec names its configurations by (``HookSpec.label``: `post_local_sgd-p16`,
        `diloco-p64-bf16_compress`).

        Other parameters appear only when they differ from the hook's default (e.g. a swept
        PowerSGD rank: `powersgd-rank4`), so the names in a grid stay distinct; so do
        DDP's knobs and compile where the sweep varies them (``named_knobs``), off their defaults
        (`-b1` for bucket_cap_mb 1, `-view`, `-static`, `-compiled`).
        """
        parts = [self.hook]
        own = hook_facts.label_parts(self.hook, self.hook_params)
        if own is not None:  # the hook names its configurations itself (post_local_sgd-p16)
            parts += own
        else:
            parts += self._param_parts()
        parts += [_KNOB_NAMES[k](v) for k, v in self.non_default_knobs().items() if k in self.named_knobs]
        return "-".join(parts + self._parallelism_part())

    def _param_parts(self) -> list[str]:
        parts = []
        chunk = hook_facts.chunk_size(self.hook, self.hook_params)
        if chunk is not None:
            parts.append(f"c{chunk}")
        for key, value in self.non_default_params().items():
            if hook_facts.is_chunk_size(self.hook, key):
                continue
            if isinstance(value, bool):
                parts.append(key if value else f"no_{key}")
            else:
                parts.append(f"{key}{value}")
        return parts

    def _parallelism_part(self) -> list[str]:
        return [FSDP] if self.parallelism == FSDP else []

    def non_default_params(self) -> dict[str, Any]:
        """The hook parameters that differ from the hook's defaults, plus chunk_size and a periodic
        hook's period always (they name the configuration): what tables show."""
        defaults = _hook_defaults(self.hook, self.parallelism)
        return {k: v for k, v in self.hook_params.items()
                if hook_facts.names_configuration(self.hook, k) or k not in defaults or defaults[k] != v}

    def knobs(self) -> dict[str, Any]:
        """This trial's knobs: DDP's (bucket_cap_mb, gradient_as_bucket_view, static_graph) and compile."""
        return {k: getattr(self, k) for k in KNOB_DEFAULTS}

    def non_default_knobs(self) -> dict[str, Any]:
        return {k: v for k, v in self.knobs().items() if v != KNOB_DEFAULTS[k]}

    @property
    def key(self) -> str:
        """A stable identifier (every parameter spelled out): how --resume tells trials apart.
        DDP's knobs are spelled out, all three, when any differs from DDP's defaults, and a
        compiled trial's ends in -compiled (a default trial keeps the key it always had); a split
        network sweep's runs end in -quality / -timing."""
        link = f"-l{self.link_gbps:g}" if self.link_gbps is not None else ""
        return "-".join([f"{self.config_key}-w{self.world_size}-s{self.seed}{link}"] + self._kind_part())

    @property
    def config_key(self) -> str:
        """The key's configuration part (``key`` without world size, seed and link): what makes
        two grid entries the same configuration."""
        params = ",".join(f"{k}={self.hook_params[k]!r}" for k in sorted(self.hook_params))
        ddp = ("-ddp[" + ",".join(f"{k}={getattr(self, k)!r}" for k in sorted(DDP_KNOBS)) + "]"
               if any(k in DDP_KNOBS for k in self.non_default_knobs()) else "")
        return "-".join([f"{self.hook}[{params}]{ddp}" + ("-compiled" if self.compile else "")]
                        + self._parallelism_part())

    def describe(self) -> str:
        """The --dry-run line: hook, its parameters (and DDP's knobs off their defaults), world size, seed."""
        params = " ".join(f"{k}={v}" for k, v in {**self.hook_params, **self.non_default_knobs()}.items()) or "-"
        link = f" link_gbps={self.link_gbps:g}" if self.link_gbps is not None else ""
        kind = ("" if self.kind == "full" else f" {self.kind}") + ("" if self.parallelism == "ddp" else f" {FSDP}")
        return f"{self.hook:<26} {params:<40} world_size={self.world_size:<3} seed={self.seed}{link}{kind}"

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialSpec":
        return cls.model_validate(data)


KNOB_DEFAULTS = dict(zip(KNOBS, (DDP_BUCKET_CAP_MB, False, False, False)))
_KNOB_NAMES = {"bucket_cap_mb": lambda cap: f"b{cap:g}", "gradient_as_bucket_view": lambda on: "view",
               "static_graph": lambda on: "static", "compile": lambda on: COMPILED}
COMPILED = "compiled"  # a compiled trial's label part where the sweep lists both: allreduce-compiled


def _hook_defaults(name: str, parallelism: str = "ddp") -> dict[str, Any]:
    import hooks
    import hooks.fsdp

    spec = hooks.available().get(name)
    if spec is not None and parallelism == FSDP and spec.sharded is not None:
        return hooks.fsdp.parameters(name)  # the sharded form's: the all-gather's format too
    return spec.params if spec is not None else {}
