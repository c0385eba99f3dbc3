"""TrialSpec: one trial of the grid (hook, its full parameters, world size, seed, link), its
run name and its key."""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field

Scalar = Union[bool, int, float, str]


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
