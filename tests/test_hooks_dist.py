"""Hooks on real gloo process groups (spawned processes on 127.0.0.1); the checks live in
tests/hooks_checks.py. World sizes 2, 3 (odd) and 4; world size 1 through one-rank groups.
Each test spawns its processes once and runs several checks in them (spawning costs seconds)."""
import pytest

from tests.dist_utils import run_distributed
from tests.hooks_checks import run_checks


@pytest.mark.timeout(900)
def test_world_size_2_buckets_accumulation_bit_exactness_feedback_fidelity_resume():
    results = run_distributed(
        run_checks,
        world_size=2,
        args=(
            [
                "check_buckets",
                "check_bit_exact_vs_torch",
                "check_accumulation",
                "check_perchannel_beats_pertensor",
                "check_error_feedback",
                "check_fidelity",
                "check_resume",
                "check_compressors",
                "check_feedback_across_no_sync",
                "check_accumulation_compressors",
                "check_topk_feedback_direction",
                "check_powersgd_vs_torch",
                "check_wire_dtype",
            ],
        ),
    )
    assert results[0]["check_accumulation"]["checked_buckets"] > 0
    assert results[0]["check_accumulation_compressors"]["checked_buckets"] > 0


@pytest.mark.timeout(900)
def test_world_size_3_odd():
    run_distributed(
        run_checks,
        world_size=3,
        args=(["check_buckets", "check_accumulation_quantized_allreduce", "check_error_feedback",
               "check_compressors", "check_feedback_across_no_sync", "check_accumulation_compressors",
               "check_powersgd_vs_torch", "check_wire_dtype"],),
    )


@pytest.mark.timeout(900)
def test_world_size_4_accounting_and_bounds():
    results = run_distributed(run_checks, world_size=4, args=(["check_buckets"],))
    assert results[0]["check_buckets"]["quantized_allreduce_wire_ratio"] <= 0.27


@pytest.mark.timeout(600)
def test_every_hook_propagates_a_failed_collective_on_every_rank():
    """Issue 13: six hooks' callbacks never read their collective's future, so a failed
    collective came back as this rank's own bucket (or uninitialised memory) as the mean."""
    import hooks

    results = run_distributed(run_checks, world_size=2, args=(["check_collective_failure_propagates"],))
    for result in results:  # run_distributed raises if any rank's check failed
        assert set(hooks.available()) <= set(result["check_collective_failure_propagates"]["checked"])
