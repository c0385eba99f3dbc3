"""service.train.nan: the per-step finite checks and their provenance, on a real DDP model with the
real hooks in a one-rank gloo group (the cross-rank agreement with 2 real processes is in
test_worker.py and test_faults.py)."""

from __future__ import annotations


import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import hooks
from service.train.nan import NanMonitor, nonfinite
from tests.dist_utils import init_single_rank_group


@pytest.fixture(scope="module", autouse=True)
def single_rank_group():
    torch.set_num_threads(1)
    init_single_rank_group()
    yield
    dist.destroy_process_group()


def test_nonfinite_finds_nan_and_inf_anywhere_without_false_alarms():
    big = torch.randn(1_000_003)
    assert not bool(nonfinite([big, torch.zeros(3), torch.full((5,), 3e38)]))
    for bad in (float("nan"), float("inf"), float("-inf")):
        poisoned = big.clone()
        poisoned[777_777] = bad
        assert bool(nonfinite([torch.ones(2), poisoned]))
    assert not bool(nonfinite([]))
    assert not bool(nonfinite([None, torch.ones(1)]))  # parameters without a gradient


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(8, 16)
        self.second = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def setup(hook: str, **params):
    model = DDP(Net())
    state, fn = hooks.build(hook, process_group=None, **params)
    model.register_comm_hook(state, fn)
    monitor = NanMonitor(model, state, rank=0, world_size=1, hook_name=hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, monitor, optimizer


def step(model, optimizer, x=None, grad_hook=None):
    """One training step; grad_hook (optional) rewrites first.weight's local gradient
    before the comm hook sees it."""
    x = torch.randn(32, 8) if x is None else x
    handle = model.module.first.weight.register_hook(grad_hook) if grad_hook else None
    optimizer.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    if handle:
        handle.remove()
    return loss.detach()


@pytest.mark.parametrize("hook", ["allreduce", "fp16_compress", "quantization_pertensor"])
def test_finite_steps_pass(hook):
    model, monitor, optimizer = setup(hook)
    for i in range(1, 4):
        check = monitor.check(i, step(model, optimizer))
        assert not check.nonfinite and check.source is None
    assert monitor.report is None


def test_nonfinite_loss_is_reported_as_loss():
    model, monitor, optimizer = setup("allreduce")
    x = torch.randn(32, 8)
    x[0, 0] = float("nan")
    check = monitor.check(1, step(model, optimizer, x))
    assert check.nonfinite and check.source == "loss" and check.rank == 0
    assert monitor.report.nan_source == "loss" and monitor.report.first_nan_step == 1


@pytest.mark.parametrize("hook,params", [
    ("allreduce", {}),
    ("fp16_compress", {}),
    ("quantization_pertensor", {}),  # quantization may turn NaN into finite garbage:
    ("quantization_perchannel", {"chunk_size": 16}),  # only the pre-hook check can see it
    ("powersgd", {"start_iter": 2}),  # compressing from step 3 on
])
def test_nan_in_the_local_gradient_is_model_grad_with_its_bucket(hook, params):
    model, monitor, optimizer = setup(hook, **params)
    for i in (1, 2, 3):
        assert not monitor.check(i, step(model, optimizer)).nonfinite
    check = monitor.check(4, step(model, optimizer, grad_hook=lambda g: g + float("nan")))
    assert check.nonfinite and check.source == "model_grad" and check.rank == 0
    report = monitor.report
    assert report.first_nan_step == 4 and report.bucket_index is not None
    assert "first.weight" in report.param_names and report.hook == hook


def swallowing_hook(state, bucket):
    """Like a quantizer that clamps: NaN/inf in, finite garbage out (here: nan_to_num)."""
    t0 = state.begin(bucket)  # the hooks library's pre-hook accounting
    fut = torch.futures.Future()
    fut.set_result(torch.nan_to_num(bucket.buffer(), nan=0.0, posinf=1.0, neginf=-1.0))
    return state.finish(fut, t0)


def test_a_nan_the_hook_swallows_is_still_model_grad():
    """Why the check must look before the hook: a hook whose output is finite garbage hides
    the NaN from any check of the aggregated gradient; the hook's input flags do not."""
    model = DDP(Net())
    state = hooks.HookState()
    model.register_comm_hook(state, swallowing_hook)
    monitor = NanMonitor(model, state, rank=0, world_size=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert not monitor.check(1, step(model, optimizer)).nonfinite
    check = monitor.check(2, step(model, optimizer, grad_hook=lambda g: g + float("nan")))
    assert check.flags[0] == [0, 1, 0, 0]  # gradient after the hook and weights: finite
    assert check.source == "model_grad" and monitor.report.bucket_index == 0


def test_fp16_overflow_of_a_finite_gradient_is_hook():
    """A large but finite gradient: fp16_compress overflows (inf), allreduce does not."""
    big = lambda g: g * 1e7  # noqa: E731 - |grad| ~ 1e-1 * 1e7 >> 65504 (fp16 max)
    model, monitor, optimizer = setup("fp16_compress")
    check = monitor.check(1, step(model, optimizer, grad_hook=big))
    assert check.source == "hook"
    assert "first.weight" in monitor.report.param_names and monitor.report.bucket_index is None

    model, monitor, optimizer = setup("allreduce")
    optimizer.param_groups[0]["lr"] = 1e-12  # the weights stay finite too
    assert not monitor.check(1, step(model, optimizer, grad_hook=big)).nonfinite


def test_weights_that_overflow_in_the_optimizer_step_are_params():
    model, monitor, optimizer = setup("allreduce")
    optimizer.param_groups[0]["lr"] = 3e38  # finite gradients, weights pushed past float32
    check = monitor.check(1, step(model, optimizer, x=100 * torch.randn(32, 8)))
    assert check.source == "params" and monitor.report.nan_source == "params"
    assert monitor.report.param_names  # the weights that went non-finite


def test_only_the_first_nonfinite_step_is_reported():
    model, monitor, optimizer = setup("allreduce")
    x = torch.randn(32, 8)
    x[0, 0] = float("inf")
    monitor.check(1, step(model, optimizer, x))
    second = monitor.check(2, step(model, optimizer))  # NaN weights now: still non-finite
    assert second.nonfinite and monitor.report.first_nan_step == 1
    assert monitor.report.to_dict()["per_rank"][0]["flags"]["loss"] == 1


def test_a_deferred_verdict_still_describes_its_own_step():
    """The loop resolves step s after step s+1's backward: the report must describe step s
    (its bucket, its non-finite gradients and weights), not what step s+1 left behind."""
    model, monitor, optimizer = setup("allreduce")
    monitor.submit(1, step(model, optimizer))
    assert not monitor.resolve().nonfinite
    monitor.submit(2, step(model, optimizer, grad_hook=lambda g: g + float("nan")))
    with torch.no_grad():  # what the next step leaves: finite gradients and weights
        for p in model.parameters():
            p.zero_()
            p.grad = torch.zeros_like(p)
    check = monitor.resolve()
    assert check.step == 2 and check.nonfinite and check.source == "model_grad"
    report = monitor.report
    assert report.first_nan_step == 2 and report.bucket_index is not None
    assert "first.weight" in report.per_rank[0]["nonfinite_grads"]
    assert "first.weight" in report.per_rank[0]["nonfinite_params"]
    assert monitor.resolve() is None  # nothing left in flight


def test_a_check_must_be_resolved_before_the_next_is_submitted():
    model, monitor, optimizer = setup("allreduce")
    monitor.submit(1, step(model, optimizer))
    with pytest.raises(RuntimeError, match="step 1"):
        monitor.submit(2, step(model, optimizer))


def test_non_finite_gradients_are_found_whether_or_not_they_reached_the_weights():
    """By default the gradients are read only when the weights went bad (SGD and AdamW carry
    a non-finite gradient into its weight); ``grads_reach_weights=False`` reads them every
    step, for an optimizer that may skip a bad gradient (here: no optimizer step at all)."""
    big = lambda g: g * 1e7  # noqa: E731 - fp16 overflow in the hook
    model, monitor, optimizer = setup("fp16_compress")
    check = monitor.check(1, step(model, optimizer, grad_hook=big))
    assert check.flags[0][2:] == [1, 1]  # the hook's inf reached the weights: both flagged

    model, monitor, _ = setup("fp16_compress")
    skipping = NanMonitor(model, monitor.hook_state, grads_reach_weights=False)
    handle = model.module.first.weight.register_hook(big)
    loss = model(torch.randn(32, 8)).pow(2).mean()
    loss.backward()  # and no optimizer step: it skipped the bad gradient
    handle.remove()
    check = skipping.check(1, loss.detach())
    assert check.source == "hook" and check.flags[0][3] == 0  # weights untouched, gradient inf
