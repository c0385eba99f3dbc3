"""Exact NaN/inf tests: the one the hooks flag their inputs with and the NaN monitor reads the
weights with (service/train/nan.py), and allreduce's divide that answers it on the way.

CPU float32 tensors go through one fused native pass (hooks/_native.py: ``x - x`` is 0 for
every finite x and NaN for NaN and +-inf, so the pass cannot be fooled by an overflowing sum);
every other tensor takes a torch path. Why a native pass and what each path costs:
docs/performance.md, "Instrumentation".
"""
from __future__ import annotations

import ctypes

import torch

from . import _native

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _native_ready(tensors) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors) \
        and _native.library() is not None


def nonfinite(tensors) -> torch.Tensor:
    """A 0-dim bool tensor: does any of ``tensors`` hold NaN or inf? Exact.

    CPU float32 (contiguous): one native pass over all of them (one call). Other CPU tensors:
    one sum per tensor first (a NaN/inf anywhere makes its sum non-finite, and a sum is one
    read); a non-finite sum can also be finite values that overflowed when added (values near
    1e38), so only then the exact min/max pass decides. On GPUs the min/max pass always runs:
    it needs no host sync there.
    """
    tensors = [t for t in tensors if t is not None and t.numel()]
    if not tensors:
        return torch.tensor(False)
    if _native_ready(tensors):  # reads memory only: no autograd, no detach needed
        k = len(tensors)
        ptrs = (ctypes.c_void_p * k)(*[t.data_ptr() for t in tensors])
        lens = (ctypes.c_int64 * k)(*[t.numel() for t in tensors])
        return torch.tensor(bool(_native.library().hooks_any_nonfinite_f32(ptrs, lens, k)))
    tensors = [t.detach() for t in tensors]
    if tensors[0].device.type == "cpu":
        sums = torch.stack([t.sum(dtype=torch.float32) if t.dtype in _LOW_PRECISION else t.sum()
                            for t in tensors])
        if bool(sums.isfinite().all()):
            return torch.tensor(False)
    extremes = torch.stack([torch.stack(torch.aminmax(t)).float() for t in tensors])
    return extremes.isfinite().all().logical_not()


def divide_flagging_nonfinite(buf: torch.Tensor, divisor: int) -> "bool | torch.Tensor":
    """``buf /= divisor`` in place (torch's ``div_``, bit for bit) and whether ``buf`` held NaN/inf
    before (a bool on CPU, a 0-dim bool tensor elsewhere). A quotient by a finite divisor >= 1 is
    non-finite exactly when the dividend is, so one pass answers both on CPU float32."""
    if _native_ready([buf]):
        return bool(_native.library().hooks_div_nonfinite_f32(buf.data_ptr(), buf.numel(), float(divisor)))
    bad = nonfinite([buf])
    buf.div_(divisor)
    return bad
