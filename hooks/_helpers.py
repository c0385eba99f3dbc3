"""What hooks are written with: the opening every compressing hook shares, the allgather of a
uint8 message, decoding W gathered messages into the bucket, a bucket's layout, the 16-bit wire
dtypes. Private to hooks/.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from .spec import Param, choice
from .state import HookState

# wire_dtype values: the dtype values travel in (None: the bucket's own, no cast).
WIRE_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def wire_dtype_param() -> dict[str, Param]:
    """The ``wire_dtype`` parameter of hooks whose values can travel in 16 bits."""
    return {"wire_dtype": choice("fp32", tuple(WIRE_DTYPES), "the dtype values travel in; fp32: no 16-bit cast")}


def wire_element_size(wire_dtype: str, element_size: int) -> int:
    """Bytes per value on the wire under ``wire_dtype`` for a bucket of ``element_size``-byte elements."""
    dtype = WIRE_DTYPES[wire_dtype]
    return element_size if dtype is None else torch.empty((), dtype=dtype).element_size()


def param_layout(params: list) -> tuple:
    """A process-independent description of a bucket's layout: the parameter shapes in order."""
    return tuple(tuple(p.shape) for p in params)


class Call(NamedTuple):
    """What a hook starts from (:func:`start_call`)."""

    t0: float  # hook entry (for finish)
    buf: torch.Tensor  # the bucket's flat buffer
    world_size: int
    n: int  # elements in the bucket
    x: torch.Tensor  # what this rank contributes: the bucket, plus its residual under error feedback


def start_call(state: HookState, bucket, check_input: bool = True) -> Call:
    """The opening every compressing hook shares: ``begin`` (count, flag the input unless the hook
    will), then the bucket with the previous step's residual added under error feedback."""
    t0 = state.begin(bucket, check_input)
    buf = bucket.buffer()
    return Call(t0, buf, state.world_size(), buf.numel(), state.add_residual(bucket, buf))


def as_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` flat in float32 (itself when it already is)."""
    flat = x.reshape(-1)
    return flat if flat.dtype == torch.float32 else flat.to(torch.float32)


def decode_gathered(buf: torch.Tensor, gathered: torch.Tensor, world_size: int, scale_count: int, fill) -> torch.Tensor:
    """The bucket holding the result decoded from W gathered messages, each ``scale_count``
    float32 scales followed by a payload: ``fill(payloads (W, bytes), scales (W, C), out)``
    writes the result into ``out`` (flat float32; the bucket itself when it can be)."""
    rows = gathered.view(world_size, -1)
    total = float32_out(buf)
    fill(rows[:, 4 * scale_count :], leading_floats(rows, scale_count), total.view(-1))
    return into_bucket(buf, total)


def allgather_message(state: HookState, message: torch.Tensor) -> tuple[torch.Tensor, torch.futures.Future]:
    """Issue the allgather of this rank's uint8 ``message`` (accounted): ``(gathered, future)``,
    gathered flat (gloo wants a 1-D output), row r = rank r's message once the future is done."""
    gathered = message.new_empty((state.world_size() * message.numel(),))
    state.account("allgather", message.numel())
    return gathered, dist.all_gather_single(gathered, message, group=state.group, async_op=True).get_future()


def float32_out(buf: torch.Tensor) -> torch.Tensor:
    """Where to sum a decoded mean: the bucket itself when it is contiguous float32 (no
    temporary), else a float32 scratch to copy back."""
    if buf.dtype == torch.float32 and buf.is_contiguous():
        return buf
    return torch.empty(buf.numel(), dtype=torch.float32, device=buf.device)


def into_bucket(buf: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """The bucket holding the mean summed in ``total`` (from :func:`float32_out`)."""
    return total if total is buf else buf.copy_(total.view_as(buf))


def leading_floats(rows: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` float32 values of each uint8 row of a gathered message, (W, count):
    copied out, since row r's bytes start at r * row length, not always 4-byte aligned."""
    return rows.new_empty((rows.shape[0], 4 * count)).copy_(rows[:, : 4 * count]).view(torch.float32)
