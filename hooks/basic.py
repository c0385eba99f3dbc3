"""Exact and cast-compression hooks: allreduce, allgather_then_aggregate, fp16/bf16_compress.

Each hook is a plain function ``(state, bucket) -> Future[Tensor]`` whose result is the mean of
the bucket over the ranks of ``state.group``, written back into the bucket's buffer.
"""

import torch
import torch.distributed as dist

from .finite import divide_flagging_nonfinite
from . import sharded
from .spec import HookSpec, ShardedForm, error_feedback
from .state import HookState


class CastState(HookState):
    """State of fp16_compress / bf16_compress: the wire dtype."""

    def __init__(self, dtype: torch.dtype, process_group=None, error_feedback: bool = False):
        super().__init__(process_group, error_feedback)
        self.dtype = dtype


def allreduce(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Mean by ring allreduce: divide by W, allreduce in place, return the collective's future.

    Exact (equal to torch's ``allreduce_hook`` bit for bit). Wire: 2(W-1)/W * 4N bytes per rank.
    """
    t0 = state.begin(bucket, check_input=False)
    buf = bucket.buffer()
    # The divide reads every element anyway: on CPU float32 it also answers the input flag.
    state.flag_input(bucket, divide_flagging_nonfinite(buf, state.world_size()))
    state.account("allreduce", buf.numel() * buf.element_size())
    fut = dist.all_reduce(buf, group=state.group, async_op=True).get_future()
    # DDP's Python hook path needs a future holding a tensor; the collective's own future holds
    # a list of tensors (DDP asserts on it), so unwrap it: the result is the bucket itself.
    return state.finish(fut, t0, _first)


def _first(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()[0]


def allgather_then_aggregate(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Mean by allgather: every rank receives every bucket and averages locally.

    Exact to float rounding (sum of W vectors, divided by W). Wire: (W-1) * 4N bytes per rank,
    W/2 times a ring allreduce's: this hook is the baseline the allgather-based quantizers pay.
    """
    t0 = state.begin(bucket)
    buf = bucket.buffer()
    w = state.world_size()
    gathered = buf.new_empty((w * buf.numel(),))
    state.account("allgather", buf.numel() * buf.element_size())
    fut = dist.all_gather_single(gathered, buf, group=state.group, async_op=True).get_future()

    def aggregate(fut):
        fut.value()  # re-raises a failed collective: never average what never arrived
        torch.sum(gathered.view(w, -1), dim=0, out=buf)
        return buf.div_(w)

    return state.finish(fut, t0, aggregate)


def cast_compress(state: CastState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Mean by allreduce in a 16-bit dtype: cast to ``state.dtype``, divide by W, allreduce, cast back.

    Same operations as torch's ``fp16_compress_hook`` / ``bf16_compress_hook`` (bit for bit).
    Lossy: relative error about 2^-11 (fp16) / 2^-8 (bf16) per element and per addition; fp16
    turns values beyond +-65504 into inf. Wire: 2(W-1)/W * 2N bytes per rank.
    With error feedback, the rounding error of this rank's contribution is carried into the next step.
    """
    t0 = state.begin(bucket)
    buf = bucket.buffer()
    w = state.world_size()
    x = state.add_residual(bucket, buf)
    # copy=True: on a bucket already in the wire dtype (bf16 weights) .to() would return the
    # bucket itself, and the residual below would be computed from the divided bucket
    compressed = x.to(state.dtype, copy=True).div_(w)
    if state.error_feedback:
        state.store_residual(bucket, x - compressed.to(x.dtype) * w)
    state.account("allreduce", compressed.numel() * compressed.element_size())
    fut = dist.all_reduce(compressed, group=state.group, async_op=True).get_future()

    def decompress(fut):
        fut.value()  # re-raises a failed collective (else this rank's own bucket passes as the mean)
        # Decompress in place into the bucket (as torch does): DDP copies the result into the grads.
        return buf.copy_(compressed)

    return state.finish(fut, t0, decompress)


def fp16_compress(state: CastState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """fp16 cast compression (see :func:`cast_compress`)."""
    return cast_compress(state, bucket)


def bf16_compress(state: CastState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """bf16 cast compression (see :func:`cast_compress`)."""
    return cast_compress(state, bucket)


def _exact_state(process_group) -> HookState:
    return HookState(process_group)


def _cast_state(dtype: torch.dtype):
    def make_state(process_group, error_feedback: bool) -> CastState:
        return CastState(dtype, process_group, error_feedback=error_feedback)

    return make_state


def _fp32_allreduce(n, world_size, element_size):
    return [("allreduce", n * element_size)]


def _fp32_allgather(n, world_size, element_size):
    return [("allgather", n * element_size)]


def _16bit_allreduce(n, world_size, element_size, **_):
    return [("allreduce", 2 * n)]


def _cast_sharded(dtype: torch.dtype) -> ShardedForm:
    return ShardedForm(reduce_scatter=sharded.cast_reduce_scatter, make_state=sharded.state_factory(wire_dtype=dtype),
                       collectives=sharded.cast_collectives, parameters=sharded.all_gather_parameters(),
                       doc="gradient reduce-scatter in 16 bits (divide by W first)")


SPECS = [
    HookSpec(name="allreduce", hook=allreduce, make_state=_exact_state, collectives=_fp32_allreduce,
             doc="fp32 ring allreduce of the mean (exact; DDP's default)",
             sharded=ShardedForm(reduce_scatter=sharded.fp32_reduce_scatter, make_state=sharded.state_factory(),
                                 collectives=sharded.fp32_collectives, parameters=sharded.all_gather_parameters(),
                                 doc="FSDP's own fp32 reduce-scatter (exact)")),
    HookSpec(name="allgather_then_aggregate", hook=allgather_then_aggregate, make_state=_exact_state,
             collectives=_fp32_allgather, decodes_each_rank=True, doc="allgather every rank's bucket, average locally (exact)"),
    HookSpec(name="fp16_compress", hook=fp16_compress, make_state=_cast_state(torch.float16),
             collectives=_16bit_allreduce, parameters=error_feedback(), wire_bits=16, lossy=True,
             doc="allreduce in float16 (2 bytes/float)", sharded=_cast_sharded(torch.float16)),
    HookSpec(name="bf16_compress", hook=bf16_compress, make_state=_cast_state(torch.bfloat16),
             collectives=_16bit_allreduce, parameters=error_feedback(), wire_bits=16, lossy=True,
             doc="allreduce in bfloat16 (2 bytes/float)", sharded=_cast_sharded(torch.bfloat16)),
]
