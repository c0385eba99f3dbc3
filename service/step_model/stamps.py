"""A sampled step's raw stamps (hooks/step_sampling.py: ``perf_counter`` seconds at the step's
phases and at each hook call) as the model's :class:`StepTimeline` (ms):

* ready = hook called - backward start; encode = first launch - called;
* comm = completed - max(first launch, the previous bucket's completion): collectives queue on
  the group, so a bucket's own time on the link starts when the one before it finished; a
  collective the hook waits for inside its call (quantized_allreduce's all_to_all, PowerSGD's
  whole compressed exchange with its matrix products) counts as comm;
* decode = decode done - completed (split per peer by ``timeline.decode_cost``);
* a hook that waits in its call (``HookSpec.waits_in_call``): waited = (returned - comm start) /
  comm, and its hold (returned - first launch) left out of the later ready times and the
  backward end, which the model puts back as its link and W make it;
* backward end = the last hook call's return (the autograd thread's own work: its gradients and
  the hooks' encodes, not DDP's wait for the collectives at the end of ``backward()``).

An fsdp step's calls (each stamped with its collective's kind: hooks/sharded.py) run one after
another on the training thread: per call, encode = launched - called, comm = collective returned
- launched, decode = call returned - collective returned, its phase the forward where it was
called before the backward stamp; the forward and backward are their spans less their calls
(:func:`sharded_step_timeline`).

Times are this rank's: the lead rank's or a median over ranks is the caller's choice
(service/step_model/combine.py).
"""
from __future__ import annotations

import math

from hooks.registry import spec
from hooks.step_sampling import SampledStep, StepSampler
from service.step_model.timeline import BucketTiming, LinearCost, ShardedCall, StepTimeline, decode_cost


def step_timeline(sample: SampledStep, hook: str, hook_params: dict, world_size: int, batch: int,
                  link_gbps: float = math.inf, latency_s: float = 0.0,
                  bucket_hooks: dict[int, tuple[str, dict]] | None = None) -> StepTimeline:
    """One sampled step as the step model's ``StepTimeline`` (ms; the module doc).
    ``bucket_hooks``: {bucket index: (hook, its parameters)} where a bucket ran another hook than
    the step's (a per-bucket plan's buckets), each bucket then timed and priced as its own."""
    if any(c.kind for c in sample.calls):
        return sharded_step_timeline(sample, hook, hook_params, world_size, batch, link_gbps, latency_s)
    ms, bucket_hooks = _ms, bucket_hooks or {}
    buckets, link_free, held = [], -math.inf, 0.0
    for i, c in enumerate(sample.calls):
        own, own_params = bucket_hooks.get(i, ("", {}))
        waits = spec(own or hook).waits_in_call
        launched = c.launched if c.launched is not None else c.returned
        comm_from = max(launched, link_free)
        comm = ms(comm_from, c.completed)
        buckets.append(BucketTiming(
            ready_ms=max(ms(sample.backward, c.called) - held, 0.0), numel=c.numel, element_size=c.element_size,
            encode_ms=ms(c.called, launched), comm_ms=comm,
            decode=decode_cost(own or hook, ms(c.completed, c.decoded), world_size),
            waited=min(ms(comm_from, c.returned) / comm, 1.0) if waits and comm > 0 else 0.0,
            hook=own, hook_params=dict(own_params)))
        if waits:  # the thread's hold after the launch: the model puts it back at its own W and link
            held += ms(launched, c.returned)
        link_free = c.completed
    own_end = max((c.returned for c in sample.calls), default=sample.optimizer)
    return StepTimeline(hook=hook, hook_params=dict(hook_params), world_size=world_size, batch=batch,
                        forward_ms=ms(sample.forward, sample.backward), buckets=tuple(buckets),
                        backward_end_ms=max(ms(sample.backward, own_end) - held, 0.0),
                        optimizer_ms=ms(sample.optimizer, sample.end),
                        link_gbps=link_gbps, latency_s=latency_s)


def sharded_step_timeline(sample: SampledStep, hook: str, hook_params: dict, world_size: int, batch: int,
                          link_gbps: float = math.inf, latency_s: float = 0.0) -> StepTimeline:
    """One sampled fsdp step (the module doc): its calls as ``ShardedCall``s, no buckets."""
    ms = _ms
    calls, spent = [], {"forward": 0.0, "backward": 0.0}
    for c in sample.calls:
        phase = "forward" if c.called < sample.backward else "backward"
        launched = c.launched if c.launched is not None else c.called
        done = c.completed if c.completed is not None else c.returned
        # fixed in W: W rows of n / W values each, so the n values decoded stay the same at any W
        calls.append(ShardedCall(c.kind, phase, c.numel, ms(c.called, launched), ms(launched, done),
                                 LinearCost(ms(done, c.returned)), c.element_size))
        spent[phase] += ms(c.called, c.returned)
    return StepTimeline(hook=hook, hook_params=dict(hook_params), world_size=world_size, batch=batch,
                        forward_ms=max(ms(sample.forward, sample.backward) - spent["forward"], 0.0), buckets=(),
                        backward_end_ms=max(ms(sample.backward, sample.optimizer) - spent["backward"], 0.0),
                        optimizer_ms=ms(sample.optimizer, sample.end),
                        link_gbps=link_gbps, latency_s=latency_s, sharded=tuple(calls))


def sampled_timelines(sampler: StepSampler, world_size: int, batch: int, link_gbps: float = math.inf,
                      latency_s: float = 0.0, **measured_params) -> list[StepTimeline]:
    """The sampler's steps as ``StepTimeline`` objects, of its hook state's hook and parameters;
    ``measured_params``: the hook's ``HookSpec.from_stats`` inputs read from its measured stats
    (PowerSGD's)."""
    params = {**sampler.state.params, **measured_params}
    # a plan's buckets each run their own hook (hooks/plan.py: PlanState.by_bucket, by bucket index)
    by_bucket = getattr(sampler.state, "by_bucket", {})
    own = {i: (b.state.name, dict(b.state.params)) for i, b in by_bucket.items()}
    return [step_timeline(s, sampler.state.name, params, world_size, batch, link_gbps, latency_s, own)
            for s in sampler.samples]


def _ms(earlier: float, later: float) -> float:
    return 1000.0 * max(later - earlier, 0.0)
