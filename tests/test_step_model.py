"""The DDP step model (service/step_model/) on hand-built timelines, every expected figure
worked out by hand beside the assertion.

Sizes chosen so the wire is round: a bucket of 250,000 fp32 values is 1e6 bytes; 8 Gbit/s is
1e9 bytes/s, 0.08 Gbit/s 1e7 bytes/s. Ring allreduce of n bytes: 2(W-1)(latency + n/W/beta);
ring allgather of n bytes per rank: (W-1)(latency + n/beta) (hooks.cost.collective_seconds).
"""
import math
from dataclasses import replace

import pytest

import hooks
from service.step_model.combine import combine
from service.step_model.price import (Cell, CellRefused, ComputeScaling, at_batch, comm_ms, price_cell, price_step,
                                      rank_batch, time_shared)
from service.step_model.timeline import BucketTiming, LinearCost, StepTimeline, decode_cost, fit_linear

N = 250_000  # fp32 values: 1e6 bytes
FAST, SLOW = 8.0, 0.08  # Gbit/s: 1e9, 1e7 bytes/s


def bucket(ready, encode=0.0, comm=0.0, decode=LinearCost(0.0), numel=N):
    return BucketTiming(ready_ms=ready, numel=numel, encode_ms=encode, comm_ms=comm, decode=decode)


def timeline(buckets, backward_end, hook="allreduce", forward=10.0, optimizer=3.0, world_size=2,
             batch=64, **kw):
    return StepTimeline(hook=hook, world_size=world_size, batch=batch, forward_ms=forward,
                        buckets=tuple(buckets), backward_end_ms=backward_end, optimizer_ms=optimizer, **kw)


def test_full_overlap_the_step_is_its_compute():
    # allreduce at W=2 on 8 Gbit/s: 2*1*(1e6/2/1e9) s = 1 ms; at W=4: 2*3*(1e6/4/1e9) s = 1.5 ms.
    # Ready at 5, encode 0.5: on the link 5.5 .. 6.5, decoded by 7.0, long before the backward
    # pass ends at 40: step = forward 10 + backward 40 + optimizer 3 = 53.
    t = timeline([bucket(5.0, encode=0.5, decode=LinearCost(0.5))], backward_end=40.0)
    p = price_step(t, 2, FAST, latency_s=0.0)
    assert p.buckets[0].start_ms == pytest.approx(5.5)
    assert p.buckets[0].end_ms == pytest.approx(6.5)
    assert p.buckets[0].done_ms == pytest.approx(7.0)
    assert p.step_ms == pytest.approx(53.0) == p.compute_ms
    assert price_step(t, 4, FAST, latency_s=0.0).buckets[0].end_ms == pytest.approx(5.5 + 1.5)
    assert price_step(t, 4, FAST, latency_s=0.0).step_ms == pytest.approx(53.0)


def test_no_overlap_the_step_is_compute_plus_encode_wire_decode():
    # One bucket, ready when the gradients are done (40); its encode (0.5) runs on the autograd
    # thread, so the backward pass's own work ends at 40.5. Wire 1 ms (W=2, 8 Gbit/s), decode
    # 0.5: step = forward 10 + 40 + encode 0.5 + wire 1 + decode 0.5 + optimizer 3 = 55.
    t = timeline([bucket(40.0, encode=0.5, decode=LinearCost(0.5))], backward_end=40.5)
    p = price_step(t, 2, FAST, latency_s=0.0)
    assert p.step_ms == pytest.approx(10 + 40 + 0.5 + 1.0 + 0.5 + 3)
    assert p.step_ms - p.compute_ms == pytest.approx(1.5)  # wire + decode exposed


def test_two_buckets_serialise_on_a_slow_link():
    # 0.08 Gbit/s, latency 1 ms: allreduce at W=2 = 2*1*(0.001 + 1e6/2/1e7) s = 102 ms.
    # A ready at 10: link 10 .. 112. B ready at 20 waits for the link: 112 .. 214.
    # step = forward 10 + max(backward 30, 214) + optimizer 3 = 227.
    t = timeline([bucket(10.0), bucket(20.0)], backward_end=30.0)
    p = price_step(t, 2, SLOW, latency_s=0.001)
    assert [(b.start_ms, b.end_ms) for b in p.buckets] == [pytest.approx((10, 112)), pytest.approx((112, 214))]
    assert p.step_ms == pytest.approx(227.0)


def test_a_hook_that_waits_in_its_call_stalls_the_backward_pass():
    # As above (102 ms a bucket), but A's hook waits inside its call for all of its comm (as
    # PowerSGD's compressed exchange does): the backward pass resumes at 112, a stall of 102.
    # B, ready at 20 of backward compute, is ready at 122: link 122 .. 224; the backward's own
    # work ends at 30 + 102 = 132. step = 10 + max(132, 224) + 3 = 237.
    t = timeline([replace(bucket(10.0), waited=1.0), bucket(20.0)], backward_end=30.0)
    p = price_step(t, 2, SLOW, latency_s=0.001)
    assert [(b.start_ms, b.end_ms) for b in p.buckets] == [pytest.approx((10, 112)), pytest.approx((122, 224))]
    assert p.step_ms == pytest.approx(237.0)
    # Waiting for half of it (quantized_allreduce's all_to_all, say): resumes at 10 + 51, B is
    # ready at 71 but the link is busy until 112: 112 .. 214; step = 10 + 214 + 3 = 227.
    half = timeline([replace(bucket(10.0), waited=0.5), bucket(20.0)], backward_end=30.0)
    assert price_step(half, 2, SLOW, latency_s=0.001).buckets[1].start_ms == pytest.approx(112.0)
    # B waiting for all of its own: it queues behind A (launch 20, link free at 112), then
    # holds 102: the backward's end moves by 92 + 102: 30 + 194 = 224 = B's end.
    both = timeline([bucket(10.0), replace(bucket(20.0), waited=1.0)], backward_end=30.0)
    assert price_step(both, 2, SLOW, latency_s=0.001).step_ms == pytest.approx(10 + 224 + 3)


def test_a_decode_that_grows_with_the_world_size():
    # allgather_then_aggregate decodes each rank's message (its spec says so): 2 ms measured at
    # W=2 is 1 ms a message, so at W=8 it is 1 + 1*7 = 8 ms. allreduce's decode stays fixed.
    assert hooks.available()["allgather_then_aggregate"].decodes_each_rank
    decode = decode_cost("allgather_then_aggregate", 2.0, world_size=2)
    assert decode == LinearCost(1.0, 1.0) and decode.at(8 - 1) == pytest.approx(8.0)
    assert decode_cost("allreduce", 2.0, world_size=2) == LinearCost(2.0, 0.0)
    # One bucket at the backward end (40, encode 0.5 -> 40.5). Allgather of 1e6 bytes per rank on
    # 8 Gbit/s at W=8: 7*(1e6/1e9) s = 7 ms. step = 10 + 40.5 + 7 + 8 + 3 = 68.5.
    t = timeline([bucket(40.0, encode=0.5, decode=decode)], backward_end=40.5, hook="allgather_then_aggregate")
    assert price_step(t, 8, FAST, latency_s=0.0).step_ms == pytest.approx(68.5)
    # at W=2: wire 1 ms, decode 2 ms: 10 + 40.5 + 1 + 2 + 3 = 56.5
    assert price_step(t, 2, FAST, latency_s=0.0).step_ms == pytest.approx(56.5)


def test_measured_transport_is_kept_per_byte_sent():
    # Measured on loopback (inf Gbit/s: no wire) at W=2, 3 ms of communication, 1e6 bytes sent
    # per rank either way (allreduce 2*1/2*1e6; allgather 1*1e6).
    # allreduce at W=4 sends 2*3/4*1e6 = 1.5e6: transport 4.5 ms; wire on 8 Gbit/s 1.5 ms,
    # pipelined under it: 4.5 ms; on 0.8 Gbit/s the wire (15 ms) is the cost.
    ar = timeline([bucket(0.0, comm=3.0)], backward_end=0.0)
    assert comm_ms(ar, ar.buckets[0], 4, FAST, latency_s=0.0) == pytest.approx(4.5)
    assert comm_ms(ar, ar.buckets[0], 4, 0.8, latency_s=0.0) == pytest.approx(15.0)
    # allgather at W=4 sends 3e6: transport 9 ms, plus the wire 3*(1e6/1e9) s = 3 ms: 12 ms.
    ag = timeline([bucket(0.0, comm=3.0)], backward_end=0.0, hook="allgather_then_aggregate")
    assert comm_ms(ag, ag.buckets[0], 4, FAST, latency_s=0.0) == pytest.approx(12.0)
    # Measured on an 8 Gbit/s link instead: 1 ms of the 3 was wire, 2 ms transport; on 0.8
    # Gbit/s at W=2: 2 + 1e6/1e8 s = 2 + 10 = 12 ms.
    shaped = timeline([bucket(0.0, comm=3.0)], backward_end=0.0, hook="allgather_then_aggregate",
                      link_gbps=FAST, latency_s=0.0)
    assert comm_ms(shaped, shaped.buckets[0], 2, 0.8, latency_s=0.0) == pytest.approx(12.0)


def test_compute_per_sample_from_two_micro_batch_sizes():
    # 24 ms at 32 samples, 40 ms at 64: 0.5 ms a sample on top of 8 ms.
    assert fit_linear((32, 24.0), (64, 40.0)) == LinearCost(8.0, 0.5)
    with pytest.raises(ValueError, match="same size"):
        fit_linear((32, 24.0), (32, 25.0))
    with pytest.raises(ValueError, match="falls"):
        fit_linear((32, 24.0), (64, 20.0))


def test_more_ranks_shrink_each_ranks_compute_at_a_fixed_global_batch():
    # Measured at W=2, 64 samples a rank (global 128). forward 4 + 0.25/sample: 20 at 64, 12 at
    # 32 (x0.6); backward 8 + 0.5/sample: 40 at 64, 24 at 32 (x0.6).
    compute = ComputeScaling(forward=LinearCost(4.0, 0.25), backward=LinearCost(8.0, 0.5))
    # Backward compute 40, buckets ready at 10 (encode 1) and 31 (30 of compute + A's encode),
    # encode 1 each: the backward's own work ends at 40 + 2 = 42.
    t = timeline([bucket(10.0, encode=1.0), bucket(31.0, encode=1.0)], backward_end=42.0,
                 forward=20.0, optimizer=5.0)
    at32 = at_batch(t, compute, 32)
    assert at32.forward_ms == pytest.approx(12.0)
    # compute scaled x0.6, encodes kept: A 10*0.6 = 6; B 30*0.6 + 1 = 19; end 40*0.6 + 2 = 26
    assert [b.ready_ms for b in at32.buckets] == [pytest.approx(6.0), pytest.approx(19.0)]
    assert at32.backward_end_ms == pytest.approx(26.0)
    # W=4 keeps the global batch of 128: 32 a rank. With no wire (inf Gbit/s, no latency)
    # B is done at 19 + 1 = 20 < 26: step = 12 + 26 + optimizer 5 = 43.
    assert price_cell(t, compute, 128, Cell(4, math.inf, latency_s=0.0)).step_ms == pytest.approx(43.0)
    assert at_batch(t, compute, 64) == t  # the measured batch changes nothing


def test_ranks_sharing_the_machines_cores_stretch_every_cpu_phase_not_the_wire():
    # The same timeline (measured at W=2) priced at W=4 on a machine of 2 cores: each rank's CPU
    # phases x2 (4 ranks on 2 cores) over the measurement's (2 ranks on 2: x1). Compute at the
    # rank batch first (32 a rank: x0.6, 43 ms as above), then x2 with no wire: 86 ms.
    compute = ComputeScaling(forward=LinearCost(4.0, 0.25), backward=LinearCost(8.0, 0.5))
    t = timeline([bucket(10.0, encode=1.0), bucket(31.0, encode=1.0)], backward_end=42.0,
                 forward=20.0, optimizer=5.0)
    shared = price_cell(t, compute, 128, Cell(4, math.inf, latency_s=0.0, cores=2))
    assert shared.step_ms == pytest.approx(86.0)
    # a cluster cell (cores None) gives each rank its own core: as before; W=2 on 2 cores: as measured
    assert price_cell(t, compute, 128, Cell(4, math.inf, latency_s=0.0)).step_ms == pytest.approx(43.0)
    assert price_cell(t, compute, 128, Cell(2, math.inf, latency_s=0.0, cores=2)).step_ms == \
        price_step(t, 2, math.inf, 0.0).step_ms
    # the wire is not the CPU's: a bucket's comm on a slow link is the same shared or not
    slow = time_shared(t, 2.0)
    assert comm_ms(slow, slow.buckets[0], 4, 0.1, 0.0) == comm_ms(t, t.buckets[0], 4, 0.1, 0.0)
    assert slow.buckets[1].encode_ms == 2.0 and slow.optimizer_ms == 10.0


def test_compute_points_are_pooled_over_every_trial_at_the_same_world_size_and_batches():
    from service.step_model.trial import ComputePoint, TrialTimeline, pooled_compute

    def trial(w, points, forward=20.0):
        return TrialTimeline(timeline([bucket(10.0)], backward_end=40.0, forward=forward, world_size=w), (5,), points)

    # three W = 2 trials timed the bare module at 32 and 16 samples, one of them on a throttled
    # moment (its 16-sample point as slow as its 32): alone it prices W = 8 (8 samples) as 32's
    quiet = (ComputePoint(32, 20.0, 40.0), ComputePoint(16, 11.0, 21.0))
    noisy = (ComputePoint(32, 20.0, 40.0), ComputePoint(16, 20.0, 40.0))
    at4 = (ComputePoint(16, 30.0, 60.0), ComputePoint(8, 16.0, 31.0))  # another W: pooled apart
    trials = [trial(2, quiet), trial(2, noisy, forward=25.0), trial(2, quiet), trial(4, at4), trial(2, ())]
    pooled = pooled_compute(trials)
    assert [t.compute_points for t in pooled] == [quiet, quiet, quiet, at4, ()]  # the medians, point by point
    assert pooled[1].timeline == trials[1].timeline  # each trial's own step stays its own
    assert pooled[1].compute.forward.at(8) == pytest.approx(6.5)  # 2 + 0.5625 x 8, from the quiet points
    assert trials[1].compute.forward.at(8) == pytest.approx(20.0)  # alone: flat, the noise extrapolated


def test_a_batch_the_trial_measured_is_priced_at_its_measurement_not_extrapolated():
    from service.step_model.trial import ComputePoint, TrialTimeline

    def trial(points):
        return TrialTimeline(timeline([bucket(10.0)], backward_end=40.0, forward=20.0), (5,), points)

    # W = 2's rank timed at 32, 16 and 8 samples; the compute is not a line (a cache effect):
    # 32 -> 20 ms, 16 -> 12 ms, 8 -> 4 ms. The line through 32 and 16 says 8 ms at 8 samples.
    three = trial((ComputePoint(32, 20.0, 40.0), ComputePoint(16, 12.0, 22.0), ComputePoint(8, 4.0, 9.0)))
    two = trial(three.compute_points[:2])
    assert two.compute.forward.at(8) == pytest.approx(8.0)  # extrapolated
    assert three.compute.forward.at(8) == pytest.approx(4.0)  # measured: W = 8's batch
    assert [three.compute.backward.at(n) for n in (32, 16, 8)] == [pytest.approx(v) for v in (40.0, 22.0, 9.0)]
    assert three.compute.forward.at(24) == pytest.approx(16.0)  # between 16 and 32: their line
    assert three.compute.forward.at(12) == pytest.approx(8.0)  # between 8 and 16: theirs
    assert three.compute.forward.at(4) == pytest.approx(0.0)  # below 8: the end pair's line (floored at 0)
    assert three.compute.forward.at(64) == pytest.approx(36.0)  # above 32: the other end pair's
    # a segment whose cost fell as the batch grew (noise) is flat at its larger batch's measurement
    noisy = trial((ComputePoint(32, 20.0, 40.0), ComputePoint(16, 12.0, 22.0), ComputePoint(8, 14.0, 9.0)))
    assert noisy.compute.forward.at(8) == pytest.approx(12.0) and noisy.compute.forward.at(32) == pytest.approx(20.0)
    assert trial(three.compute_points[:1]).compute is None  # one point: no scaling


def test_a_cell_with_more_ranks_than_samples_is_refused_with_its_reason():
    assert rank_batch(128, 128) == 1
    assert rank_batch(100, 8) == 13  # the largest share sets the step
    t = timeline([bucket(10.0)], backward_end=20.0)
    compute = ComputeScaling(forward=LinearCost(4.0, 0.25), backward=LinearCost(8.0, 0.5))
    with pytest.raises(CellRefused, match=r"W=256 has more ranks than the global batch has samples \(128\)"):
        price_cell(t, compute, 128, Cell(256, 10.0))


def test_combining_steps_and_ranks_takes_medians_then_the_slowest_compute_and_the_least_comm():
    def sampled(forward, ready, comm, decode):
        return timeline([bucket(ready, comm=comm, decode=LinearCost(decode))], backward_end=40.0, forward=forward)

    rank0 = [sampled(10, 10, 5, 1.0), sampled(12, 10, 6, 1.0), sampled(30, 10, 50, 9.0)]  # one slow step
    rank1 = [sampled(11, 14, 2, 2.0), sampled(11, 15, 3, 2.0), sampled(11, 16, 4, 2.0)]  # late, so waits less
    both = combine([rank0, rank1])
    # medians: rank 0 forward 12, ready 10, comm 6, decode 1; rank 1 forward 11, ready 15, comm 3, decode 2
    assert both.forward_ms == 12 and both.buckets[0].ready_ms == 15 and both.buckets[0].decode == LinearCost(2.0)
    assert both.buckets[0].comm_ms == 3
    assert both.backward_end_ms == 40.0 and both.optimizer_ms == 3.0 and both.hook == "allreduce"
    with pytest.raises(ValueError, match="different buckets"):
        combine([rank0, [timeline([bucket(10.0, numel=N + 1)], backward_end=40.0)]])


def test_a_timeline_out_of_ready_order_or_negative_is_refused():
    with pytest.raises(ValueError, match="ready order"):
        timeline([bucket(20.0), bucket(10.0)], backward_end=30.0)
    with pytest.raises(ValueError, match="non-negative"):
        timeline([bucket(10.0, encode=-1.0)], backward_end=30.0)


def test_hooks_that_decode_each_rank_gather_every_ranks_message():
    """decodes_each_rank is data on the spec: it must go with an allgather of the rank's message."""
    for name, s in hooks.available().items():
        kinds = {c.kind for c in hooks.cost.hook_collectives(name, 4096, 4)}
        if s.decodes_each_rank:
            assert kinds == {"allgather"}, name
