"""service/train/paired_timing.py on two real gloo processes: the baseline windows leave the trained
trajectory untouched (weights, buffers, the trial hook's state: bit for bit), and each window is
timed and paired with its step (issue 23)."""
from __future__ import annotations

import torch
from torch.nn.functional import cross_entropy
from torch.nn.parallel import DistributedDataParallel as DDP

import hooks
from service.train.paired_timing import PairedTimer
from tests.dist_utils import run_distributed

STEPS = 8


def _train(rank: int, world_size: int, every: int):
    """A model with dropout (draws from the RNG) and BatchNorm (running statistics), trained
    with a lossy hook that keeps error feedback; baseline windows every ``every`` steps."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                 torch.nn.Dropout(0.3), torch.nn.Linear(32, 4))
    model = DDP(module)
    state, hook = hooks.build("quantization_perchannel", chunk_size=64)
    model.register_comm_hook(state, hook)
    timer = PairedTimer(module, every=every, warmup_steps=1, device="cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.Generator().manual_seed(rank)
    for step in range(1, STEPS + 1):
        x, y = torch.randn(16, 8, generator=data), torch.randint(0, 4, (16,), generator=data)
        optimizer.zero_grad(set_to_none=True)
        with timer.own():
            cross_entropy(model(x), y).backward()
        optimizer.step()
        if timer.due(step):
            timer.window(step, lambda ddp: cross_entropy(ddp(x), y).backward())
    # bytes, not tensors: a tensor crosses processes through shared memory the child takes with it
    return ({k: v.numpy().tobytes() for k, v in module.state_dict().items()}, state.stats()["payload_bytes"],
            sorted(timer.windows), timer.summary({s: 10.0 for s in range(1, STEPS + 1)}))


def test_baseline_windows_leave_the_trajectory_untouched_and_are_timed():
    plain = run_distributed(_train, world_size=2, args=(0,))
    paired = run_distributed(_train, world_size=2, args=(2,))
    for (weights, payload, windows, _), (weights_p, payload_p, windows_p, summary) in zip(plain, paired):
        assert windows == [] and windows_p == [2, 4, 6, 8]
        assert weights.keys() == weights_p.keys()
        for name in weights:  # parameters and BatchNorm's running statistics
            assert weights[name] == weights_p[name], name
        assert payload == payload_p  # the trial's hook never saw a window
        assert summary["paired_windows"] == 4 and summary["baseline_fb_ms"] > 0
        assert summary["step_ratio_vs_baseline"] > 0
