"""The models people bring (issue 27, item 2): preflight finds the parameters a training step
leaves without a gradient, leaving no trace, and the worker trains such models under DDP with
every hook (tests/user_models.py holds the models)."""
from __future__ import annotations

import pytest
import torch

from service import preflight
from service.preflight import WorkloadError
from service.training_options import Precision
from service.workloads import build_workload

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
