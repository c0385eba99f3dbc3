"""quantized_allreduce: chunked uint8 quantization inside a reduce-scatter + allgather.

The allgather quantizers make every rank receive W copies of the bucket; this hook keeps the
bandwidth-optimal shape of a ring allreduce (as CGX and ZeRO++'s quantized gradients do):

1. every rank quantizes its bucket per chunk of ``chunk_size`` floats (hooks.quantize) and sends
   shard r (an equal run of whole chunks) to rank r with one all_to_all;
2. each rank dequantizes the W shards it received, sums them in float32, divides by W and
   re-quantizes its reduced shard;
3. the quantized reduced shards (with their scales) are allgathered and dequantized.

With S = ceil(C / W) chunks per shard (C = ceil(N / chunk_size); the bucket is padded to W·S
chunks) each rank sends (W-1)·(S·chunk_size + 8S) bytes in each phase: in total
2(W-1)/W · (N' + 8C'), N' = W·S·chunk_size ≈ N, C' = W·S, about a quarter of fp32 ring
allreduce (2(W-1)/W · 4N) at every world size, for buckets much larger than W·chunk_size.

Error per element: half a step of every rank's chunk, averaged (phase 1), plus half a step of the
reduced chunk (phase 3). Constant chunks are exact in both phases. With error feedback each rank
carries both its own quantization residual (phase 1, per parameter like the other hooks) and the
requantization residual of the reduced shard it owns (phase 2, per bucket position; dropped
when the bucket's parameter layout changes, e.g. at DDP's bucket rebuild or when a resumed DDP
starts with its initial layout).

The all_to_all is waited for inside the hook before the allgather is issued: issuing the second
collective from a completion callback would race the next bucket's all_to_all, and ranks would
issue collectives in different orders.
"""
import torch
import torch.distributed as dist

from . import quantize as q
from .quantization import QuantizationState
from . import sharded
from .spec import HookSpec, ShardedForm, error_feedback, positive_int
from ._helpers import allgather_message, float32_out, into_bucket, param_layout, start_call


class QuantizedAllreduceState(QuantizationState):
    """Adds, with error feedback, the second residual: the requantization error of the reduced
    shard this rank owns (bucket index -> tensor), fed back before the next requantization."""

    def __init__(self, chunk_size: int, process_group=None, error_feedback: bool = False):
        super().__init__(chunk_size, process_group, error_feedback)
        self._shard_residuals: dict = {}

    def state_dict(self) -> dict:
        d = super().state_dict()
        d["shard_residuals"] = {
            i: {"layout": layout, "residual": r.detach().cpu().clone()} for i, (layout, r) in self._shard_residuals.items()
        }
        return d

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        self._shard_residuals = {
            int(i): (tuple(map(tuple, e["layout"])), e["residual"].clone()) for i, e in d.get("shard_residuals", {}).items()
        }


def shard_layout(n: int, chunk_size: int, world_size: int) -> tuple[int, int]:
    """(chunks per shard S, padded float count W·S·chunk_size) for a bucket of n floats."""
    s = -(-q.num_chunks(n, chunk_size) // world_size)
    return s, world_size * s * chunk_size


def _quantize_padded(x: torch.Tensor, chunk: int, padded: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes (padded,) and meta (padded / chunk, 2) of ``x`` extended to ``padded`` floats with
    copies of its last element, without copying ``x``: the n real floats are quantized in place,
    the padding's codes and meta are filled in (the last element's code in the partial last chunk,
    whose range the copies do not widen; constant chunks ``(x[-1], 0)`` after it)."""
    n = x.numel()
    c = q.num_chunks(n, chunk)
    codes = torch.empty(padded, dtype=torch.uint8, device=x.device)
    meta = torch.empty((padded // chunk, 2), dtype=torch.float32, device=x.device)
    q.quantize(x, chunk, codes=codes[:n], meta=meta[:c])
    if padded > n:
        codes[n : c * chunk].fill_(codes[n - 1])
        codes[c * chunk :].zero_()
        last = x.reshape(-1)[n - 1].to(torch.float32)
        meta[c:, 0].fill_(last)
        meta[c:, 1].fill_((last - last) / q.LEVELS)  # 0, or NaN as quantize gives a non-finite chunk
    return codes, meta


def quantized_allreduce(state: QuantizationState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """uint8 per-chunk quantization inside all_to_all (reduce-scatter) + allgather; see module doc."""
    # The input flag comes from the per-chunk min/max without error feedback (as in hooks/quantization.py).
    t0, buf, w, n, x = start_call(state, bucket, check_input=state.error_feedback)
    chunk = state.chunk_size
    s, padded = shard_layout(n, chunk, w)
    c = q.num_chunks(n, chunk)
    codes, meta = _quantize_padded(x, chunk, padded)  # (W·S·c,), (W·S, 2)
    if not state.error_feedback:
        state.flag_input(bucket, q.nonfinite_chunks(meta[:c]))
    if state.error_feedback:
        carried = q.dequantize(codes[:n], meta[:c], chunk)
        state.store_residual(bucket, torch.sub(x.reshape(-1).to(torch.float32), carried, out=carried).to(x.dtype))
    send = q.pack(codes.view(w, s * chunk), meta.view(w, s, 2))  # row r goes to rank r
    received = torch.empty_like(send)
    state.account("all_to_all", send.numel())
    dist.all_to_all_single(received.view(-1), send.view(-1), group=state.group, async_op=True).wait()

    reduced = q.mean_of_messages(received, s * chunk, chunk,
                                 torch.empty(s * chunk, dtype=torch.float32, device=buf.device))  # my shard of the mean
    if state.error_feedback:
        idx, layout = bucket.index(), param_layout(bucket.parameters())
        carried = state._shard_residuals.get(idx)
        # A shard is a range of bucket positions: its residual only means something if the
        # bucket still holds the same parameters in the same order (DDP rebuilds buckets once).
        if carried is not None and carried[0] == layout and carried[1].numel() == reduced.numel():
            reduced.add_(carried[1].to(reduced.device))
    message, codes2, meta2 = q.message_views(s * chunk, chunk, device=buf.device)  # 8S + S·c bytes
    q.quantize(reduced, chunk, codes=codes2, meta=meta2)
    if state.error_feedback:
        state._shard_residuals[idx] = (layout, reduced - q.dequantize(codes2, meta2, chunk))
    gathered, fut = allgather_message(state, message)

    def dequantize_shards(fut):
        fut.value()  # re-raises a failed allgather (else `gathered` is uninitialised memory)
        g_codes, g_meta = q.unpack(gathered.view(w, -1), s * chunk, chunk)
        # Straight into the bucket (float32) shard by shard; the padding past n is never written.
        mean = float32_out(buf)
        flat = mean.view(-1)
        for r in range(w):
            start = r * s * chunk
            m = min(s * chunk, n - start)
            if m <= 0:
                break
            q.dequantize(g_codes[r][:m], g_meta[r][: q.num_chunks(m, chunk)], chunk, out=flat[start : start + m])
        return into_bucket(buf, mean)

    return state.finish(fut, t0, dequantize_shards)


def _state(process_group, chunk_size: int, error_feedback: bool) -> QuantizedAllreduceState:
    return QuantizedAllreduceState(chunk_size, process_group, error_feedback=error_feedback)


def _collectives(n, world_size, element_size, *, chunk_size, **_):
    s, _padded = shard_layout(n, chunk_size, world_size)
    shard = 8 * s + s * chunk_size
    return [("all_to_all", world_size * shard), ("allgather", shard)]


SPEC = HookSpec(
    name="quantized_allreduce", hook=quantized_allreduce, make_state=_state, collectives=_collectives,
    parameters={"chunk_size": positive_int(512), **error_feedback()}, wire_bits=8, chunked=True, lossy=True,
    waits_in_call=True,
    doc="uint8 per-chunk quantization inside all_to_all (reduce-scatter) + allgather: ~1/4 of fp32 allreduce",
    sharded=ShardedForm(reduce_scatter=sharded.quantized_reduce_scatter, make_state=sharded.state_factory(),
                        collectives=sharded.quantized_collectives, parameters=sharded.all_gather_parameters(),
                        doc="uint8 per-chunk reduce-scatter (one all_to_all; each rank's shard quantized on its own)"),
)
