"""PowerSGD: torch's ``PowerSGDState`` + ``powerSGD_hook``, wrapped for our accounting and checkpoints.

Algorithm (Vogels et al. 2019, torch's implementation): for the first ``start_iter`` iterations a
plain allreduce; afterwards each weight matrix M (n x m) of the bucket is approximated as
P Q^T with P (n x rank), Q (m x rank): P = M Q allreduced, orthogonalized, Q = M^T P allreduced;
vectors and matrices too small to gain ((n + m) * rank * ``min_compression_rate`` >= n * m) are
allreduced uncompressed. Three allreduces per bucket. Error feedback keeps M - P Q^T for the
next step; warm start reuses Q.

``batched``: torch's ``batched_powerSGD_hook`` instead: the whole bucket as one zero-padded
square matrix of side s = ceil(sqrt(N)), two allreduces (P, Q) of s * rank values each
(``min_compression_rate`` and ``orthogonalization_epsilon`` do not apply, as in torch's).

``wire_dtype: fp16 | bf16``: torch's ``fp16_compress_wrapper`` / ``bf16_compress_wrapper``
around the hook: the bucket is cast to the 16-bit dtype, PowerSGD runs on it (its P, Q,
uncompressed values and error memory in 16 bits), and the result is cast back.

Wire per rank: 2(W-1)/W * b * (U + sum (n + m) * rank) bytes, U = uncompressed elements,
b = 4 (fp32) or 2 (16-bit wire); batched: 2(W-1)/W * b * 2 s * rank.
Lossy and biased (a low-rank approximation), exact while ``iter < start_iter``.
Once compressing, the hook waits for its bucket's three allreduces before returning (see
:func:`powersgd`): correct ordering across buckets, but no overlap with the backward pass.
"""

import math

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, _orthogonalize, powerSGD_hook

from ._helpers import WIRE_DTYPES, param_layout, wire_dtype_param, wire_element_size
from .spec import HookSpec, flag, non_negative_int, positive_int, real
from .state import HookState
from .wire import Collective


class PowerSGDHookState(HookState):
    """Our accounting around torch's :class:`PowerSGDState` (kept in ``self.powersgd``)."""

    def __init__(self, process_group, powersgd: PowerSGDState, batched: bool, wire_dtype: str):
        super().__init__(process_group, error_feedback=False)  # PowerSGD keeps its own error memory
        self.powersgd = powersgd
        self.batched = bool(batched)
        self.wire_dtype = WIRE_DTYPES[wire_dtype]  # None: the bucket's own dtype
        # bucket index -> (layout, error, p, q) restored from a checkpoint, installed when a bucket
        # with the same layout arrives (DDP's first iteration may still use its initial layout).
        self._restored_powersgd: dict[int, tuple] = {}

    def _prepare(self, bucket) -> None:
        ps, idx, n = self.powersgd, bucket.index(), bucket.buffer().numel()
        restored = self._restored_powersgd.get(idx)
        if restored is not None and restored[0] == param_layout(bucket.parameters()):
            dev = bucket.buffer().device
            _, err, p, q = self._restored_powersgd.pop(idx)
            for store, t in ((ps.error_dict, err), (ps.p_memory_dict, p), (ps.q_memory_dict, q)):
                if t is not None:
                    store[idx] = t.to(dev)
        # Memory from another bucket layout would crash torch's hook (size mismatch): start afresh.
        err = ps.error_dict.get(idx)
        if err is not None and err.numel() != (_side(n) ** 2 if self.batched else n):
            for store in (ps.error_dict, ps.p_memory_dict, ps.q_memory_dict):
                store.pop(idx, None)

    def _account(self, bucket) -> None:
        ps, buf = self.powersgd, bucket.buffer()
        esize = buf.element_size()
        if ps.iter < ps.start_powerSGD_iter:
            self.account("allreduce", buf.numel() * esize)
            return
        if self.batched:  # P and Q, s x rank each
            for _ in range(2):
                self.account("allreduce", _side(buf.numel()) * ps.matrix_approximation_rank * esize)
            return
        uncompressed = p_total = q_total = 0
        for t in bucket.gradients():  # the same split as torch's hook (_should_compress)
            n = t.shape[0]
            m = t.numel() // n
            r = min(n, m, ps.matrix_approximation_rank)
            if (n + m) * r * ps.min_compression_rate < n * m:
                p_total += n * r
                q_total += m * r
            else:
                uncompressed += t.numel()
        for count in (uncompressed, p_total, q_total):
            self.account("allreduce", count * esize)

    def state_dict(self) -> dict:
        import numpy as np  # torch's PowerSGDState needs numpy; `import hooks` must not

        ps = self.powersgd
        _, keys, pos, has_gauss, cached = ps.rng.get_state()
        buckets = {}
        for idx in set(ps.error_dict) | set(ps.p_memory_dict):
            buckets[idx] = {
                "layout": param_layout(self.bucket_parameters(idx)),
                "error": _cpu(ps.error_dict.get(idx)),
                "p": _cpu(ps.p_memory_dict.get(idx)),
                "q": _cpu(ps.q_memory_dict.get(idx)),
            }
        for idx, (layout, err, p, q) in self._restored_powersgd.items():
            buckets.setdefault(idx, {"layout": layout, "error": err, "p": p, "q": q})
        return {
            "base": super().state_dict(),
            "iter": ps.iter,
            "rng": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
            "numel_before": ps.total_numel_before_compression,
            "numel_after": ps.total_numel_after_compression,
            "buckets": buckets,
        }

    def load_state_dict(self, d: dict) -> None:
        import numpy as np

        super().load_state_dict(d["base"])
        ps = self.powersgd
        ps.iter = d["iter"]
        rng = d["rng"]
        ps.rng.set_state(("MT19937", rng["keys"].numpy().astype(np.uint32), rng["pos"], rng["has_gauss"], rng["cached"]))
        ps.total_numel_before_compression = d["numel_before"]
        ps.total_numel_after_compression = d["numel_after"]
        for store in (ps.error_dict, ps.p_memory_dict, ps.q_memory_dict):
            store.clear()
        self._restored_powersgd = {
            int(idx): (tuple(map(tuple, b["layout"])), b["error"], b["p"], b["q"]) for idx, b in d["buckets"].items()
        }


def _cpu(t):
    return None if t is None else t.detach().cpu().clone()


def powersgd(state: PowerSGDHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PowerSGD low-rank compression (torch's ``powerSGD_hook``, or ``batched_powerSGD_hook``), in
    torch's ``fp16/bf16_compress_wrapper`` under a 16-bit ``wire_dtype``, with our accounting."""
    t0 = state.begin(bucket)
    if state.wire_dtype is not None:  # the wrapper's first line: the hook runs on a 16-bit bucket
        bucket.set_buffer(bucket.buffer().to(state.wire_dtype))
    state._prepare(bucket)
    state._account(bucket)
    compressing = state.powersgd.iter >= state.powersgd.start_powerSGD_iter
    fut = (batched_powersgd if state.batched else powerSGD_hook)(state.powersgd, bucket)
    if compressing:
        # torch's hook issues its P and Q allreduces from completion callbacks. With several
        # buckets in flight those callbacks race the next bucket's first allreduce, and ranks
        # issue collectives in different orders (gloo: "Received data size doesn't match").
        # Waiting here keeps every rank's order the same, at the cost of overlap with backward.
        fut.wait()
    if state.wire_dtype is None:
        return state.finish(fut, t0)
    return state.finish(fut, t0, lambda done: _decompress(bucket, done))


def _decompress(bucket, fut: torch.futures.Future) -> torch.Tensor:
    """The wrappers' decompress: the result copied into the (16-bit) bucket buffer, which DDP
    copies into the gradients."""
    decompressed = bucket.buffer()
    decompressed.copy_(fut.value())
    return decompressed


def _side(n: int) -> int:
    """The side of the square matrix the batched variant views a bucket of n values as."""
    return math.ceil(math.sqrt(n))


def batched_powersgd(ps: PowerSGDState, bucket) -> torch.futures.Future[torch.Tensor]:
    """torch's ``batched_powerSGD_hook`` operation for operation, with one fix.

    torch 2.13's raises AssertionError at its first compressing call: it orthogonalizes its 2-D
    P and Q with ``_orthogonalize``, which takes a batch of matrices (3-D) since torch 1.12
    (pytorch #75157). Here each is orthogonalized as a batch of one, which is what the call did
    before. The padded matrix is a copy (torch resizes the bucket's buffer in place); the P
    allreduce is waited for here rather than in a completion callback.
    """
    if ps.iter < ps.start_powerSGD_iter:  # torch's: a plain allreduce, the same as powerSGD_hook's
        return powerSGD_hook(ps, bucket)
    group = ps.process_group if ps.process_group is not None else dist.group.WORLD
    buf, idx, rank = bucket.buffer(), bucket.index(), ps.matrix_approximation_rank
    n, side = buf.numel(), _side(buf.numel())
    ps.total_numel_before_compression += n
    ps.total_numel_after_compression += side * rank * 2
    padded = torch.zeros(side * side, device=buf.device, dtype=buf.dtype)
    padded[:n].copy_(buf)
    before = None
    if ps.use_error_feedback:
        if idx in ps.error_dict:
            padded.add_(ps.error_dict[idx])
        else:
            ps.error_dict[idx] = torch.zeros(side * side, device=buf.device, dtype=buf.dtype)
        before = padded.detach().clone()
    matrix = padded.view(side, side)
    if not ps.warm_start or idx not in ps.p_memory_dict:
        ps.p_memory_dict[idx] = torch.empty(side, rank, device=buf.device, dtype=buf.dtype)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(ps.rng.randint(1_000_000_000))
            ps.q_memory_dict[idx] = torch.randn(side, rank, device="cpu", dtype=buf.dtype).to(buf.device)
    p, q = ps.p_memory_dict[idx], ps.q_memory_dict[idx]
    _orthogonalize(q.unsqueeze(0))
    torch.matmul(matrix, q, out=p)
    dist.all_reduce(p, group=group, async_op=True).wait()
    _orthogonalize(p.unsqueeze(0))
    torch.matmul(matrix.t(), p, out=q)
    fut = dist.all_reduce(q, group=group, async_op=True).get_future()

    def decompress(done: torch.futures.Future) -> torch.Tensor:
        done.value()[0].div_(group.size())  # re-raises a failed allreduce
        torch.matmul(p, q.t(), out=matrix)
        if ps.use_error_feedback:
            ps.error_dict[idx] = before - padded
        if not ps.warm_start:
            ps.p_memory_dict.clear()
            ps.q_memory_dict.clear()
        ps.maybe_increase_iter(bucket)
        return buf.copy_(padded[:n])

    return fut.then(decompress)


def _collectives(n, world_size, element_size, *, wire_dtype, compressed_fraction=None, allreduces=1.0, **_):
    """The compressed fraction of the bucket in ``allreduces`` allreduces (``compressed_fraction``:
    payload bytes / raw bytes, and ``allreduces`` per call, from measured stats; by default one
    allreduce of the bucket in the wire dtype, as before start_iter): the split into matrices
    depends on the bucket's shapes, which a size alone does not give."""
    if compressed_fraction is None:
        compressed_fraction = wire_element_size(wire_dtype, element_size) / element_size
    return [Collective("allreduce", int(n * element_size * compressed_fraction), allreduces)]


def _from_stats(stats: dict) -> dict:
    calls = stats["calls"]
    return {"compressed_fraction": stats["payload_bytes"] / max(stats["raw_bytes"], 1),
            "allreduces": stats.get("allreduce_calls", calls) / calls}


def _check(params: dict) -> None:
    if (params["error_feedback"] or params["warm_start"]) and params["start_iter"] < 2:
        raise ValueError(
            f"hook 'powersgd': parameter 'start_iter' must be >= 2 when error_feedback or warm_start is on "
            f"(DDP rebuilds its buckets after the first iteration), got {params['start_iter']!r}"
        )
    if params["batched"]:
        for name in ("min_compression_rate", "orthogonalization_epsilon"):
            if params[name] != _PARAMETERS[name].default:
                raise ValueError(f"hook 'powersgd': parameter {name!r} has no effect with batched: true "
                                 f"(torch's batched_powerSGD_hook does not read it), got {params[name]!r}")


_PARAMETERS = {
    "rank": positive_int(1), "start_iter": non_negative_int(10), "error_feedback": flag(True),
    "warm_start": flag(True),
    "orthogonalization_epsilon": real(1e-8, lambda v: 0 <= v < 1, "a number in [0, 1)"),
    # torch's default: compress a matrix only if that at least halves it
    "min_compression_rate": real(2.0, lambda v: v >= 0, "a non-negative number (compress a matrix "
                                 "only if (rows + cols) * rank * min_compression_rate < rows * cols)"),
    "batched": flag(False),
    **wire_dtype_param(),
}


def _state(process_group, *, batched: bool, wire_dtype: str, **torch_params) -> PowerSGDHookState:
    """The hook's state from its validated parameters (every one given); the rest are torch's
    PowerSGDState's, by this hook's names (:func:`_torch_state`)."""
    return PowerSGDHookState(process_group, _torch_state(process_group, **torch_params), batched, wire_dtype)


def _torch_state(process_group, rank: int, start_iter: int, error_feedback: bool, warm_start: bool,
                 orthogonalization_epsilon: float, min_compression_rate: float) -> PowerSGDState:
    return PowerSGDState(
        process_group=process_group,
        matrix_approximation_rank=rank,
        start_powerSGD_iter=start_iter,
        min_compression_rate=min_compression_rate,
        use_error_feedback=error_feedback,
        warm_start=warm_start,
        # > 0 so an all-zero column (e.g. a layer with zero gradient) cannot divide 0 by 0.
        orthogonalization_epsilon=orthogonalization_epsilon,
        random_seed=0,
    )


SPEC = HookSpec(
    name="powersgd", hook=powersgd, make_state=_state, collectives=_collectives, from_stats=_from_stats,
    parameters=_PARAMETERS, check=_check, wire_bits=None, lossy=True, waits_in_call=True,
    doc="PowerSGD low-rank compression (torch's), after start_iter plain allreduces",
)
