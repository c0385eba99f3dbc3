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
        (nn.functional.cross_entropy(ddp(x), y) * 0.0).backward()  # service.train.checkpoint.prime_buckets
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


# ----------------------------------------------------------------------------- through the worker


def _recording(build_hook, calls: list, views: list):
    """build_hook's (state, hook) with the hook wrapped: each step's bucket calls, and whether
    every gradient of the bucket lies in the bucket's own memory (gradient_as_bucket_view)."""
    def build(name, process_group=None, **params):
        state, hook = build_hook(name, process_group=process_group, **params)

        def recorded(st, bucket):
            buf = bucket.buffer()
            low, high = buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()
            views.append(all(p.grad is not None and low <= p.grad.data_ptr() < high for p in bucket.parameters()))
            calls[-1] += 1
            fut = hook(st, bucket)
            if bucket.is_last():
                calls.append(0)
            return fut
        return state, recorded
    return build


def knobs_through_the_worker(rank: int, world_size: int, dumps: dict) -> dict:
    """Every trial of each config through service.train.run_training, with the hook recorded
    and the DDP model kept: per-step bucket counts, the view check, the buffers each training
    forward started from."""
    from service.config import SweepConfig
    from service.train.nan import NanMonitor
    from service.train import TrainingContext, run_training

    out = {}
    for key, dump in dumps.items():
        cfg = SweepConfig.model_validate(dump)
        for trial in cfg.trials():
            calls, views, models, buffers_seen = [0], [], [], []

            def seen(module, args):
                if module.training:  # what each training forward starts from (after DDP's buffer sync)
                    buffers_seen.append([float(b.double().sum()) for b in module.buffers()])

            def monitor(model, *args, **kwargs):
                models.append(model)
                model.module.register_forward_pre_hook(seen)
                return NanMonitor(model, *args, **kwargs)

            result = run_training(trial, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu",
                                  build_hook=_recording(hooks.build, calls, views), make_monitor=monitor))
            out[key, trial.run_name] = {
                "status": result.status, "losses": result.losses, "summary": result.summary,
                "per_step": calls[:-1], "views": views,
                "ddp": {k: getattr(models[0], k) for k in ("find_unused_parameters", "broadcast_buffers",
                                                           "gradient_as_bucket_view", "static_graph")},
                "buffers_seen": buffers_seen}
    return out


def bucket_sizes(workload: str, cap_mb: float) -> list[int]:
    """The elements of each bucket DDP makes of a workload's gradient after its rebuild, found
    by DDP itself: a one-process group of its own, three steps with a counting hook."""
    from service.workloads import build_workload
    from tests.dist_utils import init_single_rank_group

    group_was_up = dist.is_initialized()
    if not group_was_up:
        init_single_rank_group()
    try:
        wl = build_workload(workload, 0)
        ddp = DDP(wl.model, bucket_cap_mb=cap_mb)
        sizes: list[int] = []

        def count(state, bucket):
            sizes.append(bucket.buffer().numel())
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        ddp.register_comm_hook(None, count)
        for _ in range(2):
            sizes.clear()
            wl.step_loss(ddp, wl.fetch(wl.train_set, torch.arange(4))).backward()
        return sizes
    finally:
        if not group_was_up:
            dist.destroy_process_group()
