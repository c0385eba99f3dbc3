"""uint8 quantization hooks over allgather: quantization_pertensor, quantization_perchannel.

Every rank quantizes its bucket (one ``(lo, step)`` pair per chunk, see ``hooks.quantize``),
packs the pairs and the codes into one uint8 message, allgathers the messages, and dequantizes
each rank's part with that rank's own scales before averaging. One collective per bucket.

Error per element: at most ``(1/W) * sum_r step_r / 2`` (half a quantization step of each rank,
averaged), where ``step_r = (max - min) / 255`` of rank r's chunk. Constant chunks are exact.
Wire per rank: (W-1) * (N + 8C) bytes, C = ceil(N / chunk_size) (C = 1 per tensor): less than
a fp32 ring allreduce's 8N(W-1)/W only while W < 8.
"""

import torch
import torch.distributed as dist

from . import quantize as q
from .spec import HookSpec, error_feedback, positive_int
from ._helpers import allgather_message, float32_out, into_bucket, start_call
from .state import HookState


class QuantizationState(HookState):
    """State of the quantizing hooks: ``chunk_size`` (None = one chunk per bucket, i.e. per tensor)."""

    def __init__(self, chunk_size: int | None, process_group=None, error_feedback: bool = False):
        super().__init__(process_group, error_feedback)
        self.chunk_size = chunk_size


def _quantize_allgather(state: QuantizationState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    # Without error feedback the quantized values are the input itself, and the per-chunk
    # min/max already tells whether it held NaN/inf (q.nonfinite_chunks): no second read. With
    # it they are input + residual (which may overflow), so the input is read on its own.
    t0, buf, w, n, x = start_call(state, bucket, check_input=state.error_feedback)
    chunk = state.chunk_size or n
    # Quantize straight into the message buffer (meta bytes, then codes): no pack copy.
    message, codes, meta = q.message_views(n, chunk, device=buf.device)
    q.quantize(x, chunk, codes=codes, meta=meta)
    if not state.error_feedback:
        state.flag_input(bucket, q.nonfinite_chunks(meta))
    if state.error_feedback:
        carried = q.dequantize(codes, meta, chunk)
        state.store_residual(bucket, torch.sub(x.to(torch.float32), carried, out=carried).to(x.dtype))
    gathered, fut = allgather_message(state, message)

    def dequantize_and_average(fut):
        fut.value()  # re-raises a failed collective (else `gathered` is uninitialised memory)
        codes_all, meta_all = q.unpack(gathered.view(w, -1), n, chunk)
        # Each rank's contribution is dequantized and summed straight into the bucket (the
        # input was consumed by quantize); float32 buckets need no temporary at all.
        total = float32_out(buf)
        for r in range(w):
            q.dequantize(codes_all[r], meta_all[r], chunk, out=total, accumulate=r > 0)
        total.div_(w)
        return into_bucket(buf, total)

    return state.finish(fut, t0, dequantize_and_average)


def quantization_pertensor(state: QuantizationState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """uint8 min/max quantization with one scale per rank per bucket, exchanged by allgather.

    Wire per rank: (W-1) * (N + 8) bytes. Error per element <= mean over ranks of
    (max_r - min_r) / 510: one large layer in the bucket coarsens every other layer's values.
    """
    return _quantize_allgather(state, bucket)


def quantization_perchannel(state: QuantizationState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """uint8 min/max quantization with one scale per chunk of ``chunk_size`` floats, by allgather.

    Wire per rank: (W-1) * (N + 8 * ceil(N / chunk_size)) bytes. Error per element <= mean over
    ranks of (max - min) / 510 of the element's chunk: each chunk keeps its own resolution.
    """
    return _quantize_allgather(state, bucket)


def _pertensor_state(process_group, error_feedback: bool) -> QuantizationState:
    return QuantizationState(None, process_group, error_feedback=error_feedback)


def _perchannel_state(process_group, chunk_size: int, error_feedback: bool) -> QuantizationState:
    return QuantizationState(chunk_size, process_group, error_feedback=error_feedback)


def _pertensor_collectives(n, world_size, element_size, **_):
    return [("allgather", q.message_bytes(n, n))]


def _perchannel_collectives(n, world_size, element_size, *, chunk_size, **_):
    return [("allgather", q.message_bytes(n, chunk_size))]


SPECS = [
    HookSpec(name="quantization_pertensor", hook=quantization_pertensor, make_state=_pertensor_state,
             collectives=_pertensor_collectives, parameters=error_feedback(), wire_bits=8, lossy=True,
             decodes_each_rank=True,
             doc="uint8 min/max, one scale per bucket, by allgather"),
    HookSpec(name="quantization_perchannel", hook=quantization_perchannel, make_state=_perchannel_state,
             collectives=_perchannel_collectives, parameters={"chunk_size": positive_int(512), **error_feedback()},
             wire_bits=8, chunked=True, lossy=True, decodes_each_rank=True,
             doc="uint8 min/max, one scale per chunk of chunk_size floats, by allgather"),
]
