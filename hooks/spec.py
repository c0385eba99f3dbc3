"""A hook's descriptor (:class:`HookSpec`) and the parameter checks hook modules declare.

Each hook module declares its ``HookSpec`` next to its hook function; hooks/registry.py only
collects them. Everything the rest of the code knows about a hook comes from its spec: how to
build it (``hook``, ``make_state``), its parameters (:class:`Param`: default and check),
whether it is lossy, what it puts on the wire (``wire_bits``, ``chunked``, the collectives one
call issues, for the cost model in hooks/cost.py).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class Param:
    """One hook parameter: its default, the test a value must pass (``ok``), what ``ok``
    accepts in words (``allowed``, for the error message), and the type the value is cast to."""

    default: Any
    ok: Callable[[Any], bool]
    allowed: str
    cast: Optional[Callable[[Any], Any]] = None

    def checked(self, hook: str, name: str, value: Any) -> Any:
        """``value`` cast to the parameter's type; ValueError naming hook and parameter otherwise."""
        if not self.ok(value):
            raise ValueError(f"hook {hook!r}: parameter {name!r} must be {self.allowed}, got {value!r}")
        return self.cast(value) if self.cast is not None else value


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def positive_int(default: int) -> Param:
    return Param(default, lambda v: _is_int(v) and v > 0, "a positive integer", int)


def non_negative_int(default: int) -> Param:
    return Param(default, lambda v: _is_int(v) and v >= 0, "a non-negative integer", int)


def int_between(default: int, low: int, high: int, why: str) -> Param:
    return Param(default, lambda v: _is_int(v) and low <= v <= high, f"an integer from {low} to {high} ({why})", int)


def flag(default: bool) -> Param:
    return Param(default, lambda v: isinstance(v, bool), "true or false")


def real(default: float, ok: Callable[[float], bool], allowed: str) -> Param:
    return Param(default, lambda v: _is_real(v) and ok(v), allowed, float)


def choice(default: str, options: tuple, why: str) -> Param:
    return Param(default, lambda v: isinstance(v, str) and v in options, f"one of {', '.join(options)} ({why})")


def error_feedback(default: bool = False) -> dict[str, Param]:
    """The ``error_feedback`` parameter most lossy hooks take."""
    return {"error_feedback": flag(default)}


# The parameter a chunked hook's chunk size is (HookSpec.chunked).
CHUNK_SIZE = "chunk_size"


@dataclass(frozen=True, kw_only=True)
class ShardedForm:
    """How a hook runs under FSDP2 (hooks/sharded.py builds it; hooks/fsdp.py validates and attaches):

    * ``reduce_scatter(state, shard, output)``: the gradient's mean, this rank's shard of it into
      ``output`` (FSDP's ``ReduceScatter`` contract; ``shard`` a ``hooks.sharded.GradShard``);
    * ``make_state(process_group, **params)``: its ``hooks.sharded.ShardState``, from the hook's
      own parameters and ``parameters`` (every one given);
    * ``parameters``: what only the sharded form takes (the parameter all-gather's format);
    * ``collectives(n, world_size, **params)``: what one reduce-scatter of ``n`` float32 gradient
      values hands to the wire, ``[(kind, payload bytes)]`` (the all-gather's is the all-gather
      format's, hooks.sharded.all_gather_collectives);
    * ``doc`` (one line).
    """

    reduce_scatter: Callable
    make_state: Callable[..., Any]
    collectives: Callable[..., list]
    parameters: dict[str, Param] = field(default_factory=dict)
    doc: str = ""


@dataclass(frozen=True, kw_only=True)
class HookSpec:
    """Everything about one hook, built with keywords.

    * ``hook``: the function ``(state, bucket) -> Future[Tensor]``;
    * ``make_state(process_group, **params)``: its state (a ``HookState``), from validated params
      (every parameter given: a default lives in its ``Param`` only);
    * ``parameters``: ``{name: Param}``; ``params`` is the ``{name: default}`` view of it;
    * ``check(params)``: a check across parameters (raises ValueError), after each one's own;
    * ``collectives(n, world_size, element_size, **params)``: what one call hands to collectives
      on a bucket of ``n`` elements of ``element_size`` bytes, every parameter given:
      ``[(kind, payload bytes)]`` or ``[hooks.wire.Collective]`` (kinds: ``hooks.wire.KINDS``);
    * ``from_stats(stats)``: the ``collectives`` inputs a bucket's size alone does not give, read
      from a measured ``stats()`` delta (PowerSGD: its compressed fraction, which depends on the
      bucket's matrix shapes, and its extra allreduce rounds); None when the size is enough;
    * ``wire_bits``: bits each gradient value takes on the wire at the hook's defaults, scales
      aside (32 for fp32, 16 for a 16-bit cast, 8 for uint8 codes, 1 for signs); None where the
      wire is not one code per value (sparse or low-rank hooks);
    * ``chunked``: one scale per chunk of ``chunk_size`` values (its parameter ``chunk_size``,
      which names the hook's configurations: run names, line styles); read it with
      :meth:`chunk_size`;
    * ``decodes_each_rank``: the completion work decodes one message per rank (the W rows of an
      allgather), so it grows with W; False where it is one pass over the bucket whatever W
      (an allreduce's result, quantized_allreduce's W shards that together make one bucket).
      The step model (service/step_model/) scales the measured decode by it;
    * ``waits_in_call``: the hook waits inside its call for (some of) its collectives, holding
      the autograd thread, so the rest of the backward pass waits with it (quantized_allreduce's
      all_to_all; PowerSGD's compressed exchange): the step model stalls the backward by it;
    * ``sync(params) -> (hook, params)``: a scheme that communicates less often (hooks/local_sgd.py)
      exchanges after the optimizer step every ``period`` steps, not in its DDP hook: the loop calls
      ``state.after_step(step)`` and evaluates under ``state.anchored()`` (``periodic``), and the
      step model prices the exchange as one call of this hook on every parameter; None for a hook
      whose DDP call is all its communication;
    * ``label(params) -> [str]``: the parts after the hook's name that name a configuration (run
      names, e.g. ``p16``), where its parameters' default naming does not say it best; None: the default;
    * ``lossy``, ``doc`` (one line);
    * ``sharded``: the hook's form under FSDP2 (:class:`ShardedForm`), None where it has none.

    How a report draws a hook is the report's (service/report/hook_styles.py), not the hook's.
    """

    name: str
    hook: Callable
    make_state: Callable[..., Any]
    collectives: Callable[..., list]
    parameters: dict[str, Param] = field(default_factory=dict)
    check: Optional[Callable[[dict], None]] = None
    from_stats: Optional[Callable[[dict], dict]] = None
    wire_bits: Optional[int] = 32
    chunked: bool = False
    decodes_each_rank: bool = False
    waits_in_call: bool = False
    sync: Optional[Callable[[dict], tuple]] = None
    label: Optional[Callable[[dict], list]] = None
    lossy: bool = False
    doc: str = ""
    sharded: Optional[ShardedForm] = None  # its form under FSDP2 (search.parallelism: fsdp); None: DDP only

    def __post_init__(self):
        if self.chunked and CHUNK_SIZE not in self.parameters:
            raise ValueError(f"hook {self.name!r} is chunked but has no {CHUNK_SIZE!r} parameter")

    @property
    def periodic(self) -> bool:
        """Does the hook exchange every ``period`` steps after the optimizer step (``sync``)?"""
        return self.sync is not None

    @property
    def params(self) -> dict[str, Any]:
        """``{parameter: default}``."""
        return {k: p.default for k, p in self.parameters.items()}

    def chunk_size(self, params: dict) -> Optional[int]:
        """The chunk size of a configuration with ``params`` (defaults filled in when missing);
        None for a hook that is not chunked."""
        return params.get(CHUNK_SIZE, self.parameters[CHUNK_SIZE].default) if self.chunked else None
