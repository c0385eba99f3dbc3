"""qsgd: QSGD (Alistarh et al. 2017) stochastic quantization per chunk, by allgather.

Every rank cuts its bucket into C = ceil(N / chunk_size) chunks; for a chunk v with L2 norm
||v|| and s = ``levels``, each element becomes the integer level

    l_i = floor(s * |v_i| / ||v|| + u_i),  u_i ~ U[0, 1)  (0 <= l_i <= s)

with the sign of v_i, sent as one int8 code (hence s <= 127), and the chunk's norm as one
float32: 4C + N bytes in one uint8 message. Each element decodes to sign * l_i * ||v|| / s.
Rounding up with probability equal to the fractional part makes the code unbiased,
E[decoded] = v_i; per element and rank the error is below one level, ||v|| / s. All ranks
allgather the messages and average the W decoded contributions, so the mean's error per element
is at most the mean over ranks of ||v_r|| / s of the element's chunk. Unbiased (the noise averages
out over steps rather than adding up). A chunk of zeros is exact; so is a chunk whose only
nonzero element carries the whole norm (level s exactly).

Wire per rank: (W-1) * (N + 4C) bytes. The random draws are seeded per rank and call
(seed = base + 2^20 * calls so far + rank): a run is reproducible, ranks draw independently,
and the call count is kept in checkpoints. With error feedback each rank keeps x - decoded(x).

A chunk whose norm overflows float32 (|x| beyond ~1e19) or holds NaN/inf decodes to NaN.
"""
import torch
import torch.distributed as dist

from . import chunks
from .spec import HookSpec, error_feedback, int_between, positive_int
from ._helpers import allgather_message, as_float32, decode_gathered, start_call
from .state import SeededState

MAX_LEVELS = 127  # codes are int8: -levels .. levels
_SEED_BASE = 0x95D_0000_0000


class QSGDState(SeededState):
    """State of qsgd: ``levels``, ``chunk_size`` and the number of calls so far (seeds the draws)."""

    def __init__(self, levels: int, chunk_size: int, process_group=None, error_feedback: bool = False):
        super().__init__(process_group, error_feedback)
        self.levels = int(levels)
        self.chunk_size = int(chunk_size)


def encode(x: torch.Tensor, levels: int, chunk_size: int, generator: torch.Generator,
           codes: torch.Tensor, norms: torch.Tensor) -> None:
    """Write the int8 codes (N,) and float32 norms (C,) of the flat float32 ``x`` (see module doc)."""
    norms.copy_(chunks.reduce(x, chunk_size, torch.linalg.vector_norm))
    inv = torch.where(norms > 0, levels / norms, torch.zeros_like(norms))  # zero chunks: level 0
    t = chunks.scale(x.abs(), inv, chunk_size, out=torch.empty_like(x))  # s |x| / ||v|| in [0, s]
    t.add_(torch.rand(t.shape, generator=generator, dtype=t.dtype, device=t.device)).floor_()
    t.clamp_(max=levels).copysign_(x)  # rounding may put s|x|/||v|| a hair above s
    codes.copy_(t.nan_to_num_(0.0))  # a NaN chunk already decodes to NaN through its norm


def decode(codes: torch.Tensor, norms: torch.Tensor, levels: int, chunk_size: int,
           out: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """``code * norm / levels`` per element into ``out`` (float32, N), added to it with ``accumulate``."""
    return chunks.scale(codes.to(torch.float32), norms / levels, chunk_size, out=out, accumulate=accumulate)


def qsgd(state: QSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """QSGD: stochastic rounding to ``levels`` levels of each chunk's L2 norm, by allgather; see module doc."""
    t0, buf, w, n, x = start_call(state, bucket)
    chunk, s = state.chunk_size, state.levels
    c = chunks.num_chunks(n, chunk)
    xf = as_float32(x)
    g = torch.Generator(device=buf.device)
    g.manual_seed(_SEED_BASE + (state.draws << 20) + dist.get_rank(state.group))
    state.draws += 1
    message = torch.empty(4 * c + n, dtype=torch.uint8, device=buf.device)  # norms, then codes
    norms, codes = message[: 4 * c].view(torch.float32), message[4 * c :].view(torch.int8)
    encode(xf, s, chunk, g, codes, norms)
    if state.error_feedback:
        carried = decode(codes, norms, s, chunk, out=torch.empty_like(xf))
        state.store_residual(bucket, torch.sub(xf, carried, out=carried).to(x.dtype))
    gathered, fut = allgather_message(state, message)

    def mean(payloads, all_norms, out):
        for r in range(w):
            decode(payloads[r].view(torch.int8), all_norms[r], s, chunk, out=out, accumulate=r > 0)
        out.div_(w)

    def average(done: torch.futures.Future) -> torch.Tensor:
        done.value()  # re-raises if the allgather failed
        return decode_gathered(buf, gathered, w, c, mean)

    return state.finish(fut, t0, average)


def _state(process_group, levels: int, chunk_size: int, error_feedback: bool) -> QSGDState:
    return QSGDState(levels, chunk_size, process_group, error_feedback=error_feedback)


def _collectives(n, world_size, element_size, *, chunk_size, **_):
    return [("allgather", n + 4 * chunks.num_chunks(n, chunk_size))]


SPEC = HookSpec(
    name="qsgd", hook=qsgd, make_state=_state, collectives=_collectives,
    parameters={"levels": int_between(MAX_LEVELS, 1, MAX_LEVELS, "codes are int8"), "chunk_size": positive_int(512),
                **error_feedback()},
    wire_bits=8, chunked=True, lossy=True, decodes_each_rank=True,
    doc="QSGD: stochastic rounding to levels of each chunk's L2 norm, int8 codes by allgather (unbiased)",
)
