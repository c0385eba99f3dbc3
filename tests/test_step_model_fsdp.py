"""The step model's fsdp step (service/step_model/price.py: price_sharded_step): every collective
on the training thread in turn, each priced from its form at the cell's W and link; its stamps
made a timeline, combined over steps and ranks, and its JSON read back. Pure Python: the real
trials' timelines are tests/test_fsdp_training.py's."""
from __future__ import annotations

import math

import pytest

from hooks.cost import collective_seconds
from hooks.quantize import message_bytes
from hooks.step_sampling import BucketCall, SampledStep
from service.step_model.combine import combine
from service.step_model.price import (Cell, ComputeScaling, price_cell, price_step, sharded_comm_ms, time_shared)
from service.step_model.stamps import step_timeline
from service.step_model.timeline import LinearCost, ShardedCall, StepTimeline
from service.step_model.transport import KindFit, TransportFit
from service.step_model.trial import TrialTimeline

N = 1 << 20  # one block's unsharded values


def fsdp_step(hook="allreduce", calls=None, **params) -> StepTimeline:
    """One block: its all-gather in the forward and the backward, its reduce-scatter; 1 ms comm each."""
    calls = calls or (ShardedCall("all_gather", "forward", N, 0.1, 1.0, LinearCost(0.2)),
                      ShardedCall("all_gather", "backward", N, 0.1, 1.0, LinearCost(0.2)),
                      ShardedCall("reduce_scatter", "backward", N, 0.3, 1.0, LinearCost(0.4)))
    params = {"all_gather": "fp32", "all_gather_chunk_size": 512, **params}
    return StepTimeline(hook=hook, world_size=2, batch=16, forward_ms=10.0, buckets=(), backward_end_ms=20.0,
                        optimizer_ms=2.0, hook_params=params, sharded=tuple(calls))


def test_the_step_is_its_compute_plus_every_call_in_turn_nothing_overlapped():
    t = fsdp_step()
    calls = sum(c.encode_ms + c.comm_ms + c.decode.at(1) for c in t.sharded)
    # priced where it was measured (loopback: no wire), every call's own measured time comes back
    assert price_step(t, 2, math.inf, 0.0).step_ms == pytest.approx(32.0 + calls)
    assert price_step(t, 2, math.inf, 0.0).compute_ms == pytest.approx(32.0)


def test_a_slower_link_adds_each_calls_wire_from_its_form():
    t = fsdp_step()
    fast, slow = price_step(t, 2, math.inf, 0.0), price_step(t, 2, 1.0, 0.0)
    wire = 1000 * (2 * collective_seconds("all_gather", 4 * N, 2, 1.0, 0.0)
                   + collective_seconds("reduce_scatter", 4 * N, 2, 1.0, 0.0))
    # neither FSDP kind overlaps its transport with the wire: the measured comm stays, the wire adds up
    assert slow.step_ms - fast.step_ms == pytest.approx(wire)


def test_a_compressed_form_puts_its_own_bytes_on_the_wire():
    fp32, bf16 = fsdp_step(), fsdp_step("bf16_compress", all_gather="bf16")
    uint8 = fsdp_step("quantized_allreduce", chunk_size=512, all_gather="uint8")
    at = {name: price_step(t, 8, 1.0, 0.0).step_ms - price_step(t, 8, math.inf, 0.0).step_ms
          for name, t in (("fp32", fp32), ("bf16", bf16), ("uint8", uint8))}
    assert at["bf16"] == pytest.approx(at["fp32"] / 2, rel=1e-3)
    each = 8 * message_bytes(N // 8, 512)  # a uint8 code per value and each chunk's scale and offset
    assert at["uint8"] == pytest.approx(at["fp32"] * each / (4 * N), rel=1e-3)


def test_a_uint8_decode_stays_the_same_at_any_world_size():
    # W rows of n / W values: the same n values dequantized at W = 2 and at W = 8
    call = ShardedCall("all_gather", "forward", N, 0.0, 0.0, LinearCost(1.0))
    t = fsdp_step("quantized_allreduce", calls=[call], chunk_size=512, all_gather="uint8")
    assert price_step(t, 8, math.inf, 0.0).step_ms == pytest.approx(price_step(t, 2, math.inf, 0.0).step_ms)


def test_ranks_sharing_cores_stretch_the_calls_own_work_not_their_collectives():
    t = fsdp_step()
    shared = time_shared(t, 2.0)
    assert [c.encode_ms for c in shared.sharded] == [0.2, 0.2, 0.6]
    assert [c.decode.fixed_ms for c in shared.sharded] == [0.4, 0.4, 0.8]
    assert [c.comm_ms for c in shared.sharded] == [c.comm_ms for c in t.sharded]
    scaling = ComputeScaling(LinearCost(0.0, 10.0 / 16), LinearCost(0.0, 20.0 / 16))
    # W = 4 keeps the global batch of 32: each rank's compute halves, the calls' own work does not
    four = price_cell(t, scaling, 32, Cell(4, math.inf, 0.0))
    assert four.compute_ms == pytest.approx(5.0 + 10.0 + 1.0)  # the optimizer steps a quarter, not a half


def test_each_rank_steps_its_own_shard_so_the_optimizer_shrinks_with_more_ranks():
    t = fsdp_step()  # measured at W = 2: optimizer 2 ms
    flat = ComputeScaling(LinearCost(10.0), LinearCost(20.0))  # the same forward and backward at any batch
    four = price_cell(t, flat, 32, Cell(4, math.inf, 0.0))
    assert four.compute_ms == pytest.approx(10.0 + 20.0 + 1.0)
    ddp = StepTimeline(hook="allreduce", world_size=2, batch=16, forward_ms=10.0, buckets=(), backward_end_ms=20.0,
                       optimizer_ms=2.0)
    assert price_cell(ddp, flat, 32, Cell(4, math.inf, 0.0)).compute_ms == pytest.approx(32.0)  # every parameter


def test_a_transport_fit_without_the_fsdp_kinds_leaves_the_measured_comm_in_place():
    t = fsdp_step()
    ddp_only = TransportFit({"allreduce": (KindFit(2, 0.1, 1e-6, 0.0),)}, (), {})
    call = t.sharded[2]
    assert sharded_comm_ms(t, call, 4, math.inf, 0.0, ddp_only) == pytest.approx(
        sharded_comm_ms(t, call, 4, math.inf, 0.0, None))
    probed = TransportFit({"reduce_scatter": (KindFit(2, 0.5, 0.0, 0.0),)}, (), {})
    assert sharded_comm_ms(t, call, 2, math.inf, 0.0, probed) == pytest.approx(0.5)


def _call(kind, t0, launched, completed, returned, numel=N):
    c = BucketCall(numel, 4, t0, kind)
    c.launched, c.completed, c.returned = launched, completed, returned
    return c


def test_stamps_make_the_calls_and_take_them_out_of_the_passes_compute():
    # forward 0..10 ms with one all-gather (2..5), backward 10..30 with an all-gather and a reduce-scatter
    sample = SampledStep(step=5, forward=0.0, backward=0.010, optimizer=0.030, end=0.032,
                         calls=[_call("all_gather", 0.002, 0.0025, 0.0045, 0.005),
                                _call("all_gather", 0.012, 0.012, 0.014, 0.0142),
                                _call("reduce_scatter", 0.020, 0.021, 0.027, 0.028)])
    t = step_timeline(sample, "quantized_allreduce", {"chunk_size": 512, "all_gather": "fp32"}, 2, 16)
    assert [(c.kind, c.phase) for c in t.sharded] == [("all_gather", "forward"), ("all_gather", "backward"),
                                                       ("reduce_scatter", "backward")]
    assert t.forward_ms == pytest.approx(7.0) and t.backward_end_ms == pytest.approx(20.0 - 2.2 - 8.0)
    rs = t.sharded[2]
    assert (rs.encode_ms, rs.comm_ms) == pytest.approx((1.0, 6.0))
    assert (rs.decode.fixed_ms, rs.decode.per_unit_ms) == pytest.approx((1.0, 0.0))


def test_ranks_combine_to_the_slowest_work_and_the_least_comm_and_the_json_reads_back():
    a = fsdp_step()
    b = fsdp_step(calls=[ShardedCall(c.kind, c.phase, c.numel, c.encode_ms * 2, c.comm_ms / 2, c.decode)
                         for c in a.sharded])
    both = combine([[a], [b]])
    assert [c.encode_ms for c in both.sharded] == [0.2, 0.2, 0.6]
    assert [c.comm_ms for c in both.sharded] == [0.5, 0.5, 0.5]
    trial = TrialTimeline(both, (5,))
    assert TrialTimeline.from_json(trial.to_json()) == trial
