"""Schemes that communicate less often: post-local SGD and DiLoCo.

Every other hook shrinks each step's gradient exchange. These two let each rank train on its own
for ``period`` optimizer steps and then bring the ranks' models together once:

* ``post_local_sgd`` (Lin et al., 2020; torch's ``post_localSGD_hook`` with
  ``PeriodicModelAverager``): ``start_iter`` steps of global allreduce, then local steps (the
  gradient allreduced only within groups of ``group_size`` ranks, 1 = each rank alone) whose
  models are averaged every ``period`` steps. Wire per rank: 2(W-1)/W * 4P bytes (P parameters)
  every ``period`` steps, plus the groups' gradient allreduce.
* ``diloco`` (Douillard et al., 2023): local steps of the workload's own (inner) optimizer; every
  ``period`` steps the pseudo-gradient (the anchor parameters minus this rank's) is averaged
  through any registered compressor (``outer_hook``, a configuration such as
  ``quantization_perchannel(chunk_size=512,error_feedback=true)``: its error feedback keeps the
  residual of the pseudo-gradient it compressed), and an outer SGD with Nesterov momentum (``outer_lr``, ``outer_momentum``) moves the
  anchor by it; every rank then starts again from the anchor. Wire per rank: the outer hook's on
  P values every ``period`` steps.

The DDP comm hook of either only keeps the gradient local (or within its group). The exchange
happens after the optimizer step: the training loop calls ``state.after_step(step)`` every step
(``HookSpec.periodic``), and evaluates on ``state.anchored()``, the parameters every rank agrees
on (the last average), never one rank's drifting copy.

Why not torch's own pieces as they are: ``post_localSGD_hook`` and ``PeriodicModelAverager``
count neither bytes nor time, and the averager averages in place without telling how far the
ranks had drifted; the hook here is torch's algorithm (exact allreduce before ``start_iter``,
within the group after) with the library's accounting, and the average is
``torch.distributed.algorithms.model_averaging``'s (flatten, divide, allreduce) with the ranks'
spread (``replica_drift``) and its collective timed apart from its copies.
"""

import statistics
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist

from .finite import divide_flagging_nonfinite
from .plan import PlanText
from .spec import HookSpec, non_negative_int, positive_int, real
from .state import HookState

POST_LOCAL_SGD, DILOCO = "post_local_sgd", "diloco"


# ----------------------------------------------------------------------------- the shared state
class PeriodicState(HookState):
    """What both schemes keep: the period, the optimizer steps ended (``steps``), the anchor (the
    parameters the ranks last agreed on) and, per exchange, its ``(compute_ms, comm_ms)`` and the
    ranks' spread just before it (``replica_drift``: the largest |a rank's parameter - the ranks'
    average|)."""

    def __init__(self, process_group, period: int, start_iter: int = 0, error_feedback: bool = False):
        super().__init__(process_group, error_feedback)
        self.period, self.start_iter = period, start_iter
        self.steps = 0
        self.weights: list[torch.Tensor] = []  # the model's (``params`` is the hook's, as every state's)
        self.anchor: list[torch.Tensor] = []
        self.sync_times: list[tuple[float, float]] = []
        self.drifts: list[float] = []

    def bind(self, module: torch.nn.Module) -> None:
        """The model whose parameters the exchanges average; its current parameters are the anchor
        (every rank starts from the same weights), unless a checkpoint already restored one."""
        self.weights = [p for p in module.parameters() if p.requires_grad]
        if not self.anchor:
            self.anchor = [p.detach().clone() for p in self.weights]

    def syncs_at(self, step: int) -> bool:
        """Does optimizer step ``step`` (numbered from 1) end with an exchange?"""
        return step > self.start_iter and (step - self.start_iter) % self.period == 0

    def after_step(self, step: int) -> bool:
        """Called after every optimizer step: the exchange where it is due (a collective on every
        rank); returns whether one ran."""
        self.steps = step
        if not self.syncs_at(step):
            return False
        t0 = time.perf_counter()
        comm_s, drift = self.exchange()
        total_s = time.perf_counter() - t0
        self.sync_times.append((1000.0 * (total_s - comm_s), 1000.0 * comm_s))
        self.drifts.append(drift)
        return True

    def exchange(self) -> tuple[float, float]:
        """One exchange: (seconds in its collective, replica drift). The scheme's."""
        raise NotImplementedError

    @contextmanager
    def anchored(self) -> Iterator[None]:
        """The module's parameters set to the anchor for the duration (an eval), then its own back."""
        own = [p.detach().clone() for p in self.weights]
        with torch.no_grad():
            for p, a in zip(self.weights, self.anchor):
                p.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, o in zip(self.weights, own):
                    p.copy_(o)

    def held_tensors(self) -> list[torch.Tensor]:
        """What this state keeps beside the model: the anchor (and the outer optimizer's state)."""
        return list(self.anchor)

    def sync_summary(self) -> dict[str, float]:
        """``syncs``; ``sync_ms``: the median exchange; ``replica_drift``: the largest drift seen."""
        out = {"syncs": float(len(self.sync_times))}
        if self.sync_times:
            out["sync_ms"] = statistics.median(c + m for c, m in self.sync_times)
            out["sync_comm_ms"] = statistics.median(m for _, m in self.sync_times)
            out["replica_drift"] = max(self.drifts)
        return out

    def sync_medians(self) -> Optional[tuple[float, float]]:
        """(compute ms, comm ms) of the median exchange's parts; None before any."""
        if not self.sync_times:
            return None
        return (statistics.median(c for c, _ in self.sync_times), statistics.median(m for _, m in self.sync_times))

    def state_dict(self) -> dict[str, Any]:
        d = super().state_dict()
        d.update(steps=self.steps, anchor=[a.detach().cpu().clone() for a in self.anchor],
                 sync_times=list(self.sync_times), drifts=list(self.drifts))
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        super().load_state_dict(d)
        self.steps = int(d.get("steps", 0))
        self.sync_times = [tuple(t) for t in d.get("sync_times", [])]
        self.drifts = list(d.get("drifts", []))
        if d.get("anchor"):
            device = self.weights[0].device if self.weights else "cpu"
            self.anchor = [a.to(device).clone() for a in d["anchor"]]


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    off = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[off : off + t.numel()].view_as(t))
            off += t.numel()


def _max_over_ranks(value: torch.Tensor, group) -> float:
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return float(value)


# ----------------------------------------------------------------------------- post-local SGD
class PostLocalSGDState(PeriodicState):
    """post_local_sgd's state: the subgroup this rank allreduces its gradients with after
    ``start_iter`` (None: each rank alone)."""

    def __init__(self, process_group, period: int, start_iter: int, group_size: int):
        super().__init__(process_group, period, start_iter)
        self.group_size = group_size
        self.subgroup = _subgroup(self.group, group_size)

    def exchange(self) -> tuple[float, float]:
        """Model averaging: torch's ``average_parameters`` (flatten, divide by W, allreduce, copy
        back), the drift read before the copy."""
        local = _flat(self.weights)
        mean = local / self.world_size()
        self.account("allreduce", mean.numel() * mean.element_size())
        t0 = time.perf_counter()
        dist.all_reduce(mean, group=self.group)
        comm = time.perf_counter() - t0
        drift = _max_over_ranks((local - mean).abs().max(), self.group)
        _unflatten_into(mean, self.weights)
        _unflatten_into(mean, self.anchor)
        return comm, drift


def _subgroup(group, group_size: int):
    """This rank's group of ``group_size`` consecutive ranks of ``group`` (every rank creates every
    group, in the same order, as ``new_group`` requires); None for groups of one."""
    if group_size == 1:
        return None
    ranks = dist.get_process_group_ranks(group)
    if len(ranks) % group_size:
        raise ValueError(f"hook {POST_LOCAL_SGD!r}: group_size {group_size} does not divide the {len(ranks)} ranks")
    mine = None
    for start in range(0, len(ranks), group_size):
        members = ranks[start : start + group_size]
        made = dist.new_group(members)
        if dist.get_rank() in members:
            mine = made
    return mine


def post_local_sgd(state: PostLocalSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Torch's post-local SGD gradient hook: before ``start_iter`` optimizer steps the exact mean
    by allreduce (as ``allreduce``), after it the mean within this rank's group (its own gradient
    for groups of one: no collective). The models' average is ``after_step``'s.
    Wire per call: 2(W-1)/W * 4N before start_iter, 2(g-1)/g * 4N within groups of g after."""
    t0 = state.begin(bucket, check_input=False)
    buf = bucket.buffer()
    global_phase = state.steps < state.start_iter
    group = state.group if global_phase else state.subgroup
    if group is None:
        state.flag_input(bucket, divide_flagging_nonfinite(buf, 1))
        fut = torch.futures.Future()
        fut.set_result([buf])
        return state.finish(fut, t0, _first)
    size = dist.get_world_size(group)
    state.flag_input(bucket, divide_flagging_nonfinite(buf, size))
    state.accounting.collective("allreduce", buf.numel() * buf.element_size(), size)
    if state.sampling is not None:
        state.sampling.launched()
    fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
    return state.finish(fut, t0, _first)


def _first(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()[0]


def local_only(state: PeriodicState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DiLoCo's inner step: this rank's own gradient, no collective (its NaN/inf input flagged)."""
    t0 = state.begin(bucket)
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return state.finish(fut, t0)


# ----------------------------------------------------------------------------- DiLoCo
class FlatBucket:
    """The pseudo-gradient as a one-bucket step for the outer hook: what a hook reads of DDP's
    GradBucket (buffer, index 0, the anchor as its parameters, per-parameter views, the last of
    its step), so any registered compressor averages it as it would a gradient bucket."""

    def __init__(self, buffer: torch.Tensor, params: list[torch.Tensor]):
        self._buffer, self._params = buffer, params

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True

    def parameters(self) -> list[torch.Tensor]:
        return self._params

    def gradients(self) -> list[torch.Tensor]:
        out, off = [], 0
        for p in self._params:
            out.append(self._buffer[off : off + p.numel()].view_as(p))
            off += p.numel()
        return out

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer = tensor


class DiLoCoState(PeriodicState):
    """diloco's state: the outer hook's own state and function, and the outer optimizer (SGD with
    Nesterov momentum) over the anchor."""

    def __init__(self, process_group, period: int, outer_lr: float, outer_momentum: float,
                 outer: tuple[HookState, Callable], outer_text: str):
        super().__init__(process_group, period)
        self.outer_state, self.outer_hook = outer
        self.outer_state.accounting = self.accounting  # its bytes are this trial's bytes
        self.outer_text = outer_text
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum
        self.outer_optimizer: Optional[torch.optim.Optimizer] = None
        self._restored_optimizer: Optional[dict] = None

    def bind(self, module: torch.nn.Module) -> None:
        super().bind(module)
        self.bind_optimizer()

    def exchange(self) -> tuple[float, float]:
        """The outer step: pseudo-gradient anchor - local, averaged by the outer hook, Nesterov
        SGD on the anchor, every rank restarted from it."""
        delta = _flat(self.anchor) - _flat(self.weights)
        own = delta.clone()
        fut = self.outer_hook(self.outer_state, FlatBucket(delta, self.anchor))
        t0 = time.perf_counter()  # its encode (before the launch) is the exchange's compute; its decode, comm
        mean = fut.wait()
        comm = time.perf_counter() - t0
        drift = _max_over_ranks((own - mean).abs().max(), self.group)
        off = 0
        for a in self.anchor:
            a.grad = mean[off : off + a.numel()].view_as(a).to(a.dtype).clone()
            off += a.numel()
        self.outer_optimizer.step()
        self.outer_optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, a in zip(self.weights, self.anchor):
                p.copy_(a)
        return comm, drift

    def held_tensors(self) -> list[torch.Tensor]:
        state = self.outer_optimizer.state.values() if self.outer_optimizer is not None else ()
        return super().held_tensors() + [v for s in state for v in s.values() if isinstance(v, torch.Tensor)]

    def state_dict(self) -> dict[str, Any]:
        d = super().state_dict()
        d["outer_hook_state"] = self.outer_state.state_dict()
        d["outer_optimizer"] = self.outer_optimizer.state_dict() if self.outer_optimizer is not None else None
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        shared = self.outer_state.accounting
        if d.get("outer_hook_state"):
            self.outer_state.load_state_dict(d["outer_hook_state"])
        self.outer_state.accounting = shared  # the outer hook's counters live in this state's
        super().load_state_dict(d)
        self._restored_optimizer = d.get("outer_optimizer")
        if self.outer_optimizer is not None:  # bound already: rebuilt over the restored anchor
            self.bind_optimizer()

    def bind_optimizer(self) -> None:
        """The outer optimizer over the anchor (its restored momentum where a checkpoint had one)."""
        self.outer_optimizer = torch.optim.SGD(self.anchor, lr=self.outer_lr, momentum=self.outer_momentum,
                                               nesterov=self.outer_momentum > 0)
        if self._restored_optimizer is not None:
            self.outer_optimizer.load_state_dict(self._restored_optimizer)


# ----------------------------------------------------------------------------- the specs
PERIOD = "period"


def _no_collectives(n, world_size, element_size, **_):
    return []


def _group_collectives(n, world_size, element_size, *, group_size, **_):
    """A local step's (the steady state after start_iter): the group's gradient allreduce."""
    from .wire import Collective

    return [] if group_size == 1 else [Collective("allreduce", n * element_size, 1.0, group_size)]


def _post_local_label(params: dict) -> list[str]:
    parts = [f"p{params[PERIOD]}"]
    if params["start_iter"]:
        parts.append(f"s{params['start_iter']}")
    if params["group_size"] != 1:
        parts.append(f"g{params['group_size']}")
    return parts


def make_specs(spec: Callable, validate: Callable, build: Callable) -> list[HookSpec]:
    """post_local_sgd's and diloco's HookSpecs over the registry's ``spec``, ``validate`` and
    ``build`` (diloco's outer hook is any registered hook that exchanges every step)."""
    text = PlanText(validate)

    def outer_config(value: Any) -> tuple[str, dict]:
        name, params = text.config(value)
        if spec(name).periodic:
            raise ValueError(f"the outer hook exchanges a pseudo-gradient once; {name!r} itself exchanges periodically")
        return name, params

    def sync_of(params: dict) -> tuple[str, dict]:
        """The hook and parameters of diloco's exchange: its outer hook's configuration."""
        return outer_config(params["outer_hook"])

    def make_diloco(process_group, period, outer_lr, outer_momentum, outer_hook) -> DiLoCoState:
        name, params = outer_config(outer_hook)
        return DiLoCoState(process_group, period, outer_lr, outer_momentum, build(name, process_group, **params),
                           outer_hook)

    def diloco_label(params: dict) -> list[str]:
        parts = [f"p{params[PERIOD]}"]
        name, outer = outer_config(params["outer_hook"])
        if name != "allreduce":
            chunk = spec(name).chunk_size(outer)
            parts.append(name + (f"-c{chunk}" if chunk is not None else ""))
            for key, value in sorted(outer.items()):
                if key != "chunk_size" and spec(name).params.get(key) != value:
                    parts.append((key if value else f"no_{key}") if isinstance(value, bool) else f"{key}{value}")
        for key, short in (("outer_lr", "olr"), ("outer_momentum", "om")):
            if params[key] != DILOCO_DEFAULTS[key]:
                parts.append(f"{short}{params[key]:g}")
        return parts

    post_local = HookSpec(
        name=POST_LOCAL_SGD, hook=post_local_sgd,
        make_state=lambda process_group, period, start_iter, group_size: PostLocalSGDState(
            process_group, period, start_iter, group_size),
        collectives=_group_collectives,
        parameters={PERIOD: positive_int(16), "start_iter": non_negative_int(0), "group_size": positive_int(1)},
        sync=lambda params: ("allreduce", {}), label=_post_local_label, wire_bits=None, lossy=True,
        doc="local SGD steps, the ranks' models averaged every `period` steps (torch's post-local SGD)")
    diloco = HookSpec(
        name=DILOCO, hook=local_only, make_state=make_diloco, collectives=_no_collectives,
        parameters={PERIOD: positive_int(64),
                    "outer_lr": real(DILOCO_DEFAULTS["outer_lr"], lambda v: v > 0, "a positive number"),
                    "outer_momentum": real(DILOCO_DEFAULTS["outer_momentum"], lambda v: 0 <= v < 1,
                                           "a number from 0 to below 1"),
                    "outer_hook": text.param("outer_hook", outer_config, text.config_text, "allreduce",
                                             "a hook configuration: a name or 'name(param=value,...)'", DILOCO)},
        sync=sync_of, label=diloco_label, wire_bits=None, lossy=True,
        doc="inner steps alone; every `period` steps the averaged pseudo-gradient, outer Nesterov SGD (DiLoCo)")
    return [post_local, diloco]


DILOCO_DEFAULTS = {"outer_lr": 0.7, "outer_momentum": 0.9}
