"""The hooks' sharded forms (FSDP2): their specs, validation and refusals, the new collective
kinds' wire formulas, and, on real gloo groups at W = 2 and 3 (uneven shards), each form's
reduced gradient, bytes, error feedback, NaN flags and checkpointed state (tests/sharded_checks.py)."""
import pytest

import hooks
import hooks.fsdp
from hooks import wire
from tests.dist_utils import run_distributed
from tests.sharded_checks import run_checks

CHECKS = ["check_forms_reach_the_mean", "check_bytes_match_formulas", "check_all_gather_error_recorded",
          "check_quantized_error_feedback", "check_nan_flags_name_the_module", "check_state_round_trip"]


def test_the_specs_say_which_hooks_have_a_sharded_form():
    with_form = [name for name, s in hooks.available().items() if s.sharded is not None]
    assert with_form == ["allreduce", "fp16_compress", "bf16_compress", "quantized_allreduce"]
    assert hooks.fsdp.sharded_hooks() == with_form


def test_a_hook_without_a_sharded_form_is_refused_in_one_line_naming_those_with_one():
    line = hooks.fsdp.refusal("powersgd")
    assert "\n" not in line and "powersgd" in line and "quantized_allreduce" in line
    with pytest.raises(ValueError, match="no sharded form"):
        hooks.fsdp.validate("topk")
    assert hooks.fsdp.refusal("bf16_compress") is None


def test_sharded_parameters_validate_with_the_hooks_own():
    assert hooks.fsdp.validate("quantized_allreduce", all_gather="uint8") == {
        "chunk_size": 512, "error_feedback": False, "all_gather": "uint8", "all_gather_chunk_size": 512}
    assert hooks.fsdp.parameters("allreduce") == {"all_gather": "fp32", "all_gather_chunk_size": 512}
    with pytest.raises(ValueError, match="all_gather"):
        hooks.fsdp.validate("allreduce", all_gather="int4")
    with pytest.raises(ValueError, match="chunk_size"):
        hooks.fsdp.validate("allreduce", chunk_size=64)
    # the DDP hook itself takes none of them: a ddp trial's parameters are what they were
    with pytest.raises(ValueError, match="all_gather"):
        hooks.validate("allreduce", all_gather="bf16")


def test_reduce_scatter_and_all_gather_wire_formulas():
    for w in (1, 2, 3, 8):
        assert wire.wire_bytes("reduce_scatter", 1200, w) == pytest.approx((w - 1) / w * 1200)
        assert wire.wire_bytes("all_gather", 1200, w) == pytest.approx((w - 1) / w * 1200)
        assert wire.rounds("reduce_scatter", w) == wire.rounds("all_gather", w) == w - 1
    assert set(wire.SHARDED_KINDS) & set(wire.KINDS) == set()  # the probe and DDP's step model see no new kind


def test_stats_report_the_new_kinds_and_old_checkpoints_load():
    state, _ = hooks.build("allreduce")
    s = state.stats()
    assert s["reduce_scatter_bytes"] == 0 and s["all_gather_calls"] == 0
    old = state.state_dict()
    for kind in wire.SHARDED_KINDS:  # a checkpoint written before these kinds existed
        del old["stats"]["per_kind"][kind]
    state.load_state_dict(old)
    state.accounting.collective("reduce_scatter", 100, 2)
    assert state.stats()["reduce_scatter_bytes"] == 100


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size", [2, 3])
def test_sharded_forms_on_gloo(world_size):
    results = run_distributed(run_checks, world_size=world_size, args=(CHECKS,))
    assert results[0]["check_forms_reach_the_mean"]["allreduce"] <= 1e-6
