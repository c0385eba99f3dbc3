"""Hooks on real gloo process groups (spawned processes on 127.0.0.1); the checks live in
tests/hooks_checks.py. World sizes 2, 3 (odd) and 4; world size 1 through one-rank groups."""
import pytest

from tests.dist_utils import run_distributed
from tests.hooks_checks import run_checks


@pytest.mark.timeout(900)
def test_world_size_2_buckets_accumulation_and_bit_exactness():
    results = run_distributed(
        run_checks,
        world_size=2,
        args=(["check_buckets", "check_bit_exact_vs_torch", "check_accumulation", "check_perchannel_beats_pertensor"],),
    )
    assert results[0]["check_accumulation"]["checked_buckets"] > 0


@pytest.mark.timeout(900)
def test_world_size_3_odd():
    run_distributed(run_checks, world_size=3, args=(["check_buckets"],))


@pytest.mark.timeout(900)
def test_world_size_4_accounting_and_bounds():
    run_distributed(run_checks, world_size=4, args=(["check_buckets"],))
