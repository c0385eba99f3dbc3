"""Sparsifying hooks: topk and randomk (each rank sends k = ceil(ratio * N) values per bucket).

``topk``: every rank keeps the k largest-magnitude values of its bucket (its own index set) and
sends (index, value) pairs, int32 + float32, in one allgather; every rank then adds the W sparse
contributions into a zeroed bucket and divides by W (the mean of the sparse contributions,
densified). Wire per rank: (W-1) * 8k bytes. Biased: what a rank leaves out is lost unless error
feedback carries it into the next step. Error per element: (1/W) * sum over the ranks that did
not keep it of |x_r[i]|, so at most the mean over ranks of min(|x_r[i]|, tau_r), tau_r = rank r's
k-th largest magnitude; exact where every rank kept all of its nonzeros (k >= their count).

``randomk``: all ranks keep the same k indices, drawn afresh every call from a seed that is the
same on every rank (the number of calls so far): one uniformly random index in each of k equal
strata of the bucket (systematic sampling: every element is kept with probability ~k/N, the
indices are distinct and cost O(k) to draw, where ``torch.randperm(N)`` costs O(N) per call:
docs/hooks.md, "Benchmark"). Because the index set is shared, no indices travel: a plain ring allreduce of the k
values suffices. Wire per rank: 2(W-1)/W * 4k bytes. Biased (no N/k rescaling, as GRACE's
RandomK): the result is the exact mean on the kept indices and 0 elsewhere; exact at ratio 1.

``wire_dtype: fp16 | bf16`` (both hooks): the k values travel in 16 bits (topk: (W-1) * 6k bytes,
int32 indices + 16-bit values; randomk: 2(W-1)/W * 2k, cast then divided by W then summed in the
16-bit dtype, as ``fp16_compress``: at ratio 1 it equals that hook bit for bit); the mean is
summed in float32 from the decoded values.

The densified result is written into the bucket (float32 buckets; others through a float32
temporary). With error feedback each rank keeps what it did not send (its bucket with the sent
indices zeroed; under a 16-bit wire, their rounding error) for the next step.
"""
import math

import torch
import torch.distributed as dist

from .spec import HookSpec, error_feedback, real
from ._helpers import WIRE_DTYPES, as_float32, float32_out, into_bucket, start_call, wire_dtype_param, wire_element_size
from .state import HookState, SeededState

# randomk's index draws: seed = _SEED_BASE + calls so far, the same on every rank.
_SEED_BASE = 0x5EED_0000


def num_selected(n: int, ratio: float) -> int:
    """k for a bucket of n elements: ceil(ratio * n), at least 1, at most n (float noise trimmed:
    0.07 * 100 is 7.000000000000001 in binary floating point and must give 7, not 8)."""
    return min(n, max(1, math.ceil(ratio * n * (1 - 1e-12))))


class SparsifyState(SeededState):
    """State of topk / randomk: ``ratio`` and, for randomk, the number of index draws so far
    (it seeds the next draw; kept in checkpoints so a resumed run draws the same indices)."""

    def __init__(self, ratio: float, wire_dtype: str, process_group=None, error_feedback: bool = False):
        super().__init__(process_group, error_feedback)
        self.ratio = float(ratio)
        self.wire_dtype = WIRE_DTYPES[wire_dtype] or torch.float32  # the values are sent as float32 by default


def _store_unsent(state: HookState, bucket, x: torch.Tensor, idx: torch.Tensor, carried=None) -> None:
    """The residual: ``x`` where nothing was sent; where ``carried`` (float32) was, ``x`` minus it
    (None: sent exactly, 0 there)."""
    residual = x.reshape(-1).clone()
    if carried is None:
        residual.index_fill_(0, idx, 0)
    else:
        residual.index_copy_(0, idx, (residual.index_select(0, idx).to(torch.float32) - carried).to(residual.dtype))
    state.store_residual(bucket, residual)


def topk(state: SparsifyState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Per rank the k = ceil(ratio * N) largest |values|, (index, value) pairs by allgather,
    mean of the sparse contributions densified; see the module doc."""
    t0, buf, w, n, x = start_call(state, bucket)
    if n >= 2**31:
        raise ValueError(f"topk: a bucket of {n} elements does not fit int32 indices")
    k = num_selected(n, state.ratio)
    xf = as_float32(x)
    idx = xf.abs().topk(k, sorted=False).indices
    # One uint8 message: k int32 indices, then the k values in the wire dtype (float32: bit for bit).
    message = torch.empty(k * (4 + state.wire_dtype.itemsize), dtype=torch.uint8, device=buf.device)
    message[: 4 * k].view(torch.int32).copy_(idx)
    values = message[4 * k :].view(state.wire_dtype)
    values.copy_(xf.index_select(0, idx))
    if state.error_feedback:
        _store_unsent(state, bucket, x, idx, None if state.wire_dtype == torch.float32 else values.to(torch.float32))
    gathered = message.new_empty((w * message.numel(),))
    state.account("allgather", message.numel())
    fut = dist.all_gather_single(gathered, message, group=state.group, async_op=True).get_future()

    def densify(done: torch.futures.Future) -> torch.Tensor:
        done.value()  # re-raises if the allgather failed
        rows = gathered.view(w, -1)
        # copied out: row r's indices start at r * row bytes, not always 4-byte aligned
        indices = rows[:, : 4 * k].contiguous().view(torch.int32)
        total = float32_out(buf)
        flat = total.view(-1).zero_()
        # Rank by rank: a rank's indices are distinct, so each index_add_ has no colliding adds
        # and the sum order is the same on every rank and device (atomics on GPUs included).
        for r in range(w):
            flat.index_add_(0, indices[r].long(), rows[r, 4 * k :].view(state.wire_dtype).to(torch.float32))
        flat.div_(w)
        return into_bucket(buf, total)

    return state.finish(fut, t0, densify)


def strata_indices(n: int, k: int, generator: torch.Generator, device=None) -> torch.Tensor:
    """k distinct int64 indices in [0, n): one uniformly random index in each stratum
    [floor(j n / k), floor((j+1) n / k)), j = 0..k-1 (sorted; all of 0..n-1 when k == n)."""
    bounds = torch.arange(k + 1, dtype=torch.int64, device=device).mul_(n).div_(k, rounding_mode="floor")
    starts, lengths = bounds[:-1], bounds[1:] - bounds[:-1]  # every length >= 1 as k <= n
    u = torch.rand(k, generator=generator, dtype=torch.float64, device=device)
    offsets = torch.minimum(u.mul_(lengths).long(), lengths - 1)  # u * len may round up to len
    return starts + offsets


def randomk(state: SparsifyState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The same k random indices on every rank (seeded by the call count), allreduce of the k
    values, mean densified; see the module doc."""
    t0, buf, w, n, x = start_call(state, bucket)
    k = num_selected(n, state.ratio)
    xf = as_float32(x)
    g = torch.Generator(device=buf.device)
    g.manual_seed(_SEED_BASE + state.draws)
    state.draws += 1
    idx = strata_indices(n, k, g, device=buf.device)
    # as the allreduce hook (fp16_compress under a 16-bit wire): cast, divide, then sum; at ratio 1
    # it equals that hook bit for bit
    values = xf.index_select(0, idx).to(state.wire_dtype).div_(w)
    if state.error_feedback:
        _store_unsent(state, bucket, x, idx, None if state.wire_dtype == torch.float32 else values.to(torch.float32) * w)
    state.account("allreduce", values.numel() * values.element_size())
    fut = dist.all_reduce(values, group=state.group, async_op=True).get_future()

    def densify(done: torch.futures.Future) -> torch.Tensor:
        done.value()  # re-raises if the allreduce failed
        total = float32_out(buf)
        total.view(-1).zero_().index_copy_(0, idx, values.to(torch.float32))
        return into_bucket(buf, total)

    return state.finish(fut, t0, densify)


def _state(process_group, ratio: float, wire_dtype: str, error_feedback: bool) -> SparsifyState:
    return SparsifyState(ratio, wire_dtype, process_group, error_feedback=error_feedback)


def _topk_collectives(n, world_size, element_size, *, ratio, wire_dtype, **_):
    # k int32 indices + k values (float32, or 16-bit)
    return [("allgather", (4 + wire_element_size(wire_dtype, 4)) * num_selected(n, ratio))]


def _randomk_collectives(n, world_size, element_size, *, ratio, wire_dtype, **_):
    # shared indices: only the k values travel
    return [("allreduce", wire_element_size(wire_dtype, 4) * num_selected(n, ratio))]


def _ratio() -> dict:
    return {"ratio": real(0.01, lambda v: 0 < v <= 1, "a number in (0, 1] (the fraction of values each rank sends)"),
            **wire_dtype_param(), **error_feedback()}


SPECS = [
    HookSpec(name="topk", hook=topk, make_state=_state, collectives=_topk_collectives, parameters=_ratio(),
             wire_bits=None, lossy=True, decodes_each_rank=True,
             doc="each rank's ceil(ratio*N) largest |values| as (index, value) pairs by allgather, mean densified (biased)"),
    HookSpec(name="randomk", hook=randomk, make_state=_state, collectives=_randomk_collectives, parameters=_ratio(),
             wire_bits=None, lossy=True,
             doc="the same ceil(ratio*N) random indices on every rank (seeded per call), allreduce of those values (biased)"),
]
