"""The plan hook: a hook configuration per DDP bucket, the registered hooks doing the work.

    state, hook = hooks.build("plan", buckets={0: {"name": "fp16_compress"}}, default="allreduce")
    state.bucket_stats()   # {bucket index: {"config": "fp16_compress", calls, payload_bytes, ...}}

``buckets`` maps a bucket index to a hook configuration: any registered hook but a plan, with its
parameters, given as a mapping ``{name: ..., param: value}`` or as text ``name(param=value,...)``;
``default`` is the configuration of every bucket ``buckets`` does not name. Both parameters are
kept as canonical text (``0=fp16_compress;2=quantized_allreduce(chunk_size=256)``, the
parameters a configuration changes from its hook's defaults, sorted), so a plan is a plain
string wherever hook parameters go (run names, MLflow params, trial keys).

Bucket index: DDP's ``bucket.index()`` at the call. DDP calls its hook in bucket-index order and
rebuilds its buckets after its first iteration (in gradient-ready order); from the second
iteration on, index i is the i-th hook call of the step, the i-th bucket of the step timeline
(hooks/step_sampling.py records the calls in order). On DDP's first iteration the indices are
those of its initial layout, which may hold other parameters or fewer buckets.

Each bucket index gets its own state, built as ``hooks.build`` builds any hook's, on the
bucket's first call: its own accounting (``bucket_stats()``; ``stats()`` sums them, so every
figure read from a hook's stats still holds), PowerSGD memory, draw counter, shard residual. Two
stores are shared, both already kept per bucket index: the error-feedback residuals (moved
parameter by parameter when DDP rebuilds its buckets, hooks/state.py, so a residual follows its
parameter into whichever bucket it lands) and the NaN flags. To its own state a bucket is the
last of the step (``is_last()``): each state sees one bucket per step, so a counter that ticks
on a step's last bucket (torch's PowerSGD iteration) ticks once per step.
"""

import re
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple

import torch
import torch.distributed as dist

from .spec import HookSpec, Param
from .state import HookState, Residuals

NAME = "plan"
Config = tuple  # (hook name, its full parameters): one hook configuration


# ----------------------------------------------------------------------------- the plan as text
_CONFIG_TEXT = re.compile(r"\s*([A-Za-z0-9_]+)\s*(?:\((.*)\))?\s*")
_INDEX_TEXT = re.compile(r"\s*-?\d+\s*")


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def _text_value(text: str) -> Any:
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _given_config(value: Any) -> tuple[str, dict]:
    """(hook name, parameters as given) of a mapping ``{name: ..., param: value}`` or of the text
    ``name`` / ``name(param=value,...)``."""
    if isinstance(value, Mapping):
        if "name" not in value:
            raise ValueError(f"a configuration needs a hook name, got {dict(value)!r}")
        params = {k: v for k, v in value.items() if k != "name"}
        if not all(isinstance(k, str) for k in params):
            raise ValueError(f"a parameter's name is a string, got {sorted(map(repr, params))}")
        return value["name"], params
    match = _CONFIG_TEXT.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"a configuration is a hook name, 'name(param=value,...)' or a mapping, got {value!r}")
    params = {}
    for item in filter(str.strip, (match.group(2) or "").split(",")):
        key, eq, text = item.partition("=")
        if not eq:
            raise ValueError(f"{item.strip()!r} is not param=value")
        params[key.strip()] = _text_value(text)
    return match.group(1), params


def _index(key: Any) -> int:
    if isinstance(key, bool) or not (isinstance(key, int) or (isinstance(key, str) and _INDEX_TEXT.fullmatch(key))):
        raise ValueError(f"a bucket index is an integer, got {key!r}")
    index = int(key)
    if index < 0:
        raise ValueError(f"bucket index {index} is negative: DDP numbers its buckets from 0")
    return index


def _given_buckets(value: Any) -> list[tuple[Any, Any]]:
    """[(index as given, configuration as given)] of a mapping or of ``index=config;...`` text."""
    if isinstance(value, Mapping):
        return list(value.items())
    if not isinstance(value, str):
        raise ValueError(f"buckets are a mapping of bucket index to configuration or "
                         f"'index=config;...' text, got {value!r}")
    out = []
    for entry in filter(str.strip, value.split(";")):
        index, eq, config = entry.partition("=")
        if not eq:
            raise ValueError(f"{entry.strip()!r} is not index=configuration")
        out.append((index, config))
    return out


class PlanText:
    """Reads and writes plans against the registry's ``validate`` (given: this module imports no
    registry, the registry lists this hook)."""

    def __init__(self, validate: Callable[..., dict]):
        self.validate = validate

    def config(self, value: Any) -> Config:
        name, params = _given_config(value)
        if name == NAME:
            raise ValueError("a plan's configuration cannot be a plan")
        return name, self.validate(name, **params)

    def config_text(self, config: Config) -> str:
        name, params = config
        defaults = self.validate(name)
        changed = [f"{k}={_value_text(v)}" for k, v in sorted(params.items()) if defaults[k] != v]
        return f"{name}({','.join(changed)})" if changed else name

    def buckets(self, value: Any) -> dict[int, Config]:
        out: dict[int, Config] = {}
        for given_index, given_config in _given_buckets(value):
            index = _index(given_index)
            if index in out:
                raise ValueError(f"bucket {index} is given twice")
            try:
                out[index] = self.config(given_config)
            except ValueError as exc:
                raise ValueError(f"bucket {index}: {exc}") from None
        return dict(sorted(out.items()))

    def buckets_text(self, buckets: dict[int, Config]) -> str:
        return ";".join(f"{index}={self.config_text(config)}" for index, config in buckets.items())

    def param(self, name: str, parse: Callable, write: Callable, default: str, allowed: str,
              hook: str = NAME) -> Param:
        """A parameter holding configurations (a plan's; diloco's outer hook): a mapping or its
        text, kept as canonical text; one-line ValueError naming the hook and the parameter."""

        def canonical(value: Any) -> str:
            try:
                return write(parse(value))
            except ValueError as exc:
                raise ValueError(f"hook {hook!r}: parameter {name!r}: {exc}") from None

        return Param(default, lambda v: isinstance(v, (str, Mapping)), allowed, canonical)


# ----------------------------------------------------------------------------- state and hook
class BucketHook(NamedTuple):
    """One bucket's hook: its configuration's text, its own state, the hook function."""

    config: str
    state: HookState
    hook: Callable


class OwnBucket:
    """A DDP bucket as its own state sees it: the last of the step (the module doc)."""

    __slots__ = ("_bucket",)

    def __init__(self, bucket):
        self._bucket = bucket

    def is_last(self) -> bool:
        return True

    def __getattr__(self, name: str):
        return getattr(self._bucket, name)


class PlanState(HookState):
    """The plan's state: per bucket index its :class:`BucketHook` (``by_bucket``), built on the
    bucket's first call by ``build`` (the registry's); the residuals and NaN flags shared."""

    def __init__(self, process_group, buckets: dict[int, Config], default: Config, text: PlanText, build: Callable):
        super().__init__(process_group)
        self.configs, self.default, self._text, self._build = buckets, default, text, build
        self.by_bucket: dict[int, BucketHook] = {}

    def bucket_hook(self, index: int) -> BucketHook:
        found = self.by_bucket.get(index)
        if found is None:
            name, params = self.configs.get(index, self.default)
            state, hook = self._build(name, self.process_group, **params)
            state.residuals, state.flags = self.residuals, self.flags  # one store each, keyed by bucket index
            found = self.by_bucket[index] = BucketHook(self._text.config_text((name, params)), state, hook)
        return found

    def stats(self) -> dict[str, float]:
        """The sum of every bucket's statistics (as one hook's: calls, bytes, seconds, per
        collective kind), sampled fidelity and ``nonfinite_inputs`` over the whole plan."""
        out = self.accounting.stats()
        for bucket in self.by_bucket.values():
            for key, value in bucket.state.accounting.stats().items():
                if not key.startswith("fidelity_"):
                    out[key] += value
        out["nonfinite_inputs"] = self.flags.since_reset()
        return out

    def bucket_stats(self) -> dict[int, dict[str, Any]]:
        """Per bucket index: its configuration's text and its own statistics (no NaN counts:
        ``pop_nonfinite_buckets`` names the buckets)."""
        return {index: {"config": b.config, **b.state.accounting.stats()} for index, b in sorted(self.by_bucket.items())}

    def reset_stats(self) -> None:
        super().reset_stats()
        for bucket in self.by_bucket.values():
            bucket.state.accounting.reset()

    def state_dict(self) -> dict[str, Any]:
        """HookState's (the shared residuals, the statistics) plus each bucket's own state."""
        d = super().state_dict()
        d["buckets"] = {index: _own(b.state, b.state.state_dict) for index, b in self.by_bucket.items()}
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        for index, own in d.get("buckets", {}).items():
            bucket = self.bucket_hook(int(index))
            _own(bucket.state, lambda: bucket.state.load_state_dict(own))
        super().load_state_dict(d)  # the shared residuals and flags last: each bucket's load reset them


def _own(state: HookState, fn: Callable):
    """``fn()`` with a throwaway residual store on ``state``: a bucket's own state_dict leaves the
    shared residuals to the plan's (saved once, not once per bucket)."""
    shared, state.residuals = state.residuals, Residuals()
    try:
        return fn()
    finally:
        state.residuals = shared


def plan(state: PlanState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Each bucket by its own configuration: the hook that ``state``'s plan names for
    ``bucket.index()`` (its default for the others), called on the bucket's own state.

    Per bucket exactly that hook: its algorithm, error, wire bytes and failure behaviour (its
    future raises a failed collective; its NaN/inf input flag is recorded). Cost over the hook:
    one dict lookup and a small wrapper per call; a bucket's state is built on its first call.
    """
    own = state.bucket_hook(bucket.index())
    own.state.sampling = state.sampling  # a sampled step's recorder stamps every bucket's calls
    return own.hook(own.state, OwnBucket(bucket))


# ----------------------------------------------------------------------------- the spec
BUCKETS_ALLOWED = "a mapping of bucket index to hook configuration, or 'index=config;...' text"
DEFAULT_ALLOWED = "a hook configuration: a name, 'name(param=value,...)' or {name: ..., param: value}"


def make_spec(spec: Callable, validate: Callable, build: Callable) -> HookSpec:
    """The plan's HookSpec over the registry's ``spec``, ``validate`` and ``build``.

    The cost model prices a plan's call as its default configuration's (a spec prices a bucket
    by its size, not its index): pricing each bucket by its own configuration is the step
    model's to add.
    """
    text = PlanText(validate)

    def make_state(process_group, buckets: str, default: str) -> PlanState:
        return PlanState(process_group, text.buckets(buckets), text.config(default), text, build)

    def collectives(n, world_size, element_size, *, buckets, default, **measured):
        name, params = text.config(default)
        return spec(name).collectives(n, world_size, element_size, **{**params, **measured})

    parameters = {
        "buckets": text.param("buckets", text.buckets, text.buckets_text, "", BUCKETS_ALLOWED),
        "default": text.param("default", text.config, text.config_text, "allreduce", DEFAULT_ALLOWED),
    }
    return HookSpec(name=NAME, hook=plan, make_state=make_state, collectives=collectives, parameters=parameters,
                    wire_bits=None, lossy=True, doc="a hook configuration per DDP bucket, a default for the rest")
