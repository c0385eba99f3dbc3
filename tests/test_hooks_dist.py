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
               "check_compressors", "check_feedback_across_no_sync", "check_accumulation_compressors"],),
    )


@pytest.mark.timeout(900)
def test_world_size_4_accounting_and_bounds():
    results = run_distributed(run_checks, world_size=4, args=(["check_buckets"],))
    assert results[0]["check_buckets"]["quantized_allreduce_wire_ratio"] <= 0.27
