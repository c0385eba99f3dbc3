"""DDP's own knobs as sweep axes (issue 27, item 3): what they do to the hooks, on real gloo
processes. The config and worker side (the trial key, names, params, DDP's arguments) are in
the second half of this file."""
from __future__ import annotations

import pytest

import hooks
from tests.ddp_knob_checks import cumulative_errors
from tests.dist_utils import run_distributed

EF_HOOKS = [n for n, s in hooks.available().items() if "error_feedback" in s.params and n != "powersgd"]
KNOBS = [{}, {"bucket_cap_mb": 0.004, "static_graph": True}, {"bucket_cap_mb": 0.004, "gradient_as_bucket_view": True},
         {"bucket_cap_mb": 0.004, "static_graph": True, "gradient_as_bucket_view": True}]
# The identity is exact for a hook that averages each rank's compressed contribution as sent;
# one that sums on a lossy wire rounds the sum too (its unit roundoff per step, at most).
SUM_ROUNDING = {"fp16_compress": 2**-11, "bf16_compress": 2**-8, "quantized_allreduce": 2**-8}
# Quantizers whose sum is exact flush their residual within a few steps: the cumulative error
# stays put. (Where the wire rounds the sum, SUM_ROUNDING's hooks, that rounding is in no
# rank's residual and adds up; topk/randomk/signsgd keep a coordinate's residual growing until
# it is sent, ~n/k steps.)
FLUSH_FAST = {"quantization_pertensor", "quantization_perchannel", "qsgd"}
# Deterministic rounding without error feedback: the same bias every step, so it grows with N
# (qsgd rounds stochastically, without bias).
BIASED = {"quantization_pertensor", "quantization_perchannel", "quantized_allreduce"}


@pytest.fixture(scope="module")
def errors():
    return run_distributed(cumulative_errors, 2, args=(EF_HOOKS, KNOBS))


def _knob(kw: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(kw.items()))


@pytest.mark.parametrize("name", EF_HOOKS)
def test_error_feedback_keeps_its_cumulative_error_bound_under_every_knob(errors, name):
    """sum of what the hook returned over N steps == N x exact mean - the ranks' mean residual,
    under small buckets, static_graph (which rebuilds the buckets a step later) and gradients
    that are views of the buckets, and across a checkpoint resumed in a fresh DDP."""
    for kw in KNOBS:
        for run in ("ef", "ef-resumed"):
            r = errors[0][name, _knob(kw), run]
            assert r["identity"] <= SUM_ROUNDING.get(name, 1e-6), (name, kw, run, r)
            if kw.get("bucket_cap_mb"):
                assert r["buckets"] >= 2, r  # small buckets: more than one (after the rebuild)
            if name in FLUSH_FAST:
                assert r["full"] <= 1.2 * r["half"], (name, kw, run, r)  # bounded: not growing with N
        plain = errors[0][name, _knob(kw), "plain"]
        if name in BIASED:
            assert plain["full"] >= 1.8 * plain["half"], (name, kw, plain)  # without it: grows with N
        assert errors[1][name, _knob(kw), "ef"] == errors[0][name, _knob(kw), "ef"]  # the same mean on each rank
