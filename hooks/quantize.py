"""Chunked uint8 min/max quantization, vectorised (no Python loop over chunks or ranks).

A float vector of N elements is cut into C = ceil(N / chunk_size) chunks of consecutive
elements (the last chunk padded with copies of the last element, so padding never widens its
range). Each chunk is stored as ``lo`` (its minimum), ``step = (max - min) / 255`` and one uint8
code per element, ``q = round((x - lo) / step)``; it dequantizes to ``lo + q * step``.

Error: ``|dequantize(quantize(x)) - x| <= step / 2`` per element (plus float32 rounding).
A constant chunk (max == min, e.g. all zeros) has step 0: its codes are 0 and it dequantizes to
``lo`` exactly, with no division by zero. Per-tensor quantization is the case chunk_size >= N.
"""
from __future__ import annotations

import torch

LEVELS = 255  # uint8 codes 0..255


def num_chunks(n: int, chunk_size: int) -> int:
    return -(-n // chunk_size)


def quantize(x: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 1-D float tensor per chunk.

    Returns ``(codes, meta)``: ``codes`` uint8 of shape (C, chunk_size) (padded; the first N
    codes in row-major order are the real ones), ``meta`` float32 of shape (C, 2) holding
    ``(lo, step)`` per chunk.
    """
    x = x.to(torch.float32)
    n = x.numel()
    c = num_chunks(n, chunk_size)
    pad = c * chunk_size - n
    if pad:
        x = torch.cat([x, x[-1:].expand(pad)])
    chunks = x.view(c, chunk_size)
    lo, hi = torch.aminmax(chunks, dim=1)
    # hi/255 - lo/255 rather than (hi - lo)/255: the difference of two huge floats could overflow.
    step = hi / LEVELS - lo / LEVELS
    inv_step = torch.where(step > 0, step.reciprocal(), torch.zeros_like(step))
    codes = (chunks - lo[:, None]).mul_(inv_step[:, None]).round_().clamp_(0, LEVELS).to(torch.uint8)
    return codes, torch.stack([lo, step], dim=1)


def dequantize(codes: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize` for any leading batch shape.

    ``codes`` uint8 (..., C, chunk_size), ``meta`` float32 (..., C, 2) -> float32 (..., C, chunk_size).
    """
    return torch.addcmul(meta[..., 0:1], codes.to(torch.float32), meta[..., 1:2])


def pack(codes: torch.Tensor, meta: torch.Tensor, n: int) -> torch.Tensor:
    """One uint8 message: the (lo, step) floats as bytes, then the first ``n`` codes."""
    return torch.cat([meta.reshape(-1).view(torch.uint8), codes.reshape(-1)[:n]])


def unpack(messages: torch.Tensor, n: int, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split gathered messages (R, 8C + n) back into codes (R, C, chunk_size) and meta (R, C, 2)."""
    r = messages.shape[0]
    c = num_chunks(n, chunk_size)
    # A fresh copy: viewing bytes as floats needs 4-byte aligned rows, which a slice may not have.
    meta = messages.new_empty((r, 8 * c)).copy_(messages[:, : 8 * c]).view(torch.float32).view(r, c, 2)
    codes = messages.new_zeros((r, c * chunk_size))
    codes[:, :n] = messages[:, 8 * c :]
    return codes.view(r, c, chunk_size), meta


def message_bytes(n: int, chunk_size: int) -> int:
    """Bytes of one packed message for n floats: 8 per chunk (lo, step) + 1 per element."""
    return 8 * num_chunks(n, chunk_size) + n
