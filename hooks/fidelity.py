"""Gradient fidelity: how far a hook's result is from the exact fp32 allreduce mean.

``state, hook = hooks.with_fidelity(state, hook, every=N)`` wraps any hook. On every N-th call
(calls 0, N, 2N, ... on every rank alike, so ranks issue the same collectives) it also
allreduces an fp32 copy of the bucket (issued before the hook's own collectives) and, when both
are done, compares:

* ``fidelity_rel_error`` = ||result - exact|| / ||exact||   (0 when both are zero)
* ``fidelity_cosine``    = <result, exact> / (||result|| ||exact||)   (1 when both are zero)

averaged over the sampled buckets in ``state.stats()`` (with ``fidelity_samples``). The sums
stay device tensors (no host sync in the hook). The reference allreduce is a diagnostic: it is
not counted in the hook's payload/wire bytes, but it does cost bandwidth and time on sampled calls.
"""
import torch
import torch.distributed as dist


def _check_every(every) -> int:
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"with_fidelity: 'every' must be a positive integer, got {every!r}")
    return every


def with_fidelity(state, hook, every: int = 1):
    """Return ``(state, fidelity_hook)``: ``hook`` plus sampled fidelity statistics in ``state``."""
    every = _check_every(every)
    state.enable_fidelity()
    calls = [0]

    def fidelity_hook(st, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        call = calls[0]
        calls[0] += 1
        if call % every:
            return hook(st, bucket)
        exact = bucket.buffer().detach().to(torch.float32, copy=True)
        exact.div_(st.world_size())
        exact_fut = dist.all_reduce(exact, group=st.group, async_op=True).get_future()
        result_fut = hook(st, bucket)

        def compare(both):
            exact_done, result_done = both.value()
            exact_done.value()  # a failed reference allreduce fails the call too
            result = result_done.value()
            out = result.detach().to(torch.float32)
            diff = torch.linalg.vector_norm(out - exact)
            norm_exact = torch.linalg.vector_norm(exact)
            norm_out = torch.linalg.vector_norm(out)
            both_zero = (norm_exact == 0) & (norm_out == 0)
            rel = torch.where(both_zero, torch.zeros_like(diff), diff / norm_exact)
            cos = torch.where(both_zero, torch.ones_like(diff), torch.dot(out, exact) / (norm_out * norm_exact))
            st.record_fidelity(rel, cos)
            return result

        return torch.futures.collect_all([exact_fut, result_fut]).then(compare)

    fidelity_hook.__name__ = f"{getattr(hook, '__name__', 'hook')}_with_fidelity"
    return state, fidelity_hook
