"""WHERE NaN IS DETECTED: per-step finite checks and their cross-rank agreement.

Every optimizer step, on every rank, :meth:`NanMonitor.submit` looks at four places, in
the order a non-finite value flows through a step:

1. ``loss``        the forward pass produced a non-finite loss;
2. ``model_grad``  a bucket arrived at the comm hook already holding NaN/inf (the hook's
                   own ``pop_nonfinite_buckets()`` accounting: the check must happen
                   *before* the hook, because quantizing hooks turn NaN/inf into finite
                   garbage through round + clamp, so the aggregated gradient can look fine);
3. ``hook``        the hook's input was finite but the gradient it wrote back is not
                   (compression-induced: fp16 overflow, a zero scale, ...);
4. ``params``      the weights went non-finite in the optimizer step.

Cost per step: one pass over the weights (one native pass over all of them for CPU float32,
a min/max on GPUs: ``hooks.finite.nonfinite``), a second one over the gradients only
when the weights went non-finite (``grads_reach_weights``), the hook's one host sync, and
ONE all-reduce of a tiny ``[world_size, 5]`` tensor that carries every rank's four flags
and its loss. So all ranks see the same verdict and stop together, and the mean
loss across ranks comes for free. Only at the first non-finite step do the ranks exchange
the details (bucket index, parameter names) with one ``all_gather_object``.

The all-reduce is asynchronous: ``submit(step, loss)`` starts it and ``resolve()`` waits
for it. The training loop resolves step s after step s+1's backward, so the agreement
travels beside the next step's gradient collectives instead of being a second rendezvous
of the ranks per step (waiting there for the peers' jitter cost 13% of char_lm's step at
world size 2, docs/performance.md); ``check()`` does both at once. The details a report
needs are taken at ``submit`` time (only on a rank whose own flags are set), so a report
still describes step s, not the step that ran while its verdict was in flight.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist

from hooks.finite import nonfinite  # the exact NaN/inf test the hooks flag their inputs with
from hooks.state import HookState, NonfiniteBucket
from service.train.dtensors import local as _local  # each rank checks its shard; the agreement combines them

# Provenance order: the earliest place a non-finite value can appear in a step.
SOURCES = ("loss", "model_grad", "hook", "params")
_LOSS_COLUMN = len(SOURCES)


@dataclass
class StepCheck:
    """The agreed result of one step's check (identical on every rank)."""

    step: int
    mean_loss: float
    nonfinite: bool
    source: Optional[str] = None  # one of SOURCES when nonfinite
    rank: Optional[int] = None  # the lowest rank where ``source`` was seen
    flags: list[list[int]] = field(default_factory=list)  # [rank][source] 0/1


@dataclass
class NanReport:
    """Where a trial first went non-finite: logged as tags, metrics and a JSON artifact."""

    first_nan_step: int
    nan_source: str
    nan_rank: int
    bucket_index: Optional[int]  # the first non-finite bucket of ``nan_rank`` (model_grad)
    param_names: list[str]  # parameters in that bucket, or with non-finite grads/weights
    per_rank: list[dict[str, Any]]  # every rank's flags, loss and details at that step
    hook: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def nonfinite_names(named: Iterable[tuple[str, Optional[torch.Tensor]]]) -> list[str]:
    """Names of the tensors that hold NaN/inf (detail for the report: costs a sync each)."""
    return [n for n, t in named if t is not None and not bool(torch.isfinite(_local(t).detach()).all())]




@dataclass
class _Pending:
    """A submitted step whose agreement is in flight."""

    step: int
    table: torch.Tensor  # [world_size, 5]: this rank's row filled, the all-reduce's buffer
    work: Any  # the all-reduce's handle (None on one rank)
    details: Optional[dict[str, Any]]  # this rank's details when its own flags were set


class NanMonitor:
    """Per-rank NaN checks with one (asynchronous) cross-rank agreement per step.

    ``model`` is the (DDP-wrapped or plain) module whose ``.grad`` the hook wrote back;
    ``hook_state`` is the comm hook's state (its ``pop_nonfinite_buckets()`` says which
    buckets reached the hook non-finite; None: no hook to ask); ``process_group`` None = the
    default group.
    ``grads_reach_weights``: the optimizer turns a non-finite gradient into a non-finite
    weight (true of SGD and AdamW, the service's optimizers), so the gradients need reading
    only when the weights went bad; False reads them every step (an optimizer that may skip
    a non-finite gradient, as a gradient scaler does).
    """

    def __init__(self, model: torch.nn.Module, hook_state: Optional[HookState] = None, *, rank: int = 0,
                 world_size: int = 1, device: torch.device | str = "cpu",
                 hook_name: Optional[str] = None, process_group=None,
                 grads_reach_weights: bool = True):
        self.grads_reach_weights = grads_reach_weights
        self.module = getattr(model, "module", model)
        self.named_params = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        self._params = [p for _, p in self.named_params]
        self._name_of = {id(p): n for n, p in self.named_params}
        self.hook_state = hook_state
        self.hook_name = hook_name
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)
        self.process_group = process_group
        self._pending_buckets: list[tuple[int, list[str]]] = []
        self._pending: Optional[_Pending] = None
        self.report: Optional[NanReport] = None

    # -- local checks ------------------------------------------------------------

    def _bucket_inputs_nonfinite(self) -> bool:
        """Did a bucket reach the hook holding NaN/inf since the last step?"""
        buckets = self.hook_state.pop_nonfinite_buckets() if self.hook_state is not None else []
        self._pending_buckets = [self._describe_bucket(b) for b in buckets]
        return bool(buckets)

    def _describe_bucket(self, bucket: NonfiniteBucket) -> tuple[int, list[str]]:
        return bucket.bucket_index, [self._name_of.get(id(p), "?") for p in bucket.parameters]

    def local_flags(self, loss: torch.Tensor) -> torch.Tensor:
        """This rank's row: [loss, model_grad, hook, params, loss value] (on device)."""
        loss = loss.detach().float().reshape(())
        params_bad = nonfinite([_local(p) for p in self._params])
        # SGD and AdamW carry any non-finite gradient into its weight (p -= lr * f(g)), so
        # finite weights after the step mean finite gradients: on CPU, where reading the flag
        # is free, the gradients are read only when the weights went bad, to tell "hook"
        # from "params" (one pass over the model per step instead of two).
        if self.grads_reach_weights and params_bad.device.type == "cpu" and not bool(params_bad):
            grads_bad = torch.zeros((), dtype=torch.bool)
        else:
            grads_bad = nonfinite([_local(p.grad) for p in self._params])
        inputs_bad = self._bucket_inputs_nonfinite()
        if loss.device.type == "cpu":  # every flag reads for free on CPU: one small tensor, not five ops
            value = float(loss)
            return torch.tensor([float(not math.isfinite(value)), float(inputs_bad), float(bool(grads_bad)),
                                 float(bool(params_bad)), value])
        return torch.stack([
            loss.isfinite().logical_not().float(),
            torch.tensor(float(inputs_bad), device=loss.device),
            grads_bad.float().to(loss.device),
            params_bad.float().to(loss.device),
            loss,
        ])

    # -- the per-step agreement -------------------------------------------------------

    def submit(self, step: int, loss: torch.Tensor) -> None:
        """Start ``step``'s check: local flags now, the cross-rank agreement in flight.

        Run after the optimizer step (grads still hold the hook's output). Every rank must
        call it every step, and ``resolve()`` before the next ``submit``: it is a collective.
        """
        if self._pending is not None:
            raise RuntimeError(f"step {self._pending.step}'s check was never resolved")
        row = self.local_flags(loss).to(self.device)
        table = torch.zeros(self.world_size, _LOSS_COLUMN + 1, device=self.device)
        table[self.rank] = row
        # One host read of this rank's own flags (free on CPU; the check synced every step
        # before it went asynchronous): the details must be taken now, before the next step
        # overwrites the gradients.
        details = self._local_details() if bool(row[:_LOSS_COLUMN].any()) else None
        work = None
        if self.world_size > 1 and dist.is_available() and dist.is_initialized():
            work = dist.all_reduce(table, group=self.process_group, async_op=True)
        self._pending = _Pending(step, table, work, details)

    def resolve(self) -> Optional[StepCheck]:
        """The agreed result of the submitted step (waits for its all-reduce), or None when
        nothing is pending. At the first non-finite step every rank must resolve at the same
        point: the details are exchanged then (one collective)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        if pending.work is not None:
            pending.work.wait()
        rows = pending.table.tolist()  # one transfer; the rest is a few floats in Python
        flags = [[int(v > 0) for v in row[:_LOSS_COLUMN]] for row in rows]
        losses = [row[_LOSS_COLUMN] for row in rows]
        result = StepCheck(step=pending.step, mean_loss=sum(losses) / len(losses),
                           nonfinite=any(any(r) for r in flags), flags=flags)
        if result.nonfinite:
            # "hook" means: output non-finite although no rank's input was. When some
            # rank's input already was, the all-reduce spread it: that is model_grad.
            for column, source in enumerate(SOURCES):
                ranks = [r for r in range(self.world_size) if flags[r][column]]
                if ranks:
                    result.source, result.rank = source, ranks[0]
                    break
            if self.report is None:
                self.report = self._explain(result, losses, pending.details)
        return result

    def check(self, step: int, loss: torch.Tensor) -> StepCheck:
        """``submit`` and ``resolve`` at once: the verdict before returning (a collective)."""
        self.submit(step, loss)
        return self.resolve()

    def _local_details(self) -> dict[str, Any]:
        """What this rank saw at a step where its own flags are set (costs a sync per tensor)."""
        return {
            "buckets": [{"bucket_index": i, "param_names": n} for i, n in self._pending_buckets],
            "nonfinite_grads": nonfinite_names((n, p.grad) for n, p in self.named_params),
            "nonfinite_params": nonfinite_names(self.named_params),
        }

    def _explain(self, check: StepCheck, losses: list[float],
                 details: Optional[dict[str, Any]]) -> NanReport:
        """Collect every rank's details at the first non-finite step (one collective)."""
        mine = {
            "rank": self.rank,
            "flags": dict(zip(SOURCES, check.flags[self.rank])),
            "loss": losses[self.rank],
            **(details or {"buckets": [], "nonfinite_grads": [], "nonfinite_params": []}),
        }
        if self.world_size > 1 and dist.is_available() and dist.is_initialized():
            per_rank: list[Any] = [None] * self.world_size
            dist.all_gather_object(per_rank, mine, group=self.process_group)
        else:
            per_rank = [mine]
        culprit = per_rank[check.rank]
        bucket_index, names = None, []
        if check.source == "model_grad" and culprit["buckets"]:
            bucket_index = culprit["buckets"][0]["bucket_index"]
            names = culprit["buckets"][0]["param_names"]
        elif check.source in ("model_grad", "hook"):
            names = culprit["nonfinite_grads"]
        elif check.source == "params":
            names = culprit["nonfinite_params"]
        return NanReport(first_nan_step=check.step, nan_source=check.source, nan_rank=check.rank,
                         bucket_index=bucket_index, param_names=names, per_rank=per_rank,
                         hook=self.hook_name)
