"""Chunked uint8 min/max quantization: fused CPU kernels with a device-agnostic torch fallback.

A float vector of N elements is cut into C = ceil(N / chunk_size) chunks of consecutive
elements (the last one may be shorter; nothing is padded). Each chunk is stored as ``lo`` (its
minimum), ``step = (max - min) / 255`` and one uint8 code per element,
``q = trunc((x - lo) / step + 0.5)`` (round half up); it dequantizes to ``lo + q * step``.
Codes are flat, one per element (N of them); meta is (C, 2) float32 ``(lo, step)``.

Error: ``|dequantize(quantize(x)) - x| <= step / 2`` per element (plus float32 rounding), and
codes always lie in 0..255: ``x - lo <= max - min`` and ``1/step`` is rounded from ``255/(max - min)``,
so ``(x - lo) / step + 0.5 < 255.5 + 1e-4``. Edge cases, the same on both backends:

* a constant chunk (max == min, e.g. all zeros) has step 0: codes 0, dequantizes to ``lo`` exactly;
* a chunk whose range is below ``255 * FLT_MIN`` (~3e-36; step would be subnormal) is stored
  like a constant one: error at most that range;
* a chunk whose range overflows float32 (max - min > 3.4e38) gets ``step = max/255 - min/255``
  and its codes are computed on halved values (exact), so they stay in 0..255; values whose
  ``q * step`` exceeds 3.4e38 dequantize to +inf;
* a chunk holding NaN or +-inf gets a non-finite step (lo and step NaN where a NaN is present,
  as ``torch.aminmax``), so every element of it dequantizes to a non-finite value; its codes are
  unspecified.

Backends (``kernel_backend()`` says which one runs for CPU float32 tensors):

* ``native``: hooks/_native.py, C compiled once with the system compiler, one L1-resident pass
  per chunk for quantize and one fused pass for dequantize(-and-accumulate). CPU float32 only.
* ``torch``: eager PyTorch, any device (CUDA/NCCL included): ``aminmax`` per chunk, then
  in-place scale and shift of one float scratch and a truncating cast, no padding copy.

Both give bit-identical codes and meta (tests/test_quantize_kernels.py). The native one is used
for contiguous-able CPU float32 inputs unless ``HOOKS_NATIVE_KERNELS=0`` or no compiler is
available; everything else takes the torch path.
"""
from __future__ import annotations

import torch

from . import _native

LEVELS = 255  # uint8 codes 0..255
FLT_MIN = torch.finfo(torch.float32).tiny
FLT_MAX = torch.finfo(torch.float32).max


def num_chunks(n: int, chunk_size: int) -> int:
    return -(-n // chunk_size)


def kernel_backend() -> str:
    """'native' when the fused C kernels are loaded (built on first call), else 'torch'."""
    return "native" if _native.library() is not None else "torch"


def native_unavailable_reason() -> str | None:
    """Why the native kernels are not used (None when they are)."""
    return _native.unavailable_reason()


def _use_native(backend: str | None, *tensors: torch.Tensor) -> bool:
    if backend == "torch":
        return False
    cpu = all(t.device.type == "cpu" for t in tensors)
    if backend == "native":
        if _native.library() is None:
            raise RuntimeError(f"native kernels unavailable: {_native.unavailable_reason()}")
        if not cpu:
            raise ValueError("native kernels take CPU tensors only")
        return True
    if backend is not None:
        raise ValueError(f"backend must be None, 'native' or 'torch', not {backend!r}")
    return cpu and _native.library() is not None


def _chunk_scalars(lo: torch.Tensor, hi: torch.Tensor):
    """Per-chunk (step, h, inv_h, -lo*h), as the C kernel computes them (same float32 ops)."""
    d = hi - lo
    overflow = torch.isinf(d)
    step = torch.where(overflow, hi / LEVELS - lo / LEVELS, d / LEVELS)
    h = torch.where(overflow, 0.5, 1.0).to(lo.dtype)
    usable = (step >= FLT_MIN) & (step <= FLT_MAX)
    inv_h = torch.where(usable, torch.div(1.0, step) / h, 0.0).to(lo.dtype)
    nlo_h = torch.where(usable, -lo * h, 0.0).to(lo.dtype)
    return step, h, inv_h, nlo_h


def _quantize_torch(x: torch.Tensor, chunk: int, codes: torch.Tensor, meta: torch.Tensor) -> None:
    n = x.numel()
    full = n // chunk
    parts = []  # (values view (rows, len), codes view (rows, len)) for the whole chunks and the tail
    if full:
        parts.append((x[: full * chunk].view(full, chunk), codes[: full * chunk].view(full, chunk)))
    if n > full * chunk:
        parts.append((x[full * chunk :].view(1, -1), codes[full * chunk :].view(1, -1)))
    los, his = zip(*(torch.aminmax(v, dim=1) for v, _ in parts))
    lo, hi = torch.cat(los), torch.cat(his)
    step, h, inv_h, nlo_h = _chunk_scalars(lo, hi)
    meta[:, 0] = lo
    meta[:, 1] = step
    row = 0
    for values, out in parts:
        rows = slice(row, row + values.shape[0])
        row += values.shape[0]
        # (x*h - lo*h) then (.. * inv_h + 0.5): subtract before scaling, so a chunk far from 0
        # (|lo| >> max - min) keeps its resolution; truncation of a value in [0, 255.5] rounds.
        # x*h is exact (h is 1 or 0.5), so addcmul rounds once whether or not it fuses; the
        # scaling and the +0.5 are separate ops so they round twice on every CPU/GPU, as in C.
        t = torch.addcmul(nlo_h[rows, None], values, h[rows, None])
        t.mul_(inv_h[rows, None]).add_(0.5)
        out.copy_(t)  # truncating cast; NaN only in non-finite chunks, whose codes are unspecified


def quantize(
    x: torch.Tensor,
    chunk_size: int,
    *,
    codes: torch.Tensor | None = None,
    meta: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize the elements of ``x`` (any shape, read flat) per chunk of ``chunk_size``.

    Returns ``(codes, meta)``: ``codes`` uint8 (N,), ``meta`` float32 (C, 2) of ``(lo, step)``.
    ``codes``/``meta`` may be given (contiguous, right sizes, e.g. views into a message buffer)
    to be written in place. ``backend``: None (native when possible), 'native' or 'torch'.
    """
    x = x.reshape(-1)
    if x.dtype != torch.float32:
        x = x.to(torch.float32)
    n = x.numel()
    if n == 0:
        raise ValueError("cannot quantize an empty tensor")
    c = num_chunks(n, chunk_size)
    if codes is None:
        codes = torch.empty(n, dtype=torch.uint8, device=x.device)
    if meta is None:
        meta = torch.empty((c, 2), dtype=torch.float32, device=x.device)
    if codes.numel() != n or meta.numel() != 2 * c:
        raise ValueError(f"codes/meta of {codes.numel()}/{meta.numel()} elements for n={n}, C={c}")
    if _use_native(backend, x, codes, meta):
        x = x.contiguous()
        if not (codes.is_contiguous() and meta.is_contiguous()):
            raise ValueError("codes and meta outputs must be contiguous")
        _native.library().hooks_quantize_f32(x.data_ptr(), n, chunk_size, codes.data_ptr(), meta.data_ptr())
    else:
        _quantize_torch(x, chunk_size, codes.view(-1), meta.view(c, 2))
    return codes, meta.view(c, 2)


def dequantize(
    codes: torch.Tensor,
    meta: torch.Tensor,
    chunk_size: int,
    *,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """Inverse of :func:`quantize`: ``lo + q * step`` per element, float32 (N,).

    ``codes`` (N,) uint8, ``meta`` (C, 2). With ``out`` the values are written there (e.g. the
    bucket's buffer); with ``accumulate=True`` they are added to ``out`` (one pass, no temporary).
    """
    codes = codes.reshape(-1)
    n = codes.numel()
    c = num_chunks(n, chunk_size)
    meta = meta.reshape(c, 2)
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs out")
        out = torch.empty(n, dtype=torch.float32, device=codes.device)
    flat = out.view(-1)
    if flat.numel() != n or flat.dtype != torch.float32:
        raise ValueError(f"out must hold {n} float32, not {flat.numel()} {flat.dtype}")
    if _use_native(backend, codes, meta, flat) and flat.is_contiguous():
        codes, meta = codes.contiguous(), meta.contiguous()
        _native.library().hooks_dequantize_f32(codes.data_ptr(), meta.data_ptr(), n, chunk_size, flat.data_ptr(), int(accumulate))
        return out
    full = n // chunk_size
    spans = []
    if full:
        spans.append((0, full, full * chunk_size))
    if n > full * chunk_size:
        spans.append((full, c, n))
    start = 0
    for row0, row1, stop in spans:
        rows = row1 - row0
        q = codes[start:stop].view(rows, -1)
        lo, step = meta[row0:row1, 0:1], meta[row0:row1, 1:2]
        dest = flat[start:stop].view(rows, -1)
        # Not addcmul: it fuses the multiply-add on some CPUs and not on others; mul then add
        # round twice everywhere, like the C kernel.
        if accumulate:
            dest.add_(q.to(torch.float32).mul_(step).add_(lo))
        else:
            dest.copy_(q).mul_(step).add_(lo)
        start = stop
    return out


def nonfinite_chunks(meta: torch.Tensor) -> torch.Tensor:
    """A 0-dim bool tensor: did the quantized values hold NaN or +-inf? Exact: a chunk holds one
    exactly when its ``(lo, step)`` is non-finite (the edge cases above; a finite chunk whose
    range overflows still gets a finite step), so C pairs answer for N values."""
    return meta.isfinite().all().logical_not()


def message_views(n: int, chunk_size: int, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An empty packed message (uint8, :func:`message_bytes` long) and its ``(codes, meta)``
    views, to quantize straight into. Layout: the C (lo, step) float32 pairs as bytes, then the
    N codes (the same as :func:`pack`)."""
    c = num_chunks(n, chunk_size)
    buf = torch.empty(message_bytes(n, chunk_size), dtype=torch.uint8, device=device)
    return buf, buf[8 * c :], buf[: 8 * c].view(torch.float32).view(c, 2)


def pack(codes: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    """One uint8 message per row: the (lo, step) floats as bytes, then the codes. ``codes``
    (..., N), ``meta`` (..., C, 2) -> (..., 8C + N), a copy (prefer :func:`message_views` to
    quantize straight into a single message)."""
    lead = codes.shape[:-1]
    return torch.cat([meta.reshape(*lead, -1).view(torch.uint8), codes.reshape(*lead, -1)], dim=-1)


def unpack(messages: torch.Tensor, n: int, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split gathered messages (R, 8C + n) into codes (R, n) (views) and meta (R, C, 2) (a copy)."""
    r = messages.shape[0]
    c = num_chunks(n, chunk_size)
    # A fresh copy: viewing bytes as floats needs 4-byte aligned rows, which a slice may not have.
    meta = messages.new_empty((r, 8 * c)).copy_(messages[:, : 8 * c]).view(torch.float32).view(r, c, 2)
    return messages[:, 8 * c :], meta


def message_bytes(n: int, chunk_size: int) -> int:
    """Bytes of one packed message for n floats: 8 per chunk (lo, step) + 1 per element."""
    return 8 * num_chunks(n, chunk_size) + n


def mean_of_messages(received: torch.Tensor, n: int, chunk_size: int, out: torch.Tensor) -> torch.Tensor:
    """A quantized reduce-scatter's receiving end (quantized_allreduce's phase 2, FSDP's uint8
    reduce-scatter): the packed messages of ``n`` values this rank received, the rows of
    ``received``, dequantized and summed in float32 into ``out``, divided by their count."""
    codes, meta = unpack(received, n, chunk_size)
    for r in range(received.shape[0]):
        dequantize(codes[r], meta[r], chunk_size, out=out, accumulate=r > 0)
    return out.div_(received.shape[0])
