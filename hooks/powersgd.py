"""PowerSGD: torch's ``PowerSGDState`` + ``powerSGD_hook``, wrapped for our accounting and checkpoints.

Algorithm (Vogels et al. 2019, torch's implementation): for the first ``start_iter`` iterations a
plain allreduce; afterwards each weight matrix M (n x m) of the bucket is approximated as
P Q^T with P (n x rank), Q (m x rank): P = M Q allreduced, orthogonalized, Q = M^T P allreduced;
vectors and matrices too small to gain are allreduced uncompressed. Three allreduces per bucket.
Error feedback keeps M - P Q^T for the next step; warm start reuses Q.

Wire per rank: 2(W-1)/W * 4 * (U + sum (n + m) * rank) bytes, U = uncompressed elements.
Lossy and biased (a low-rank approximation), exact while ``iter < start_iter``.
Once compressing, the hook waits for its bucket's three allreduces before returning (see
:func:`powersgd`): correct ordering across buckets, but no overlap with the backward pass.
"""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from .spec import HookSpec, flag, non_negative_int, positive_int, real
from ._helpers import param_layout
from .state import HookState
from .wire import Collective


class PowerSGDHookState(HookState):
    """Our accounting around torch's :class:`PowerSGDState` (kept in ``self.powersgd``)."""

    def __init__(self, process_group, rank: int, start_iter: int, error_feedback: bool, warm_start: bool,
                 orthogonalization_epsilon: float):
        super().__init__(process_group, error_feedback=False)  # PowerSGD keeps its own error memory
        self.powersgd = PowerSGDState(
            process_group=process_group,
            matrix_approximation_rank=rank,
            start_powerSGD_iter=start_iter,
            use_error_feedback=error_feedback,
            warm_start=warm_start,
            # > 0 so an all-zero column (e.g. a layer with zero gradient) cannot divide 0 by 0.
            orthogonalization_epsilon=orthogonalization_epsilon,
            random_seed=0,
        )
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
        if err is not None and err.numel() != n:
            for store in (ps.error_dict, ps.p_memory_dict, ps.q_memory_dict):
                store.pop(idx, None)

    def _account(self, bucket) -> None:
        ps, buf = self.powersgd, bucket.buffer()
        esize = buf.element_size()
        if ps.iter < ps.start_powerSGD_iter:
            self.account("allreduce", buf.numel() * esize)
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
    """PowerSGD low-rank compression (torch's ``powerSGD_hook``) with our accounting."""
    t0 = state.begin(bucket)
    state._prepare(bucket)
    state._account(bucket)
    compressing = state.powersgd.iter >= state.powersgd.start_powerSGD_iter
    fut = powerSGD_hook(state.powersgd, bucket)
    if compressing:
        # torch's hook issues its P and Q allreduces from completion callbacks. With several
        # buckets in flight those callbacks race the next bucket's first allreduce, and ranks
        # issue collectives in different orders (gloo: "Received data size doesn't match").
        # Waiting here keeps every rank's order the same, at the cost of overlap with backward.
        fut.wait()
    return state.finish(fut, t0)


def _collectives(n, world_size, element_size, *, compressed_fraction=1.0, allreduces=1.0, **_):
    """The compressed fraction of the bucket in ``allreduces`` allreduces (``compressed_fraction``:
    payload bytes / raw bytes, and ``allreduces`` per call, from measured stats; 1 and 1 = before
    start_iter, three allreduces once compressing): the split into matrices depends on the
    bucket's shapes, which a size alone does not give."""
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


SPEC = HookSpec(
    name="powersgd", hook=powersgd, make_state=PowerSGDHookState, collectives=_collectives, from_stats=_from_stats,
    parameters={"rank": positive_int(1), "start_iter": non_negative_int(10), "error_feedback": flag(True),
                "warm_start": flag(True),
                "orthogonalization_epsilon": real(1e-8, lambda v: 0 <= v < 1, "a number in [0, 1)")},
    check=_check, wire_bits=None, lossy=True,
    doc="PowerSGD low-rank compression (torch's), after start_iter plain allreduces", colour="tab:purple", marker="*",
)
