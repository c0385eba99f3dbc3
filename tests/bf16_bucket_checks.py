"""Checks, inside real gloo processes, that every hook averages bf16 buckets correctly (the
buckets DDP builds for a model trained with ``precision: bf16``). Spawned by
tests/test_training_options.py; each function is ``check(rank, world_size)``."""
from __future__ import annotations

import torch
import torch.distributed as dist

import hooks
from tests.hooks_checks import Bucket

# The hooks with settings that exercise them on a small bucket: every registered hook, the
# cast and quantizing ones also with error feedback (their residual is kept per bucket).
SHAPES = [(40, 30), (30,), (17, 5), (300,)]
N = sum(torch.Size(s).numel() for s in SHAPES)


def configurations() -> list[tuple[str, dict]]:
    out = []
    for name, spec in hooks.available().items():
        if spec.periodic:  # its DDP call keeps the gradient local: no mean to check (tests/test_local_sgd.py)
            continue
        params = {}
        if "chunk_size" in spec.params:
            params["chunk_size"] = 64
        if name == "powersgd":
            params.update(start_iter=2, rank=2)
        out.append((name, params))
        if "error_feedback" in spec.params and name != "powersgd":
            out.append((name, {**params, "error_feedback": True}))
    return out


def _inputs(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(N, generator=g) * torch.linspace(0.01, 3.0, N)).to(torch.bfloat16)


def _run(name: str, params: dict, rank: int, w: int, dtype: torch.dtype, steps: int = 4):
    """``steps`` calls of the hook on buckets of ``dtype`` (one parameter list throughout, as
    DDP's buckets keep theirs, so error feedback carries over); per step the output dtype and
    its max error against the exact fp32 mean of the (bf16-valued) inputs, relative to the
    mean's max."""
    state, hook = hooks.build(name, **params)
    params_of_bucket = None
    errors, dtypes = [], []
    for step in range(steps):  # powersgd: exact before start_iter=2 (its hook counts the steps)
        exact = torch.stack([_inputs(r, step).float() for r in range(w)]).mean(0)
        bucket = Bucket(_inputs(rank, step).to(dtype), index=0, shapes=SHAPES)
        if params_of_bucket is None:
            params_of_bucket = bucket._params
        bucket._params = params_of_bucket
        out = hook(state, bucket).wait()
        dtypes.append(out.dtype)
        errors.append(float((out.float() - exact).abs().max() / exact.abs().max()))
    return state, hook, params_of_bucket, errors, dtypes


def check_bf16_buckets(rank: int, w: int) -> dict:
    """Per configuration, for bf16 buckets and for fp32 buckets holding the same values: the
    output dtypes and errors per step (see _run), whether any input was flagged non-finite,
    and, for a bf16 bucket holding a NaN on rank 1 only, which ranks flag it and whether the
    output is non-finite (so the NaN check cannot miss it)."""
    results = {}
    for name, params in configurations():
        state, hook, bucket_params, errors, dtypes = _run(name, params, rank, w, torch.bfloat16)
        _, _, _, fp32_errors, _ = _run(name, params, rank, w, torch.float32)
        clean = not state.pop_nonfinite_buckets()
        poisoned = _inputs(rank, 9)
        if rank == 1:
            poisoned[5] = float("nan")
        bucket = Bucket(poisoned, index=0, shapes=SHAPES)
        bucket._params = bucket_params
        out = hook(state, bucket).wait()
        results[f"{name}{'+ef' if params.get('error_feedback') else ''}"] = {
            "dtypes": [str(d) for d in dtypes], "errors": errors, "fp32_errors": fp32_errors,
            "clean_inputs_unflagged": clean,
            "flagged": [b.bucket_index for b in state.pop_nonfinite_buckets()],
            "nan_output_nonfinite": not bool(torch.isfinite(out.float()).all()),
        }
    return results
