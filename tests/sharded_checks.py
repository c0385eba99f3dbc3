"""Checks of the hooks' sharded forms that run inside real gloo processes (spawned by
tests/test_hooks_sharded.py): FSDP2 (fully_shard on a CPU mesh) with each form attached.

Every function is ``check(rank, world_size)`` and raises AssertionError on failure. Inputs are
seeded per rank, so each rank can compute every rank's gradient on an unsharded copy of the
model: the reference mean the sharded forms are compared with.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import hooks
import hooks.fsdp
from hooks import wire
from hooks.sharded import all_gather_collectives
from hooks.quantize import message_bytes
from tests.hooks_checks import run_checks as _run

# Layers of 7 rows: uneven shards at W = 2 and 3 (FSDP pads dim 0 to a multiple of W).
WIDTH, IN, LAYERS = 7, 70, 3
FORMS = {"allreduce": {}, "fp16_compress": {}, "bf16_compress": {}, "quantized_allreduce": {"chunk_size": 16}}


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(IN if i == 0 else WIDTH * 10, WIDTH * 10) for i in range(LAYERS)])


def _input(rank: int) -> torch.Tensor:
    return torch.randn(4, IN, generator=torch.Generator().manual_seed(100 + rank))


def _sharded(name: str, params: dict, w: int):
    """The model fully_shard'ed per layer then at the root, with hook ``name``'s form attached."""
    mesh = init_device_mesh("cpu", (w,))
    model = _model()
    modules = [*model, model]
    for m in modules:
        fully_shard(m, mesh=mesh)
    state, form = hooks.fsdp.build(name, **params)
    for i, m in enumerate(modules):
        hooks.fsdp.attach(state, form, m, i)
    return model, state


def _reference_grads(w: int) -> list[torch.Tensor]:
    """The mean over ranks of each parameter's gradient, computed locally on an unsharded copy."""
    model = _model()
    total = [torch.zeros_like(p) for p in model.parameters()]
    for r in range(w):
        model.zero_grad()
        model(_input(r)).square().mean().backward()
        for t, p in zip(total, model.parameters()):
            t += p.grad / w
    return total


def _full_grads(model) -> list[torch.Tensor]:
    return [p.grad.full_tensor() for p in model.parameters()]


def _rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    num = sum(float((x - y).square().sum()) for x, y in zip(a, b))
    return math.sqrt(num / sum(float(y.square().sum()) for y in b))


def check_forms_reach_the_mean(rank: int, w: int) -> dict:
    """Each form's reduced gradient is the ranks' mean: exactly (fp32, to float rounding) or
    within its format's rounding; the lossy ones are not exact (the form really ran)."""
    ref = _reference_grads(w)
    bounds = {"allreduce": (0.0, 1e-6), "fp16_compress": (1e-6, 2e-3), "bf16_compress": (1e-5, 1e-2),
              "quantized_allreduce": (1e-5, 2e-2)}
    out = {}
    for name, params in FORMS.items():
        model, state = _sharded(name, params, w)
        model(_input(rank)).square().mean().backward()
        err = _rel(_full_grads(model), ref)
        low, high = bounds[name]
        assert low <= err <= high, f"{name} at W={w}: relative error {err:.2e} outside [{low}, {high}]"
        assert state.stats()["reduce_scatter_calls"] == LAYERS, state.stats()
        out[name] = err
    return out


def _padded(w: int) -> int:
    """Unsharded values of one layer as FSDP lays them out: each parameter's dim 0 padded to W."""
    model = _model()
    return sum(math.ceil(p.shape[0] / w) * w * math.prod(p.shape[1:]) for p in model[1].parameters())


def check_bytes_match_formulas(rank: int, w: int) -> dict:
    """reduce_scatter and all_gather bytes and the wire bytes per call, against each format's
    formula on the layer's padded size (layers 1 and 2 are the same size; layer 0 is measured
    alone: its input is narrower)."""
    out = {}
    for name, params, gather in [("allreduce", {}, "fp32"), ("bf16_compress", {}, "bf16"),
                                 ("fp16_compress", {}, "uint8"), ("quantized_allreduce", {"chunk_size": 16}, "uint8")]:
        model, state = _sharded(name, {**params, "all_gather": gather, "all_gather_chunk_size": 32}, w)
        model(_input(rank)).square().mean().backward()
        layer0 = sum(math.ceil(p.shape[0] / w) * w * math.prod(p.shape[1:]) for p in model[0].parameters())
        n1 = _padded(w)
        s = state.stats()
        rs = {"allreduce": 4 * n1, "bf16_compress": 2 * n1, "fp16_compress": 2 * n1,
              "quantized_allreduce": w * message_bytes(n1 // w, 16)}[name]
        per_ag = {"fp32": 4, "bf16": 2}.get(gather)
        rs0 = {"allreduce": 4 * layer0, "quantized_allreduce": w * message_bytes(layer0 // w, 16)}.get(name, 2 * layer0)
        assert s["reduce_scatter_bytes"] == 2 * rs + rs0, (name, s["reduce_scatter_bytes"], 2 * rs + rs0)
        # what the spec declares (the step model's input) says the same
        full = hooks.fsdp.validate(name, **params, all_gather=gather, all_gather_chunk_size=32)
        declared = hooks.available()[name].sharded.collectives
        assert sum(b for n in (layer0, n1, n1) for _, b in declared(n, w, **full)) == s["reduce_scatter_bytes"]
        assert [b for n in (layer0, n1, n1) for _, b in all_gather_collectives(n, w, **full)] == \
            [per_ag * n if per_ag else w * message_bytes(n // w, 32) for n in (layer0, n1, n1)]
        ag = [per_ag * n if per_ag else w * message_bytes(n // w, 32) for n in (layer0, n1, n1)]
        calls = s["all_gather_calls"]
        assert calls in (2 * LAYERS, 2 * LAYERS - 1), calls  # forward, and backward's re-gather (not the last layer's)
        assert s["all_gather_bytes"] in _gather_totals(ag, calls), (name, gather, s["all_gather_bytes"], ag, calls)
        expected_wire = wire.wire_bytes("reduce_scatter", s["reduce_scatter_bytes"], w) + \
            wire.wire_bytes("all_gather", s["all_gather_bytes"], w)
        assert abs(s["wire_bytes"] - expected_wire) < 1e-6 * expected_wire, (s["wire_bytes"], expected_wire)
        assert abs(s["wire_bytes"] - (w - 1) / w * (s["reduce_scatter_bytes"] + s["all_gather_bytes"])) < 1e-3
        out[name] = s
    return out


def _gather_totals(per_layer: list[int], calls: int) -> set:
    """Forward gathers every layer; backward re-gathers all but those FSDP kept unsharded."""
    forward = sum(per_layer)
    return {forward + sum(per_layer[:k]) for k in range(len(per_layer) + 1) if len(per_layer) + k == calls}


def check_all_gather_error_recorded(rank: int, w: int) -> dict:
    """fp32's gathered parameters are exact; bf16's and uint8's errors are recorded and bounded."""
    out = {}
    for gather, (low, high) in {"fp32": (0.0, 0.0), "bf16": (1e-5, 2 ** -8), "uint8": (1e-5, 1e-2)}.items():
        model, state = _sharded("allreduce", {"all_gather": gather, "all_gather_chunk_size": 32}, w)
        model(_input(rank)).square().mean().backward()
        err = state.stats()["all_gather_rel_error"]
        assert low <= err <= high, (gather, err)
        out[gather] = err
    return out


def check_quantized_error_feedback(rank: int, w: int) -> dict:
    """The same gradient every step: with error feedback the average of the reduced gradients
    over the steps approaches the true mean (each step's rounding is carried to the next)."""
    ref = _reference_grads(w)
    errs = {}
    for feedback in (False, True):
        model, state = _sharded("quantized_allreduce", {"chunk_size": 64, "error_feedback": feedback}, w)
        total = None
        for _ in range(8):
            model.zero_grad(set_to_none=True)
            model(_input(rank)).square().mean().backward()
            grads = _full_grads(model)
            total = grads if total is None else [t + g for t, g in zip(total, grads)]
        errs[feedback] = _rel([t / 8 for t in total], ref)
        assert bool(state.module_residuals) == feedback
    assert errs[True] < 0.5 * errs[False], errs
    return errs


class _NanBackward(torch.autograd.Function):
    """Identity forward, NaN gradient backward: poisons what flows back through it."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad + float("nan")


def check_nan_flags_name_the_module(rank: int, w: int) -> dict:
    """NaN flowing back out of layer 1 on one rank (layers 1 and 0 get NaN gradients) flags that
    rank's reduce-scatter inputs of those modules (their indices, their parameters); the other
    ranks see finite inputs, and the finite layer 2 is never flagged."""
    for name, params in FORMS.items():
        model, state = _sharded(name, params, w)
        if rank == w - 1:
            model[1].register_forward_hook(lambda mod, args, out: _NanBackward.apply(out))
        model(_input(rank)).square().mean().backward()
        found = state.pop_nonfinite_buckets()
        if rank == w - 1:
            assert sorted(b.bucket_index for b in found) == [0, 1], (name, found)
            layer1 = next(b for b in found if b.bucket_index == 1)
            assert {id(p) for p in layer1.parameters} == {id(p) for p in model[1].parameters()}
        else:
            assert found == [], (name, found)
    return {}


def check_state_round_trip(rank: int, w: int) -> dict:
    """A checkpointed state resumes the same residuals and counters."""
    model, state = _sharded("bf16_compress", {"error_feedback": True, "all_gather": "bf16"}, w)
    model(_input(rank)).square().mean().backward()
    fresh, _ = hooks.fsdp.build("bf16_compress", error_feedback=True, all_gather="bf16")
    fresh.load_state_dict(copy.deepcopy(state.state_dict()))
    assert fresh.stats() == state.stats()
    assert all(torch.equal(fresh.module_residuals[i], r) for i, r in state.module_residuals.items())
    return {}


def run_checks(rank: int, w: int, checks: list) -> dict:
    return _run(rank, w, checks, where=globals())


__all__ = ["run_checks", "dist"]
