"""The plan hook (hooks/plan.py): its parameters as mappings or text and their canonical form,
one-line refusals in the library and in the sweep config, its state (per bucket, shared
residuals saved once), and on real gloo groups (tests/plan_checks.py): a uniform plan equals its
hook bit for bit, a mixed plan's per-bucket accounting adds up, the no_sync regression at W = 2
and 3. The conformance checks every hook passes (tests/test_hooks_dist.py) include the plan
through ``hooks.available()`` with its ``TEST_PARAMS`` (tests/hooks_checks.py)."""
from __future__ import annotations

import io

import pytest
import torch

import hooks
from service.config import ConfigError, load_config
from tests.dist_utils import init_single_rank_group, run_distributed
from tests.hooks_checks import Bucket
from tests.plan_checks import run_plan_checks


def test_a_plan_is_kept_as_canonical_text_however_it_is_given():
    as_mapping = hooks.validate("plan", buckets={2: {"name": "quantized_allreduce", "chunk_size": 256},
                                                 0: {"name": "fp16_compress", "error_feedback": False}},
                                default={"name": "quantization_perchannel", "chunk_size": 64})
    as_text = hooks.validate("plan", buckets=" 0 = fp16_compress ; 2=quantized_allreduce( chunk_size = 256 )",
                             default="quantization_perchannel(chunk_size=64)")
    assert as_mapping == as_text == {"buckets": "0=fp16_compress;2=quantized_allreduce(chunk_size=256)",
                                     "default": "quantization_perchannel(chunk_size=64)"}
    assert hooks.validate("plan") == {"buckets": "", "default": "allreduce"}
    assert hooks.validate("plan", buckets={"1": "topk(ratio=0.1,error_feedback=true)"})["buckets"] == \
        "1=topk(error_feedback=true,ratio=0.1)"
    spec = hooks.available()["plan"]
    assert spec.lossy and spec.wire_bits is None and not spec.chunked and spec.doc


@pytest.mark.parametrize("params, words", [
    ({"buckets": {-1: "allreduce"}}, ["'buckets'", "bucket index -1 is negative"]),
    ({"buckets": "-2=allreduce"}, ["'buckets'", "-2 is negative"]),
    ({"buckets": {0: {"name": "plan"}}}, ["bucket 0", "cannot be a plan"]),
    ({"default": "plan"}, ["'default'", "cannot be a plan"]),
    ({"buckets": {3: "nope"}}, ["bucket 3", "unknown hook 'nope'"]),
    ({"buckets": {0: {"name": "topk", "ratio": 2}}}, ["bucket 0", "'ratio'", "(0, 1]"]),
    ({"buckets": {0: {"name": "allreduce", "chunk_size": 8}}}, ["bucket 0", "no parameter 'chunk_size'"]),
    ({"buckets": {0: "allreduce", "0": "fp16_compress"}}, ["bucket 0 is given twice"]),
    ({"buckets": {1.5: "allreduce"}}, ["a bucket index is an integer, got 1.5"]),
    ({"buckets": "0:allreduce"}, ["is not index=configuration"]),
    ({"default": {"chunk_size": 64}}, ["'default'", "needs a hook name"]),
    ({"default": "fp16_compress(error_feedback)"}, ["is not param=value"]),
    ({"buckets": 3}, ["'buckets' must be a mapping of bucket index"]),
])
def test_a_bad_plan_is_refused_in_one_line(params, words):
    with pytest.raises(ValueError) as err:
        hooks.validate("plan", **params)
    message = str(err.value)
    assert "\n" not in message and message.startswith("hook 'plan': parameter"), message
    for word in words:
        assert word in message, (word, message)


def _config(tmp_path, entry: str):
    path = tmp_path / "plan.yaml"
    path.write_text("name: plan\nworkload: {name: mlp_digits, steps: 20}\n"
                    f"search:\n  hooks:\n    - {entry}\n  world_size: [2]\n")
    return load_config(path)[0]


def test_the_sweep_config_names_a_plan_as_a_mapping_or_as_text(tmp_path):
    cfg = _config(tmp_path, "{name: plan, buckets: {0: {name: fp16_compress}, 2: {name: quantized_allreduce, "
                            "chunk_size: 256}}, default: allreduce}")
    (trial,) = cfg.trials()
    assert trial.hook_params == {"buckets": "0=fp16_compress;2=quantized_allreduce(chunk_size=256)",
                                 "default": "allreduce"}
    assert trial.run_name == "plan-buckets0=fp16_compress;2=quantized_allreduce(chunk_size=256)-w2-s0"
    swept = _config(tmp_path, "{name: plan, buckets: ['0=fp16_compress', {0: {name: bf16_compress}}], "
                              "default: {name: quantization_perchannel, chunk_size: 64}}")
    assert [t.hook_params["buckets"] for t in swept.trials()] == ["0=fp16_compress", "0=bf16_compress"]
    assert {t.hook_params["default"] for t in swept.trials()} == {"quantization_perchannel(chunk_size=64)"}


@pytest.mark.parametrize("entry, words", [
    ("{name: plan, buckets: {0: {name: nope}}}", ["search.hooks[0].buckets", "unknown hook 'nope'"]),
    ("{name: plan, buckets: {1: {name: plan}}}", ["search.hooks[0].buckets", "cannot be a plan"]),
    ("{name: plan, default: {name: plan}}", ["search.hooks[0].default", "cannot be a plan"]),
    ("{name: plan, buckets: {-1: allreduce}}", ["search.hooks[0].buckets", "-1 is negative"]),
    ("{name: plan, buckets: '0=nope'}", ["search.hooks[0].buckets", "unknown hook 'nope'"]),
    ("{name: plan, buckets: ['0=fp16_compress', {0: fp16_compress}]}", ["search.hooks[0].buckets", "repeats"]),
    ("{name: plan, bukets: {0: allreduce}}", ["search.hooks[0].bukets", "did you mean 'buckets'"]),
    ("{name: plna, buckets: {0: allreduce}}", ["search.hooks[0].name", "unknown hook 'plna'"]),
    ("{name: quantization_perchannel, chunk_size: {a: 1}}", ["search.hooks[0].chunk_size", "not allowed"]),
])
def test_a_bad_plan_in_the_config_is_one_config_error_line(tmp_path, entry, words):
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, entry)
    message = str(err.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, (word, message)


def test_the_cost_model_prices_a_plan_as_its_default():
    n = 1 << 16
    assert hooks.cost.hook_collectives("plan", n, 4, buckets="0=allreduce", default="fp16_compress") == \
        hooks.cost.hook_collectives("fp16_compress", n, 4)
    assert hooks.cost.hook_wire_bytes("plan", n, 4) == hooks.cost.hook_wire_bytes("allreduce", n, 4)


def test_each_bucket_has_its_own_state_and_the_residuals_are_saved_once():
    state, hook = hooks.build("plan", buckets={1: {"name": "fp16_compress", "error_feedback": True}},
                              default="quantization_pertensor(error_feedback=true)")
    buckets = [Bucket(torch.randn(50, generator=torch.Generator().manual_seed(i)), index=i) for i in range(3)]
    init_single_rank_group()
    try:
        for step in range(2):
            for b in reversed(buckets):
                hook(state, b).wait()
    finally:
        torch.distributed.destroy_process_group()
    states = [state.by_bucket[i].state for i in range(3)]
    assert len({id(s) for s in states}) == 3 and all(s.residuals is state.residuals for s in states)
    assert [state.bucket_stats()[i]["config"] for i in range(3)] == [
        "quantization_pertensor(error_feedback=true)", "fp16_compress(error_feedback=true)",
        "quantization_pertensor(error_feedback=true)"]
    assert state.stats()["calls"] == 6 and state.stats()["allreduce_calls"] == 2
    d = state.state_dict()
    assert len(d["residuals"]) == 3 and all(not b["residuals"] for b in d["buckets"].values())
    buf = io.BytesIO()
    torch.save(d, buf)
    buf.seek(0)
    fresh, _ = hooks.build("plan", **state.params)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert fresh.stats() == {**state.stats(), "seconds": fresh.stats()["seconds"]}
    assert sorted(fresh.by_bucket) == [0, 1, 2] and len(fresh.residuals.restored) == 3
    state.reset_stats()
    assert state.stats()["calls"] == 0 and all(s["calls"] == 0 for s in state.bucket_stats().values())


@pytest.mark.timeout(900)
def test_world_size_2_uniform_plan_is_its_hook_and_mixed_accounting_adds_up():
    results = run_distributed(run_plan_checks, world_size=2, args=([
        "check_uniform_plan_is_its_hook", "check_mixed_plan_accounting",
        "check_powersgd_in_a_plan_counts_its_own_steps", "check_plan_accumulation"],))
    assert len(results[0]["check_uniform_plan_is_its_hook"]["compared"]) == 16
    assert results[0]["check_plan_accumulation"]["checked_buckets"] > 0


@pytest.mark.timeout(900)
def test_world_size_3_no_sync_and_mixed_accounting():
    run_distributed(run_plan_checks, world_size=3, args=(["check_plan_accumulation", "check_mixed_plan_accounting"],))
