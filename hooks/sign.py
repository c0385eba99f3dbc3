"""signsgd: 1 bit per element plus one scale per chunk, by allgather (EF-signSGD's compressor).

Every rank cuts its bucket into C = ceil(N / chunk_size) chunks and sends, in one uint8 message,
the C scales s_c = mean |x| of the chunk (float32) and one sign bit per element (1 where x < 0;
0 and NaN count as +), packed 8 per byte (``pack_signs``): 4C + ceil(N/8) bytes. Every rank
allgathers the messages and decodes:

* ``majority_vote: false`` (the default): the mean of the W compressed contributions,
  (1/W) * sum_r s_{r,c} * sign(x_r[i]). Biased. Per element and rank the error is
  | s_{r,c} - |x_r[i]| |; exact (to float rounding) for chunks whose |x| is constant, e.g. zeros.
* ``majority_vote: true``: signSGD with majority vote (Bernstein et al. 2019): the sign of the
  sum of the W signs, times the mean over ranks of the chunk's scale (a tie, possible at even W,
  gives 0). Biased; the same bytes on the wire.

Wire per rank: (W-1) * (ceil(N/8) + 4C) bytes, about (W-1)/32 of the bucket's fp32 bytes: less
than a fp32 ring allreduce (8N(W-1)/W) while W < 60 (chunk 512). With error feedback each rank keeps
x - s_c * sign(x), its own compression error (with majority vote the vote's error is no rank's
contribution and is not fed back, as in EF-signSGD).

Bit order (``pack_signs``): bit j (value 2^j) of byte b is element 8b + j, numpy's
``packbits(bitorder="little")``; the last byte's unused bits are 0.
"""
import torch
import torch.distributed as dist

from . import chunks
from .spec import HookSpec, error_feedback, flag, positive_int
from ._helpers import allgather_message, as_float32, decode_gathered, start_call
from .state import HookState

# 8 bytes holding 0/1 each, read as one little-endian int64 v = sum_j b_j 2^(8j): v * _GATHER puts
# b_j at bit 56 + j and every cross term b_j 2^(8j + 56 - 7i), i != j, either past bit 63 (j > i)
# or at distinct positions below 56 (j < i; 8j - 7i never repeats), so nothing carries into the
# top byte, which is the packed byte. int64 arithmetic wraps (two's complement) on CPU and CUDA.
_GATHER = 0x0102040810204080


def pack_signs(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Sign bits of the flat float tensor ``x``, 8 per byte: uint8 (ceil(N/8),), into ``out`` if given."""
    x = x.reshape(-1)
    n = x.numel()
    nb = -(-n // 8)
    bits = torch.zeros(8 * nb, dtype=torch.bool, device=x.device)  # fresh: 8-byte aligned
    torch.lt(x, 0, out=bits[:n])
    packed = bits.view(torch.uint8).view(torch.int64).mul_(_GATHER).bitwise_right_shift_(56)
    if out is None:
        out = torch.empty(nb, dtype=torch.uint8, device=x.device)
    return out.copy_(packed)  # int64 -> uint8 keeps the low byte: the arithmetic shift's sign bits go


_SIGN_TABLES: dict = {}


def _sign_table(device) -> torch.Tensor:
    """(256, 8) float32: row b holds the 8 signs (+1 / -1) byte b packs, bit j in column j."""
    table = _SIGN_TABLES.get(device)
    if table is None:
        bits = (torch.arange(256)[:, None] >> torch.arange(8)) & 1
        table = _SIGN_TABLES[device] = (1 - 2 * bits).to(torch.float32).to(device)
    return table


def unpack_signs(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of :func:`pack_signs` as float32 +1 / -1: (N,) from (ceil(N/8),), one table lookup per byte."""
    return _sign_table(packed.device).index_select(0, packed.reshape(-1).long()).view(-1)[:n]


class SignState(HookState):
    """State of signsgd: ``chunk_size`` (elements per scale) and ``majority_vote``."""

    def __init__(self, chunk_size: int, majority_vote: bool, process_group=None, error_feedback: bool = False):
        super().__init__(process_group, error_feedback)
        self.chunk_size = chunk_size
        self.majority_vote = bool(majority_vote)


def _mean_abs(v: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.linalg.vector_norm(v, 1, dim=dim).div_(v.shape[dim])


def signsgd(state: SignState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """1-bit signs + one mean-|x| scale per chunk, by allgather; mean or majority vote; see module doc."""
    t0, buf, w, n, x = start_call(state, bucket)
    chunk = state.chunk_size
    c = chunks.num_chunks(n, chunk)
    xf = as_float32(x)
    message = torch.empty(4 * c + -(-n // 8), dtype=torch.uint8, device=buf.device)  # scales, then bits
    scales = message[: 4 * c].view(torch.float32)
    scales.copy_(chunks.reduce(xf, chunk, _mean_abs))
    pack_signs(xf, out=message[4 * c :])
    if state.error_feedback:
        carried = chunks.scale(torch.where(xf < 0, -1.0, 1.0), scales, chunk, out=torch.empty_like(xf))
        state.store_residual(bucket, torch.sub(xf, carried, out=carried).to(x.dtype))
    gathered, fut = allgather_message(state, message)

    def mean(bits, all_scales, out):
        for r in range(w):
            chunks.scale(unpack_signs(bits[r], n), all_scales[r], chunk, out=out, accumulate=r > 0)
        out.div_(w)

    def vote(bits, all_scales, out):
        out.copy_(unpack_signs(bits[0], n))
        for r in range(1, w):
            out.add_(unpack_signs(bits[r], n))
        chunks.scale(out.sign_(), all_scales.mean(0), chunk, out=out)

    def decode(done: torch.futures.Future) -> torch.Tensor:
        done.value()  # re-raises if the allgather failed
        return decode_gathered(buf, gathered, w, c, vote if state.majority_vote else mean)

    return state.finish(fut, t0, decode)


def _state(process_group, chunk_size: int, majority_vote: bool, error_feedback: bool) -> SignState:
    return SignState(chunk_size, majority_vote, process_group, error_feedback=error_feedback)


def _collectives(n, world_size, element_size, *, chunk_size, **_):
    return [("allgather", -(-n // 8) + 4 * chunks.num_chunks(n, chunk_size))]


SPEC = HookSpec(
    name="signsgd", hook=signsgd, make_state=_state, collectives=_collectives,
    parameters={"chunk_size": positive_int(512), "majority_vote": flag(False), **error_feedback()},
    wire_bits=1, chunked=True, lossy=True, decodes_each_rank=True,
    doc="1 sign bit per value (8 per byte) + a mean-|x| scale per chunk by allgather; mean or majority vote (biased)",
)
