"""What DDP's own knobs (bucket_cap_mb, gradient_as_bucket_view, static_graph) do to the hooks'
error feedback, measured in real gloo processes (tests/test_ddp_knobs.py runs them).

Error feedback's promise: what a rank meant to send and what it sent differ by its residual,
so over N steps the sum of the averaged gradients the hook returned equals N times the exact
mean minus the ranks' mean residual. A residual lost when DDP rebuilds its buckets (after the
first iteration; static_graph rebuilds them at its own time) or moved to the wrong parameter
breaks that identity, and the cumulative error grows with N instead of staying bounded.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hooks

STEPS = 12


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 48), nn.Tanh(), nn.Linear(48, 48), nn.Tanh(), nn.Linear(48, 10))


def _data(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)


def _flat_grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _exact_mean(model: nn.Module, world_size: int) -> torch.Tensor:
    total = None
    for r in range(world_size):
        m = copy.deepcopy(model)
        x, y = _data(r)
        nn.functional.cross_entropy(m(x), y).backward()
        total = _flat_grads(m) if total is None else total + _flat_grads(m)
    return total / world_size


def _mean_residual(model: nn.Module, state, world_size: int) -> torch.Tensor:
    """The ranks' mean error-feedback residual, flat in parameter order (zeros where none)."""
    by_ordinal = state.residuals.by_ordinal()
    parts = [by_ordinal.get(state.residuals.ordinals.get(id(p)), torch.zeros(p.numel())).reshape(-1)
             for p in model.parameters()]
    flat = torch.cat(parts)
    dist.all_reduce(flat)
    return flat / world_size


def _hook(name: str, feedback: bool):
    params = {"error_feedback": feedback} | ({"chunk_size": 64} if "chunk_size" in hooks.available()[name].params
                                             else {})
    return hooks.build(name, **params)


def _steps(ddp: DDP, model: nn.Module, x, y, first: int, last: int, total: torch.Tensor, exact, errors) -> None:
    for step in range(first, last + 1):
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(ddp(x), y).backward()
        total += _flat_grads(model)
        errors.append(float((total - step * exact).norm() / (step * exact).norm()))


def _run(base: nn.Module, name: str, kw: dict, feedback: bool, resume_at: int | None, rank: int, world_size: int,
         exact: torch.Tensor) -> dict:
    """STEPS steps of a constant gradient (no optimizer step); with ``resume_at``, the hook's
    state is saved there and loaded into a fresh DDP and hook state (after the worker's
    priming iteration), as a resumed trial does."""
    x, y = _data(rank)
    model = copy.deepcopy(base)
    ddp = DDP(model, **kw)
    state, hook = _hook(name, feedback)
    ddp.register_comm_hook(state, hook)
    total, errors = torch.zeros_like(exact), []
    _steps(ddp, model, x, y, 1, resume_at or STEPS, total, exact, errors)
    if resume_at:
        saved = state.state_dict()
        model = copy.deepcopy(base)
        ddp = DDP(model, **kw)
        state, hook = _hook(name, feedback)
        ddp.register_comm_hook(state, hook)
        (nn.functional.cross_entropy(ddp(x), y) * 0.0).backward()  # service.worker.prime_buckets
        state.load_state_dict(saved)
        _steps(ddp, model, x, y, resume_at + 1, STEPS, total, exact, errors)
    identity = None
    if feedback:
        gap = total + _mean_residual(model, state, world_size) - STEPS * exact
        identity = float(gap.norm() / (STEPS * exact).norm())
    return {"half": errors[STEPS // 2 - 1] * STEPS / 2, "full": errors[-1] * STEPS, "identity": identity,
            "buckets": len(state.flags.parameters)}


def cumulative_errors(rank: int, world_size: int, hook_names: list[str], knobs: list[dict]) -> dict:
    """For each hook, DDP knobs and run (error feedback on, off, on and resumed half-way): the
    cumulative error |sum(out) - t * exact mean| in units of |exact mean| after STEPS/2 and
    STEPS steps, the relative gap in the identity sum(out) + mean residual == STEPS * exact
    mean, and how many bucket indices the hook saw."""
    base = _model()
    exact = _exact_mean(base, world_size)
    out = {}
    for name in hook_names:
        for kw in knobs:
            knob = " ".join(f"{k}={v}" for k, v in sorted(kw.items()))
            for run, feedback, resume_at in (("ef", True, None), ("plain", False, None),
                                             ("ef-resumed", True, STEPS // 2)):
                out[name, knob, run] = _run(base, name, kw, feedback, resume_at, rank, world_size, exact)
    return out
