"""DDP's own knobs as sweep axes (issue 27, item 3): what they do to the hooks, on real gloo
processes. The config and worker side (the trial key, names, params, DDP's arguments) are in
the second half of this file."""
from __future__ import annotations

import json

import pytest
import yaml

import hooks
from service import tracking
from service.config import ConfigError, SweepConfig, TrialSpec, load_config
from tests.ddp_knob_checks import bucket_sizes, cumulative_errors, knobs_through_the_worker
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


# ----------------------------------------------------------------------------- the config's axes

BASE = {"name": "knobs", "workload": {"name": "tests.tiny_workload:tiny_deep", "steps": 6, "global_batch_size": 32,
                                      "lr": 0.05, "eval_every": 6, "warmup_steps": 1},
        "search": {"hooks": ["allreduce"], "world_size": [2], "seed": [0]}, "tracking": {"flush_seconds": 0.5}}


def _cfg(search=None, workload=None, tracking=None) -> SweepConfig:
    return SweepConfig.model_validate({**BASE, "search": {**BASE["search"], **(search or {})},
                                       "workload": {**BASE["workload"], **(workload or {})},
                                       "tracking": {**BASE["tracking"], **(tracking or {})}})


def test_the_knobs_default_to_ddps_own_and_leave_a_default_trials_identity_as_it_was():
    trial = _cfg().trials()[0]
    assert trial.knobs() == {"bucket_cap_mb": 25.0, "gradient_as_bucket_view": False, "static_graph": False,
                             "compile": False}
    assert trial.run_name == "allreduce-w2-s0" and trial.key == "allreduce[]-w2-s0"
    assert _cfg({"bucket_cap_mb": 25}).trials() == _cfg().trials()  # 25 is the default, spelled out
    cfg = _cfg(workload={"find_unused_parameters": "auto", "broadcast_buffers": True})
    assert cfg.fingerprint() == _cfg().fingerprint()


def test_the_knobs_multiply_the_grid_and_name_each_trial():
    cfg = _cfg({"hooks": ["allreduce", "quantization_pertensor"], "bucket_cap_mb": [0.25, 1, 25],
                "gradient_as_bucket_view": [False, True], "static_graph": True})
    trials = cfg.trials()
    assert len(trials) == 2 * 3 * 2 * 1
    names = [t.run_name for t in trials]
    # static_graph, the same in every trial, is a setting, not a difference: it names nothing
    assert names[:6] == ["allreduce-b0.25-w2-s0", "allreduce-b0.25-view-w2-s0",
                         "allreduce-b1-w2-s0", "allreduce-b1-view-w2-s0",
                         "allreduce-w2-s0", "allreduce-view-w2-s0"]
    assert len(set(names)) == len(names) and len({t.key for t in trials}) == len(trials)
    assert trials[0].key == ("allreduce[]-ddp[bucket_cap_mb=0.25,gradient_as_bucket_view=False,static_graph=True]"
                             "-w2-s0")
    assert "bucket_cap_mb=0.25" in trials[0].describe() and "static_graph=True" in trials[0].describe()
    assert TrialSpec.from_dict(trials[3].to_dict()) == trials[3]  # through Ray as a dict


def test_the_knobs_are_the_trials_params_identity_and_configuration_label():
    trial = next(t for t in _cfg({"bucket_cap_mb": [1, 25], "static_graph": [False, True]}).trials()
                 if t.bucket_cap_mb == 1 and t.static_graph)
    cfg = _cfg(workload={"find_unused_parameters": False})
    params = tracking.trial_params(trial, cfg)
    assert (params["bucket_cap_mb"], params["gradient_as_bucket_view"], params["static_graph"]) == (1.0, False, True)
    assert (params["find_unused_parameters"], params["broadcast_buffers"]) == (False, True)
    tags = tracking.identity_tags(trial)
    assert tags["trial_config"] == "allreduce-b1-static"  # the report's and summary's label
    assert json.loads(tags["trial_ddp"]) == trial.knobs()
    assert tags["trial_key"] == trial.key != _cfg().trials()[0].key  # --resume tells them apart


def test_a_knob_every_trial_shares_names_no_configuration_and_keeps_the_baselines_label():
    """One non-default value is the sweep's setting: labelled by it, the baseline was
    allreduce-b1, which the verdicts do not take for allreduce, and every verdict was undecided."""
    cfg = _cfg({"hooks": ["allreduce", "fp16_compress"], "bucket_cap_mb": 1, "static_graph": True})
    trials = cfg.trials()
    assert [t.config_label for t in trials] == ["allreduce", "fp16_compress"]
    assert all(t.knobs() == {"bucket_cap_mb": 1.0, "gradient_as_bucket_view": False, "static_graph": True,
                             "compile": False}
               for t in trials)
    # the key still spells them: --resume does not take these for the default trials
    assert trials[0].key != _cfg().trials()[0].key and "bucket_cap_mb=1.0" in trials[0].key
    assert TrialSpec.from_dict(trials[0].to_dict()).config_label == "allreduce"
    # a trial passed as a dict without the field (recorded before it) names every knob, as then
    old = {k: v for k, v in trials[0].to_dict().items() if k != "named_knobs"}
    assert TrialSpec.from_dict(old).config_label == "allreduce-b1-static"


@pytest.mark.parametrize("search, workload, fragment", [
    ({"bucket_cap_mb": 0}, {}, "search.bucket_cap_mb[0]: 0 is not allowed; a bucket cap is above 0 and at most "
                               "1024 MiB (DDP's default: 25)"),
    ({"bucket_cap_mb": [1, 5000]}, {}, "search.bucket_cap_mb[1]: 5000 is not allowed"),
    ({"bucket_cap_mb": [1, 1.0]}, {}, "search.bucket_cap_mb: [1.0, 1.0] lists a cap twice"),
    ({"bucket_cap_mb": "big"}, {}, "search.bucket_cap_mb[0]: must be a valid number (got 'big')"),
    ({"bucket_cap_mb": []}, {}, "search.bucket_cap_mb: must not be empty"),
    ({"static_graph": "yes"}, {}, "search.static_graph[0]: must be a valid boolean (got 'yes')"),
    ({"gradient_as_bucket_view": [True, True]}, {}, "search.gradient_as_bucket_view: [True, True] lists a value twice"),
    ({}, {"find_unused_parameters": "sometimes"}, "workload.find_unused_parameters: 'sometimes' is not allowed; "
                                                  "allowed: auto, true or false"),
    ({}, {"broadcast_buffers": 1}, "workload.broadcast_buffers: must be a valid boolean (got 1)"),
    # PyTorch's DDP: static_graph under no_sync fails (pytorch/pytorch#143580), found by this file's worker test
    ({"static_graph": [False, True]}, {"grad_accumulation": 2}, "search.static_graph: true with grad_accumulation 2: "
                                                                "PyTorch's DDP fails under no_sync with static_graph"),
])
def test_bad_knob_values_are_one_config_line(tmp_path, search, workload, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**BASE, "search": {**BASE["search"], **search},
                                    "workload": {**BASE["workload"], **workload}}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "\n" not in str(info.value) and fragment in str(info.value), str(info.value)


# ----------------------------------------------------------------------------- they reach DDP


@pytest.fixture(scope="module")
def through_the_worker():
    dumps = {
        "grid": _cfg({"bucket_cap_mb": [25, 0.004], "gradient_as_bucket_view": [False, True],
                      "static_graph": [False, True]}).model_dump(),
        # no_sync accumulation with small buckets and views (static_graph cannot: see the config test)
        "accumulate": _cfg({"bucket_cap_mb": 0.004, "gradient_as_bucket_view": True},
                           {"grad_accumulation": 2}).model_dump(),
        # these count the training forwards: no step timeline's compute windows (bare-module forwards)
        "buffers": _cfg({}, {"name": "tests.user_models:with_buffers", "broadcast_buffers": True},
                        {"timeline_steps": 0}).model_dump(),
        "own_buffers": _cfg({}, {"name": "tests.user_models:with_buffers", "broadcast_buffers": False},
                            {"timeline_steps": 0}).model_dump(),
    }
    return run_distributed(knobs_through_the_worker, 2, args=(dumps,))


def _ddp_buckets(cap_mb: float) -> int:
    """How many buckets DDP itself makes of tiny_deep's gradient after its rebuild (one process)."""
    return len(bucket_sizes("tests.tiny_workload:tiny_deep", cap_mb))


def test_hook_calls_per_step_follow_bucket_cap_mb(through_the_worker):
    r = through_the_worker[0]
    default, small = r["grid", "allreduce-w2-s0"], r["grid", "allreduce-b0.004-w2-s0"]
    assert default["per_step"] == [1] * 6  # 9.6 KB: one bucket at DDP's default
    n = _ddp_buckets(0.004)
    assert n >= 3
    assert small["per_step"] == [1] + [n] * 5  # DDP's first step is one bucket, then rebuilt by the cap
    assert small["summary"]["hook_calls_per_step"] == n  # the summary's: the steps after the warm-up one
    assert small["losses"] == pytest.approx(default["losses"], rel=1e-5)  # allreduce: the same mean either way


def test_static_graph_reaches_ddp_and_rebuilds_its_buckets_a_step_later(through_the_worker):
    r = through_the_worker[0]
    static = r["grid", "allreduce-b0.004-static-w2-s0"]
    n = _ddp_buckets(0.004)
    assert static["ddp"]["static_graph"] and static["per_step"] == [1, 1] + [n] * 4
    assert static["losses"] == pytest.approx(r["grid", "allreduce-w2-s0"]["losses"], rel=1e-5)


def test_gradients_are_views_of_the_buckets_under_gradient_as_bucket_view(through_the_worker):
    r = through_the_worker[0]
    for cap in ("", "-b0.004"):
        view, copy_ = r["grid", f"allreduce{cap}-view-w2-s0"], r["grid", f"allreduce{cap}-w2-s0"]
        assert view["ddp"]["gradient_as_bucket_view"] and not copy_["ddp"]["gradient_as_bucket_view"]
        assert all(view["views"][1:]), view["views"]  # after DDP's first step: every gradient in its bucket
        assert not any(copy_["views"]), copy_["views"]  # without it: gradients are copied into the bucket
        assert view["losses"] == pytest.approx(copy_["losses"], rel=1e-5)


def test_small_bucket_views_with_no_sync_accumulation_train_the_same_model(through_the_worker):
    runs = [through_the_worker[rank]["accumulate", "allreduce-w2-s0"] for rank in (0, 1)]  # its knobs: one setting
    assert all(r["status"] == "ok" for r in runs) and runs[0]["losses"] == runs[1]["losses"]
    plain = through_the_worker[0]["grid", "allreduce-w2-s0"]["losses"]
    assert runs[0]["losses"] == pytest.approx(plain, rel=1e-4)  # two micro-batches of 8, one of 16: one mean


def test_broadcast_buffers_reaches_ddp(through_the_worker):
    """On (DDP's default): rank 0's buffers (BatchNorm's running statistics) are broadcast
    before every forward, so each step starts from the same ones on both ranks; off: each rank
    keeps the statistics of its own batches from the second step on."""
    on = [through_the_worker[r]["buffers", "allreduce-w2-s0"] for r in (0, 1)]
    off = [through_the_worker[r]["own_buffers", "allreduce-w2-s0"] for r in (0, 1)]
    assert on[0]["ddp"]["broadcast_buffers"] and not off[0]["ddp"]["broadcast_buffers"]
    assert len(on[0]["buffers_seen"]) == 6 and on[0]["buffers_seen"] == on[1]["buffers_seen"]
    assert off[0]["buffers_seen"][0] == off[1]["buffers_seen"][0]  # the same build
    assert all(a != b for a, b in zip(off[0]["buffers_seen"][1:], off[1]["buffers_seen"][1:]))
    assert all(r["status"] == "ok" for r in on + off)
