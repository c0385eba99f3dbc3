"""Models shaped like the ones people bring, not like the built-ins (issue 27, item 2): each a
workload by name, ``tests.user_models:FUNCTION``, as a user's is.

- ``eval_only_head``: a second head used only in eval mode (an ensemble/calibration head):
  in training its parameters get no gradient, ever;
- ``branchy``: a refinement block taken only by batches with ink at the right edge of some
  image (pixel 15; ~40 % of 16-sample batches, not the first two samples);
- ``tiny_moe``: a mixture of 4 experts with top-1 routing: on a small batch some experts get
  no sample, and which ones changes from batch to batch and from rank to rank;
- ``with_buffers``: BatchNorm (running statistics), dropout (the RNG) and a buffer of its own
  (training samples seen): every parameter is used, the state to leave alone is elsewhere.

All train on scikit-learn's digits (8x8 images, 10 classes) with the ``loss_fn`` form.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

HIDDEN = 32
EDGE_PIXEL = 15  # right edge of the second row: ink there in ~3 % of the images


def _digits() -> tuple[TensorDataset, TensorDataset]:
    from service.workloads.digits import load_digits  # sklearn's data, without importing sklearn

    x, y = load_digits()
    x = x / 16.0
    return TensorDataset(x[:1500], y[:1500]), TensorDataset(x[1500:], y[1500:])


def _workload(model: nn.Module) -> dict:
    train, held_out = _digits()
    return {"model": model, "train_set": train, "eval_set": held_out, "loss_fn": F.cross_entropy}


class EvalOnlyHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, HIDDEN), nn.ReLU())
        self.head = nn.Linear(HIDDEN, 10)
        self.eval_head = nn.Linear(HIDDEN, 10)

    def forward(self, x):
        h = self.body(x)
        return self.head(h) if self.training else (self.head(h) + self.eval_head(h)) / 2


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, HIDDEN), nn.ReLU())
        self.refine = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh())
        self.head = nn.Linear(HIDDEN, 10)

    def forward(self, x):
        h = self.body(x)
        if bool((x[:, EDGE_PIXEL] > 0).any()):
            h = h + self.refine(h)
        return self.head(h)


class TinyMoE(nn.Module):
    def __init__(self, experts: int = 4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, HIDDEN), nn.ReLU())
        self.gate = nn.Linear(HIDDEN, experts)
        self.experts = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN) for _ in range(experts))
        self.head = nn.Linear(HIDDEN, 10)

    def forward(self, x):
        h = self.body(x)
        probs = self.gate(h).softmax(-1)
        weight, choice = probs.max(-1)
        out = torch.zeros_like(h)
        for i, expert in enumerate(self.experts):
            routed = choice == i
            if routed.any():  # an expert no sample chose takes no part in this batch's loss
                out[routed] = expert(h[routed]) * weight[routed, None]
        return self.head(h + out)


class WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU(), nn.Dropout(0.1),
                                 nn.Linear(HIDDEN, 10))
        self.register_buffer("samples_seen", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if self.training:
            self.samples_seen += x.shape[0]
        return self.net(x)


def eval_only_head(seed: int) -> dict:
    return _workload(EvalOnlyHead())


def branchy(seed: int) -> dict:
    return _workload(Branchy())


def tiny_moe(seed: int) -> dict:
    return _workload(TinyMoE())


def with_buffers(seed: int) -> dict:
    return _workload(WithBuffers())


USER_MODELS = {"eval_only_head": eval_only_head, "branchy": branchy, "tiny_moe": tiny_moe,
               "with_buffers": with_buffers}


def train_every_trial(rank: int, world_size: int, dumps: dict) -> dict:
    """Every trial of each config through service.train.run_training on this rank: its status,
    steps, losses, summary, whether it recorded a step timeline and the worker's log lines, or a
    start-of-trial refusal's message."""
    import logging

    from service.config import SweepConfig
    from service.train.preflight import WorkloadError
    from service.train import TrainingContext, run_training

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("service.train").addHandler(handler)
    out = {}
    for key, dump in dumps.items():
        cfg = SweepConfig.model_validate(dump)
        for trial in cfg.trials():
            lines.clear()
            try:
                result = run_training(trial, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu"))
                out[key, trial.run_name] = {"status": result.status, "steps": result.steps_done,
                                            "losses": result.losses, "log": list(lines),
                                            "summary": result.summary, "timeline": result.timeline is not None}
            except WorkloadError as err:
                out[key, trial.run_name] = str(err)
    return out
