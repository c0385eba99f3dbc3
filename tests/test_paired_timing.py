"""service/train/paired_timing.py on two real gloo processes: the baseline windows leave the trained
trajectory untouched (weights, buffers, the trial hook's state: bit for bit) in both orders (before
the trial's own forward/backward and after its step), never fall on a fidelity step, work beside a
DDP with find_unused_parameters (on a copy of the module), and each window is timed and paired with
its step (issue 23; issue 35 items 2 and 3)."""
from __future__ import annotations

import pytest
import torch
from torch.nn.functional import cross_entropy
from torch.nn.parallel import DistributedDataParallel as DDP

import hooks
from service.train.fidelity import FidelitySampler
from service.train.paired_timing import PairedTimer, SideModule
from tests.dist_utils import run_distributed

STEPS = 8


class _Branchy(torch.nn.Module):
    """Dropout (draws from the RNG), BatchNorm (running statistics) and, with ``unused``, a branch
    only the odd steps take: DDP needs find_unused_parameters for it."""

    def __init__(self, unused: bool):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                        torch.nn.Dropout(0.3))
        self.branch = torch.nn.Linear(32, 32) if unused else None
        self.head = torch.nn.Linear(32, 4)
        self.take_branch = False

    def forward(self, x):
        h = self.body(x)
        if self.branch is not None and self.take_branch:
            h = h + self.branch(h)
        return self.head(h)


def _train(rank: int, world_size: int, every: int, fidelity_every: int = 0, unused: bool = False):
    """Trained with a lossy hook that keeps error feedback (fidelity sampled every
    ``fidelity_every`` steps); baseline windows every ``every`` steps, in the loop's places."""
    torch.manual_seed(0)
    module = _Branchy(unused)
    model = DDP(module, find_unused_parameters=unused)
    state, hook = hooks.build("quantization_perchannel", chunk_size=64)
    fidelity = FidelitySampler(state, hook, fidelity_every)
    model.register_comm_hook(state, fidelity.hook)
    timer = PairedTimer(SideModule(module, copy_module=unused), every=every, warmup_steps=1, device="cpu",
                        ddp_kwargs={"find_unused_parameters": unused}, skip=fidelity.due)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.Generator().manual_seed(rank)
    for step in range(1, STEPS + 1):
        x, y = torch.randn(16, 8, generator=data), torch.randint(0, 4, (16,), generator=data)
        for m in (module, timer.side.module):
            m.take_branch = step % 2 == 1

        def forward_backward(ddp, x=x, y=y):
            cross_entropy(ddp(x), y).backward()

        if timer.before(step):
            timer.window(step, forward_backward)
        fidelity.begin(step)
        optimizer.zero_grad(set_to_none=True)
        with timer.own():
            forward_backward(model)
        optimizer.step()
        fidelity.end(step)
        if timer.after(step):
            timer.window(step, forward_backward)
    # bytes, not tensors: a tensor crosses processes through shared memory the child takes with it
    return ({k: v.numpy().tobytes() for k, v in module.state_dict().items()}, state.stats()["payload_bytes"],
            {s: w[2] for s, w in sorted(timer.windows.items())}, sorted(fidelity.values),
            timer.summary({s: 1000.0 for s in range(1, STEPS + 1)}))


def _same_trajectory(plain, paired):
    for (weights, payload, windows, fidelity, _), (weights_p, payload_p, _, fidelity_p, _) in zip(plain, paired):
        assert windows == {}
        assert weights.keys() == weights_p.keys()
        for name in weights:  # parameters and BatchNorm's running statistics
            assert weights[name] == weights_p[name], name
        assert payload == payload_p  # the trial's hook never saw a window
        assert fidelity == fidelity_p


# step -> whether the baseline ran before the trial's own forward/backward: windows alternate
BOTH_ORDERS = {2: True, 4: False, 6: True, 8: False}
# fidelity on 4 and 8: the window of 4 moves to 5 (still the second window: after), 8's to 9 (past the end)
OFF_FIDELITY = {2: True, 5: False, 6: True}


@pytest.mark.parametrize("fidelity_every, expected", [(0, BOTH_ORDERS), (4, OFF_FIDELITY)])
def test_baseline_windows_in_both_orders_leave_the_trajectory_untouched_and_are_timed(fidelity_every, expected):
    plain = run_distributed(_train, world_size=2, args=(0, fidelity_every))
    paired = run_distributed(_train, world_size=2, args=(2, fidelity_every))
    _same_trajectory(plain, paired)
    for _, _, windows, fidelity, summary in paired:
        assert windows == expected
        assert not set(windows) & set(fidelity)  # no window on a fidelity step
        assert summary["paired_windows"] == len(expected) and summary["baseline_fb_ms"] > 0
        assert summary["step_ratio_vs_baseline"] > 0
        assert summary["paired_order_effect"] == pytest.approx(
            summary["paired_ratio_after"] / summary["paired_ratio_before"])


def test_windows_beside_find_unused_parameters_run_on_a_copy_and_leave_the_trajectory_untouched():
    plain = run_distributed(_train, world_size=2, args=(0, 0, True))
    paired = run_distributed(_train, world_size=2, args=(2, 0, True))
    _same_trajectory(plain, paired)
    for _, _, windows, _, summary in paired:
        assert windows == BOTH_ORDERS and summary["paired_windows"] == 4


def _windows(every: int, warmup: int, fidelity_every: int, steps: int = 20) -> list[tuple[int, bool]]:
    timer = PairedTimer(SideModule(torch.nn.Linear(1, 1)), every=0, warmup_steps=warmup, device="cpu",
                        skip=lambda s: bool(fidelity_every) and s % fidelity_every == 0)
    timer.every = every  # the schedule only: no DDP (no process group here)
    return [(s, timer.before(s)) for s in range(1, steps + 1) if timer.due(s)]


def test_the_schedule_alternates_and_moves_off_fidelity_steps():
    assert _windows(5, 1, 0) == [(5, True), (10, False), (15, True), (20, False)]
    assert _windows(5, 5, 0) == [(10, True), (15, False), (20, True)]  # none in the warm-up
    # fidelity on every 5th: each window moves one step on, and keeps its order
    assert _windows(5, 1, 5) == [(6, True), (11, False), (16, True)]
    # fidelity on 2, 4, ...: every window moves to the odd step after it
    assert _windows(2, 1, 2, 8) == [(3, True), (5, False), (7, True)]
    assert _windows(1, 1, 1) == []  # every step a fidelity step: no window
    # periods of one step: a skipped step's window is dropped, and the orders still alternate
    assert _windows(1, 1, 2, 8) == [(3, True), (5, False), (7, True)]
