"""The models people bring (issue 27, item 2): preflight finds the parameters a training step
leaves without a gradient, leaving no trace, and the worker trains such models under DDP with
every hook (tests/user_models.py holds the models)."""
from __future__ import annotations

import math

import pytest
import torch

import hooks
from service.train import preflight
from service.config import SweepConfig
from service.train.preflight import WorkloadError
from service.train.training_options import Precision
from service.workloads import build_workload
from tests.dist_utils import run_distributed
from tests.user_models import USER_MODELS, train_every_trial

U = "tests.user_models:"
FP32 = Precision("fp32", torch.device("cpu"))


def _unused(function: str) -> list[str]:
    wl = build_workload(U + function, 0)
    return preflight.unused_parameters(U + function, wl, wl.model, "cpu", FP32)


def test_preflight_names_the_parameters_a_training_step_leaves_without_a_gradient():
    assert _unused("eval_only_head") == ["eval_head.weight", "eval_head.bias"]
    assert _unused("branchy") == ["refine.0.weight", "refine.0.bias"]  # samples 0, 1 have no edge ink
    moe = _unused("tiny_moe")  # 2 samples reach at most 2 of the 4 experts
    assert len(moe) >= 4 and all(n.startswith("experts.") for n in moe), moe
    assert _unused("with_buffers") == []
    assert _unused("eval_only_head") == _unused("eval_only_head")  # deterministic: same model, same batch


def _state(model: torch.nn.Module):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            [p.grad for p in model.parameters()], [m.training for m in model.modules()],
            torch.get_rng_state())


def test_the_probe_leaves_no_trace_in_weights_buffers_grads_modes_or_the_rng():
    wl = build_workload(U + "with_buffers", 0)
    model = wl.model
    model.net[3].eval()  # a user's own choice of mode for one submodule: kept
    model.net[0].weight.grad = torch.ones_like(model.net[0].weight)  # an existing grad: kept, same tensor
    bn_mean = model.net[1].running_mean
    before = _state(model)
    assert preflight.unused_parameters("w", wl, model, "cpu", FP32) == []
    after = _state(model)
    assert before[0].keys() == after[0].keys()
    for key in before[0]:  # BatchNorm's running stats and num_batches_tracked, samples_seen, weights
        assert torch.equal(before[0][key], after[0][key]), key
    assert all(a is b for a, b in zip(before[1], after[1]))  # no .grad written or replaced
    assert before[2] == after[2]
    assert torch.equal(before[3], after[3])  # dropout drew from a forked RNG
    assert model.net[1].running_mean is bn_mean


def test_the_probe_runs_in_training_mode():
    """A model handed over in eval mode is probed in training mode (what DDP will run) and
    handed back in eval mode."""
    wl = build_workload(U + "with_buffers", 0)
    wl.model.eval()
    seen = []
    wl.model.net[1].register_forward_hook(lambda m, i, o: seen.append(m.training))
    preflight.unused_parameters("w", wl, wl.model, "cpu", FP32)
    assert seen == [True] and not wl.model.training


def test_a_loss_that_depends_on_no_parameter_is_refused_in_one_line():
    wl = build_workload(U + "with_buffers", 0)
    wl.loss_fn = lambda logits, y: (logits.detach() ** 2).mean()
    with pytest.raises(WorkloadError, match=r"^workload 'w': loss_fn's loss does not depend on any trainable "
                                            r"parameter \(it has no grad_fn\): nothing would train$"):
        preflight.unused_parameters("w", wl, wl.model, "cpu", FP32)


@pytest.mark.parametrize("setting, unused, expected", [
    ("auto", [], False), ("auto", ["h.weight"], True), (True, [], True), (True, ["h.weight"], True),
    (False, [], False)])
def test_find_unused_parameters_is_the_setting_or_whether_any_is_unused(setting, unused, expected):
    assert preflight.find_unused_setting("w", unused, setting) is expected


def test_unused_parameters_with_the_setting_false_are_refused_naming_them():
    names = [f"experts.{i}.weight" for i in range(7)]
    with pytest.raises(WorkloadError) as info:
        preflight.find_unused_setting("w", names, False)
    assert str(info.value) == (
        "workload 'w': 7 parameters get no gradient in a training step (experts.0.weight, experts.1.weight, "
        "experts.2.weight, experts.3.weight, experts.4.weight, ...) but workload.find_unused_parameters is "
        "false: DDP would fail at the second step; set it to auto or true")


# ----------------------------------------------------------------------------- under DDP, every hook

EVERY_HOOK = [{"name": name, **({"chunk_size": 64} if "chunk_size" in spec.params else {}),
               **({"start_iter": 2} if name == "powersgd" else {})}
              for name, spec in hooks.available().items()]
# error feedback's residuals and PowerSGD's per-bucket state where buckets hold parameters that
# a step left without a gradient
FEEDBACK = [{"name": "powersgd", "start_iter": 2}, {"name": "quantization_perchannel", "chunk_size": 64,
                                                    "error_feedback": True},
            {"name": "topk", "error_feedback": True}]


# paired timing and the step timeline beside find_unused_parameters (on a copy of the module):
# windows on steps 2 (before the trial's own), 4 (after) and 6 (before), the timeline on 3 and 5
WINDOWS_ON = {"paired_timing_every": 2, "timeline_steps": 2}
WINDOWS_OFF = {"paired_timing_every": 0, "timeline_steps": 0}
WINDOW_HOOKS = [{"name": "fp16_compress"}, {"name": "quantization_perchannel", "chunk_size": 64, "error_feedback": True}]
UNUSED_MODELS = [m for m in USER_MODELS if m != "with_buffers"]


def _config(workload: str, hook_entries, search=None, tracking=None, **settings) -> dict:
    return SweepConfig.model_validate({
        "name": "user-models", "workload": {"name": U + workload, "steps": 6, "global_batch_size": 32, "lr": 0.05,
                                             "eval_every": 6, "warmup_steps": 1, **settings},
        "search": {"hooks": hook_entries, "world_size": [2], "seed": [0], **(search or {})},
        "tracking": tracking or {}}).model_dump()


@pytest.fixture(scope="module")
def trained():
    dumps = {name: _config(name, EVERY_HOOK) for name in USER_MODELS}
    dumps["moe_small_buckets"] = _config("tiny_moe", FEEDBACK, {"bucket_cap_mb": 0.002})
    dumps["moe_static"] = _config("tiny_moe", FEEDBACK, {"bucket_cap_mb": 0.002, "static_graph": True})
    dumps["refused"] = _config("eval_only_head", ["allreduce"], find_unused_parameters=False)
    dumps["pinned_on"] = _config("with_buffers", ["allreduce"], find_unused_parameters=True)
    for model in UNUSED_MODELS:
        dumps["windows_on", model] = _config(model, WINDOW_HOOKS, tracking=WINDOWS_ON)
        dumps["windows_off", model] = _config(model, WINDOW_HOOKS, tracking=WINDOWS_OFF)
    return run_distributed(train_every_trial, 2, args=(dumps,))


@pytest.mark.parametrize("model", list(USER_MODELS))
def test_user_shaped_models_train_under_ddp_with_every_hook(trained, model):
    for entry in EVERY_HOOK:
        name = next(k for k in trained[0] if k[0] == model and k[1].startswith(entry["name"] + "-"))
        r0, r1 = trained[0][name], trained[1][name]
        assert not isinstance(r0, str), r0
        assert r0["status"] == "ok" and r0["steps"] == 6, (name, r0)
        assert r0["losses"] == r1["losses"], name  # one model on both ranks
        unused = model != "with_buffers"
        said = [ln for ln in r0["log"] if "find_unused_parameters is on" in ln]
        assert len(said) == (1 if unused else 0), (name, r0["log"])  # once, on rank 0 only
        assert not any("find_unused_parameters" in ln for ln in r1["log"])


def test_the_log_names_the_parameters_it_turned_find_unused_parameters_on_for(trained):
    line = next(ln for ln in trained[0]["eval_only_head", "allreduce-w2-s0"]["log"] if "find_unused" in ln)
    assert line == ("workload 'tests.user_models:eval_only_head': 2 parameters without a gradient in a training "
                    "step (eval_head.weight, eval_head.bias): DDP's find_unused_parameters is on (set "
                    "workload.find_unused_parameters to silence this)")


@pytest.mark.parametrize("variant", ["moe_small_buckets", "moe_static"])
def test_error_feedback_and_powersgd_cope_with_buckets_that_hold_unused_parameters(trained, variant):
    runs = {k[1]: v for k, v in trained[0].items() if k[0] == variant}
    assert len(runs) == len(FEEDBACK)
    for name, r in runs.items():
        assert not isinstance(r, str) and r["status"] == "ok" and r["steps"] == 6, (name, r)
        assert all(math.isfinite(v) for v in r["losses"]) and r["losses"] == trained[1][variant, name]["losses"]


def test_a_model_with_unused_parameters_and_the_setting_false_is_refused_naming_them(trained):
    for rank in (0, 1):
        assert trained[rank]["refused", "allreduce-w2-s0"] == (
            "workload 'tests.user_models:eval_only_head': 2 parameters get no gradient in a training step "
            "(eval_head.weight, eval_head.bias) but workload.find_unused_parameters is false: DDP would fail "
            "at the second step; set it to auto or true")


def test_find_unused_parameters_pinned_on_trains_a_model_without_unused_ones_and_says_nothing(trained):
    r = trained[0]["pinned_on", "allreduce-w2-s0"]
    assert r["status"] == "ok" and not any("find_unused" in ln for ln in r["log"])


@pytest.mark.parametrize("model", UNUSED_MODELS)
def test_a_model_that_needs_find_unused_parameters_gets_paired_timing_and_the_timeline_untouched(trained, model):
    """The same answer as a model without unused parameters: the paired ratio (windows in both
    orders) and the step timeline, and the training bit for bit as with both off."""
    for rank in (0, 1):
        on = {k[1]: v for k, v in trained[rank].items() if k[0] == ("windows_on", model)}
        off = {k[1]: v for k, v in trained[rank].items() if k[0] == ("windows_off", model)}
        assert on.keys() == off.keys() and len(on) == len(WINDOW_HOOKS)
        for name, r in on.items():
            assert not isinstance(r, str) and r["status"] == "ok" and r["steps"] == 6, (name, r)
            assert r["losses"] == off[name]["losses"], name  # every step's agreed loss, exactly
            for metric in ("final_loss", "final_eval_loss", "final_eval_accuracy", "comm_bytes_per_step"):
                assert r["summary"].get(metric) == off[name]["summary"].get(metric), (name, metric)
            assert r["summary"]["paired_windows"] == 3 and r["summary"]["step_ratio_vs_baseline"] > 0, name
            assert r["summary"]["paired_order_effect"] > 0, name
            assert r["timeline"] and not off[name]["timeline"], name
            assert "step_ratio_vs_baseline" not in off[name]["summary"], name
