"""Per-chunk reductions and per-chunk scaling of a flat vector, without padding copies.

A vector of N elements is cut into C = ceil(N / chunk_size) chunks of consecutive elements
(the last one may be shorter), as in hooks.quantize. Every operation here works on at most two
2-D views, the whole chunks (C_full, chunk_size) and the short tail (1, N mod chunk_size), so it
is a handful of vectorised torch ops whatever C is: never a Python loop over chunks or elements.
Used by the sign and QSGD hooks (hooks/sign.py, hooks/qsgd.py).
"""
from __future__ import annotations

import torch


def num_chunks(n: int, chunk_size: int) -> int:
    return -(-n // chunk_size)


def views(x: torch.Tensor, chunk_size: int) -> list[torch.Tensor]:
    """The flat tensor ``x`` as [(C_full, chunk_size) view, (1, tail) view], empty parts left out."""
    flat = x.view(-1)
    n = flat.numel()
    full = n // chunk_size
    out = []
    if full:
        out.append(flat[: full * chunk_size].view(full, chunk_size))
    if n > full * chunk_size:
        out.append(flat[full * chunk_size :].view(1, -1))
    return out


def reduce(x: torch.Tensor, chunk_size: int, fn) -> torch.Tensor:
    """``fn(view, dim=1)`` per chunk, concatenated: a (C,) tensor (e.g. ``torch.linalg.vector_norm``)."""
    parts = [fn(v, dim=1) for v in views(x, chunk_size)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def scale(values: torch.Tensor, scales: torch.Tensor, chunk_size: int, out: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """``out[i] (+)= values[i] * scales[chunk of i]`` for flat ``values``/``out`` (N,) and ``scales`` (C,).

    ``out`` may be ``values`` itself (in place). Returns ``out``.
    """
    row = 0
    for v, o in zip(views(values, chunk_size), views(out, chunk_size)):
        s = scales[row : row + v.shape[0], None]
        row += v.shape[0]
        if accumulate:
            o.addcmul_(v, s)
        else:
            torch.mul(v, s, out=o)
    return out
