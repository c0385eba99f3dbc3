"""Paired timing for fsdp trials on two real gloo processes (run_training, no Ray): the baseline is
FSDP's own fp32 reduce-scatter and all-gather, swapped in on the trial's own sharded model for each
window (service/train/paired_timing.py: ShardedBaseline; service/train/fsdp.py: baseline_comms).

* a quantized_allreduce trial (error feedback, uint8 all-gather, dropout and BatchNorm, gradient
  accumulation) takes the same steps bit for bit with windows in both orders and without: every
  step's loss, the gathered weights and optimizer state at each checkpoint, its hook state
  (residuals, counters) and the final eval; its own bytes per step are the same (the baseline's
  traffic is not the trial's) and it records step_ratio_vs_baseline;
* an fsdp allreduce trial (fp32 all-gather) is the baseline itself: no windows;
* the swap itself: the trial's comm objects and gradient-sync setting back after the window, and
  no swap while an unsynced micro-batch's gradient is pending.

One set of spawned processes for all of it (spawning is most of the cost).
"""
from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

import hooks
import hooks.fsdp
from service.config import SweepConfig
from service.train import TrainingContext, run_training
from service.train.fsdp import attach_hook, shard
from tests.dist_utils import run_distributed

QUANTIZED = {"name": "quantized_allreduce", "chunk_size": 64, "error_feedback": True, "all_gather": "uint8",
             "all_gather_chunk_size": 16}
STEPS = 10
# warm-up 2, a window every 2nd step: 4 before the trial's own forward/backward, 6 after its step, 8 before, 10 after
WINDOWS = 4


def _cfg(every: int) -> SweepConfig:
    return SweepConfig.model_validate({
        "name": "fsdp-paired-test",
        "workload": {"name": "tests.tiny_workload:tiny_noisy", "steps": STEPS, "global_batch_size": 48, "lr": 0.1,
                     "eval_every": 5, "warmup_steps": 2, "grad_accumulation": 2},
        "search": {"hooks": [QUANTIZED, "allreduce"], "world_size": [2], "seed": [0], "parallelism": ["fsdp"]},
        "tracking": {"flush_seconds": 0.5, "paired_timing_every": every, "timeline_steps": 0},
        "checkpoint": {"every": 3, "max_failures": 1}})


def _plain(value):
    """A checkpoint's state as bytes and numbers (a tensor crosses processes through shared memory
    the child takes with it); the hook's measured seconds dropped (wall time, never equal)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().tobytes()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _trials(rank: int, every: int) -> dict:
    out = {}
    config = _cfg(every)
    for trial in config.trials():
        kept = {}

        def keep(step, state):
            kept[step] = _plain({"hook": state.hook_state,
                                 "trainer": (state.trainer.model, state.trainer.optimizer) if state.trainer else None})

        result = run_training(trial, config, TrainingContext(rank=rank, world_size=2, device="cpu",
                                                            checkpoint_fn=keep))
        out[trial.hook] = {"losses": result.losses, "summary": result.summary, "status": result.status,
                           "checkpoints": kept}
    return out


def _swap(rank: int) -> dict:
    """baseline_comms on a small sharded model: what is attached inside and after, and the refusal."""
    torch.manual_seed(0)
    model = shard(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)), None)
    attach_hook(model, "quantized_allreduce", {k: v for k, v in QUANTIZED.items() if k != "name"})
    state, form = hooks.fsdp.build(hooks.BASELINE)
    groups = [g for m in model.sharded for g in m._get_fsdp_state()._fsdp_param_groups]
    own = [(g._reduce_scatter_comm, g._all_gather_comm) for g in groups]
    x = torch.randn(6, 8)
    model(x).sum().backward()  # lazy init, a synced backward: idle after it
    with model.baseline_comms(state, form):
        inside = all(g._reduce_scatter_comm.state is state and g._all_gather_comm.state is state for g in groups)
        with model.no_sync():
            model(x).sum().backward()
        model(x).sum().backward()
    restored = [(g._reduce_scatter_comm, g._all_gather_comm) for g in groups] == own
    sync = all(g.reduce_grads and g.all_reduce_grads for g in groups)
    with model.no_sync():
        model(x).sum().backward()  # an unsynced micro-batch: its gradient waits for the next synced backward
        try:
            with model.baseline_comms(state, form):
                refused = False
        except RuntimeError:
            refused = True
    model(x).sum().backward()
    grads = all(isinstance(p.grad, DTensor) for p in model.parameters())
    return {"inside": inside, "restored": restored, "sync": sync, "refused": refused, "grads": grads,
            "baseline_calls": state.stats()["calls"]}


def _scenarios(rank: int, world_size: int) -> dict:
    return {"off": _trials(rank, 0), "on": _trials(rank, 2), "swap": _swap(rank)}


@pytest.fixture(scope="module")
def ranks():
    return run_distributed(_scenarios, 2)


def test_windows_in_both_orders_leave_an_fsdp_trial_bit_for_bit_untouched(ranks):
    for rank in ranks:
        off, on = rank["off"]["quantized_allreduce"], rank["on"]["quantized_allreduce"]
        assert off["status"] == on["status"] == "ok" and len(on["losses"]) == STEPS
        assert on["losses"] == off["losses"]  # every step's agreed loss, exactly
        # the gathered weights and AdamW/SGD state, the residuals and counters of the trial's hook, at steps 3, 6, 9
        assert sorted(on["checkpoints"]) == [3, 6, 9]
        assert on["checkpoints"] == off["checkpoints"]
        for metric in ("final_loss", "final_eval_loss", "final_eval_accuracy", "reduce_scatter_bytes_per_step",
                       "all_gather_bytes_per_step", "comm_bytes_per_step", "all_gather_rel_error"):
            assert on["summary"].get(metric) == off["summary"].get(metric), metric
        assert on["summary"]["all_gather_bytes_per_step"] > 0 and on["summary"]["reduce_scatter_bytes_per_step"] > 0


def test_an_fsdp_trial_is_timed_against_fsdps_own_fp32_comms_in_both_orders(ranks):
    summary = ranks[0]["on"]["quantized_allreduce"]["summary"]
    assert summary["paired_windows"] == WINDOWS and summary["baseline_fb_ms"] > 0
    assert summary["step_ratio_vs_baseline"] > 0 and summary["step_ratio_vs_baseline_iqr"] >= 0
    assert summary["paired_order_effect"] == pytest.approx(
        summary["paired_ratio_after"] / summary["paired_ratio_before"])
    assert "step_ratio_vs_baseline" not in ranks[0]["off"]["quantized_allreduce"]["summary"]


def test_an_fsdp_allreduce_trial_is_the_baseline_and_pairs_nothing(ranks):
    for rank in ranks:
        baseline = rank["on"]["allreduce"]
        assert baseline["status"] == "ok"
        assert "step_ratio_vs_baseline" not in baseline["summary"] and "paired_windows" not in baseline["summary"]
        assert baseline["losses"] == rank["off"]["allreduce"]["losses"]


def test_the_baseline_comms_are_swapped_in_for_the_window_only_and_never_mid_accumulation(ranks):
    for rank in ranks:
        swap = rank["swap"]
        assert swap["inside"] and swap["restored"] and swap["sync"] and swap["grads"]
        assert swap["refused"]  # a pending micro-batch gradient would be reduced by the baseline's comms
        assert swap["baseline_calls"] > 0  # the window's reduce-scatters and all-gathers were the baseline's
