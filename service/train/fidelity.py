"""Gradient fidelity sampled by optimizer step (hooks.with_fidelity on every N-th step)."""

from __future__ import annotations

import statistics

import hooks


class FidelitySampler:
    """Gradient fidelity (``hooks.with_fidelity``) on every ``every``-th optimizer step.

    Sampling is by step, not by hook call: on steps ``every, 2*every, ...`` every bucket of
    the step goes through ``with_fidelity`` (an extra fp32 reference allreduce per bucket;
    the same steps on every rank, so the ranks issue the same collectives), on the other
    steps the plain hook runs. A step therefore has one value, whatever the bucket count
    (DDP's first iteration and its rebuilt layout differ). ``end(step)`` returns that step's
    ``grad_rel_error`` and ``grad_cosine``: the mean over the step's buckets, from the
    difference of the state's cumulative sums (read only on sampled steps: one host sync).
    ``every = 0``: the plain hook, nothing measured.
    """

    def __init__(self, hook_state, hook, every: int):
        self.every, self.state = int(every or 0), hook_state
        self._sampling = False
        self._rel, self._cos, self._samples = 0.0, 0.0, 0
        self.values: dict[int, tuple[float, float]] = {}  # step -> (rel error, cosine)
        if not self.every:
            self.hook = hook
            return
        _, sampled = hooks.with_fidelity(hook_state, hook, every=1)

        def hook_sampled_by_step(state, bucket):
            return (sampled if self._sampling else hook)(state, bucket)

        hook_sampled_by_step.__name__ = f"{getattr(hook, '__name__', 'hook')}_fidelity_by_step"
        self.hook = hook_sampled_by_step

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def begin(self, step: int) -> None:
        self._sampling = self.due(step)

    def end(self, step: int) -> dict[str, float]:
        if not self._sampling:
            return {}
        self._sampling = False
        stats = self.state.stats()
        samples = stats.get("fidelity_samples", 0)
        new = samples - self._samples
        if new <= 0:  # no bucket was communicated this step
            return {}
        rel_sum, cos_sum = stats["fidelity_rel_error"] * samples, stats["fidelity_cosine"] * samples
        rel, cos = (rel_sum - self._rel) / new, (cos_sum - self._cos) / new
        self._rel, self._cos, self._samples = rel_sum, cos_sum, samples
        self.values[step] = (rel, cos)
        return {"grad_rel_error": rel, "grad_cosine": cos}

    def summary(self) -> dict[str, float]:
        """Means over the sampled steps of this attempt (absent when nothing was sampled)."""
        if not self.values:
            return {}
        return {"grad_rel_error_mean": statistics.fmean(v[0] for v in self.values.values()),
                "grad_cosine_mean": statistics.fmean(v[1] for v in self.values.values()),
                "grad_fidelity_steps": len(self.values)}
