"""Timeline sampling (hooks/step_sampling.py's stamps, service/step_model/stamps.py's timelines) on 2 gloo ranks: DDP over a small MLP in several
buckets, steps 3 and 5 of 6 sampled, for allreduce, an allgather quantizer and a hook that waits
for a collective inside its call."""
import math

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hooks
from hooks.step_sampling import StepSampler
from service.step_model.price import price_step
from service.step_model.stamps import sampled_timelines
from tests.dist_utils import run_distributed

HOOKS = ("allreduce", "quantization_pertensor", "quantized_allreduce")
SAMPLED, STEPS, BATCH = (3, 5), 6, 8


def _train_sampled(name: str, rank: int) -> dict:
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 48), nn.Tanh(), nn.Linear(48, 4)),
                bucket_cap_mb=0.004)  # several buckets
    state, hook = hooks.build(name)
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = StepSampler(state, SAMPLED)
    calls, sampling_seen = {}, {}
    for step in range(1, STEPS + 1):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(BATCH, 16, generator=g), torch.randint(0, 4, (BATCH,), generator=g)
        before = state.stats()["calls"]
        sampler.forward(step)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        sampler.backward()
        loss.backward()
        sampling_seen[step] = state.sampling is not None
        sampler.optimizer()
        opt.step()
        sampler.done()
        calls[step] = state.stats()["calls"] - before
    samples = [(s.step, s.forward, s.backward, s.optimizer, s.end,
                [(c.called, c.launched, c.returned, c.completed, c.decoded) for c in s.calls])
               for s in sampler.samples]
    return {"calls": calls, "sampling_seen": sampling_seen, "samples": samples,
            "timelines": sampled_timelines(sampler, world_size=2, batch=BATCH), "left_attached": state.sampling is not None}


def sample_both_hooks(rank: int, world_size: int) -> dict:
    return {name: _train_sampled(name, rank) for name in HOOKS}


def test_sampled_steps_record_one_ordered_entry_per_bucket_and_unsampled_steps_nothing():
    for per_hook in run_distributed(sample_both_hooks, world_size=2):
        for name, r in per_hook.items():
            assert not r["left_attached"], name
            # only the sampled steps attach a recorder, and only they are kept
            assert [s for s, seen in r["sampling_seen"].items() if seen] == list(SAMPLED), name
            assert [s[0] for s in r["samples"]] == list(SAMPLED), name
            for step, forward, backward, optimizer, end, calls in r["samples"]:
                # one entry per bucket: as many as the hook's calls that step (several buckets)
                assert len(calls) == r["calls"][step] > 1, (name, step)
                assert forward <= backward <= calls[0][0] and calls[-1][4] <= optimizer <= end, name
                for called, launched, returned, completed, decoded in calls:
                    assert called <= launched <= returned and launched <= completed <= decoded, name
                assert [c[0] for c in calls] == sorted(c[0] for c in calls), name  # call (ready) order
            for t, sample in zip(r["timelines"], r["samples"]):
                assert t.hook == name and t.world_size == 2 and t.batch == BATCH and len(t.buckets) == len(sample[5])
                assert t.buckets[0].numel > 0 and t.buckets[0].element_size == 4
                phases = [t.forward_ms, t.backward_end_ms, t.optimizer_ms]
                phases += [v for b in t.buckets for v in (b.ready_ms, b.encode_ms, b.comm_ms, b.decode.at(1))]
                assert all(math.isfinite(v) and v >= 0 for v in phases), (name, phases)
                assert t.backward_end_ms >= t.buckets[-1].ready_ms + t.buckets[-1].encode_ms, name
                # the allgather quantizer's decode grows per peer, the others' do not; only the hook
                # that waits in its call waited for a part of its comm
                spec = hooks.available()[name]
                assert (t.buckets[0].decode.per_unit_ms > 0) == spec.decodes_each_rank, name
                assert all(0 <= b.waited <= 1 for b in t.buckets), name
                assert any(b.waited > 0 for b in t.buckets) == spec.waits_in_call, name
                # priced where it was measured (W=2, loopback), the model gives the sampled step
                # back, less the gaps it does not price (after the last decode, between phases);
                # the holds the sampler took out come back, not twice. The unpriced gaps are the
                # scheduler's: on a loaded 2-core machine a rank can sit preempted for most of a
                # step (once below 0.5x at load 12), hence the loose lower bound; the upper one
                # is structural (the parts never add up to more than the step they came from)
                measured = 1000 * (sample[4] - sample[1])
                priced = price_step(t, 2, math.inf, latency_s=0.0).step_ms
                assert 0.2 * measured <= priced <= 1.05 * measured + 0.2, (name, measured, priced)
