"""fsdp trials end to end on real gloo groups (run_training, no Ray): the conformance of
search.parallelism fsdp with ddp.

* fsdp + allreduce takes the same losses as ddp + allreduce within float rounding (SGD, same
  seed, 20 steps) at W = 2 and 3 (the tiny MLP's 32- and 10-row layers shard unevenly at 3), and
  with gradient accumulation (set_requires_gradient_sync where DDP has no_sync);
* each compressed form's reduce_scatter / all_gather bytes per step match their formulas, and a
  rank holds less under fsdp (memory_per_rank_mb);
* a nan_grad fault is found where it was injected (model_grad, the rank, the step, the module's
  parameters), for every hook with a sharded form;
* a trial resumed from its checkpoint (gathered full state dict, AdamW, error feedback) takes the
  uninterrupted trial's steps.

Each world size's scenarios run in ONE set of spawned processes (spawning is most of the cost).
"""
from __future__ import annotations

import math
import os

import pytest
import torch.distributed as dist

from hooks.quantize import message_bytes
from service.config import SweepConfig
from service.train import Start, TrainingContext, load_checkpoint_dir, run_training, save_checkpoint_dir
from tests.dist_utils import run_distributed
from tests.tiny_workload import TINY

SHARDED = ["allreduce", "fp16_compress", "bf16_compress", {"name": "quantized_allreduce", "chunk_size": 64}]
LAYERS = ((32, 64), (10, 32))  # tiny_digits' two Linear layers (out, in): its two sharded blocks


def cfg(steps=20, hooks=("allreduce",), parallelism=("ddp", "fsdp"), faults=(), checkpoint=None, name=TINY,
        **workload):
    return SweepConfig.model_validate({
        "name": "fsdp-test",
        "workload": {"name": name, "steps": steps, "global_batch_size": 48, "lr": 0.1, "eval_every": 10,
                     "warmup_steps": 2, **workload},
        "search": {"hooks": list(hooks), "world_size": [2, 3], "seed": [0], "parallelism": list(parallelism)},
        "faults": list(faults), "tracking": {"flush_seconds": 0.5}, "checkpoint": checkpoint or {}})


def _run(config: SweepConfig, w: int, rank: int, **ctx) -> dict:
    return {t.run_name: run_training(t, config, TrainingContext(rank=rank, world_size=w, device="cpu", **ctx))
            for t in config.trials() if t.world_size == w}


def _scenarios(rank, w, checkpoint_dir):
    out = {"same": _run(cfg(), w, rank), "accumulation": _run(cfg(grad_accumulation=2), w, rank),
           "bytes": _run(cfg(steps=4, hooks=[SHARDED[1], {"name": "quantized_allreduce", "chunk_size": 64,
                                                            "all_gather": ["bf16", "uint8"],
                                                            "all_gather_chunk_size": 16}],
                             parallelism=["fsdp"]), w, rank)}
    # rank 0 alone evaluates an eval_fn: the final eval must still gather on every rank (it hung)
    out["eval_fn"] = _run(cfg(steps=3, name="tests.tiny_workload:tiny_eval_fn"), w, rank)
    out["nan"] = _run(cfg(steps=8, hooks=SHARDED, parallelism=["fsdp"],
                          faults=[{"kind": "nan_grad", "step": 5, "rank": 1}]), w, rank)
    # SGD and coarse chunks: what error feedback carries moves the loss well beyond the tolerance,
    # so a resume that lost the residuals fails; AdamW: its state comes back through the full state dict
    for key, resume in (("sgd", cfg(steps=12, hooks=[{"name": "quantized_allreduce", "chunk_size": 2048,
                                                      "error_feedback": True}], parallelism=["fsdp"], lr=0.3,
                                    checkpoint={"every": 3, "max_failures": 1})),
                        ("adamw", cfg(steps=12, parallelism=["fsdp"], optimizer="adamw", lr=0.01,
                                      checkpoint={"every": 3, "max_failures": 1}))):
        directory = os.path.join(checkpoint_dir, key)

        def keep(step, state):  # as the Ray wrapper does: each rank writes its part of the directory
            path = os.path.join(directory, f"step_{step}")
            os.makedirs(path, exist_ok=True)
            save_checkpoint_dir(path, state)

        out[f"whole_{key}"] = _run(resume, w, rank, checkpoint_fn=keep)
        dist.barrier()  # every rank's part is on disk
        start = Start(checkpoint=load_checkpoint_dir(os.path.join(directory, "step_6"), rank), restarts=1)
        out[f"resumed_{key}"] = _run(resume, w, rank, start=start)
    return out


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request, tmp_path_factory):
    return request.param, run_distributed(_scenarios, request.param, args=(str(tmp_path_factory.mktemp("ckpt")),))


def test_fsdp_allreduce_takes_ddp_allreduces_losses(ranks):
    w, results = ranks
    for scenario in ("same", "accumulation"):
        runs = results[0][scenario]
        ddp, fsdp = runs[f"allreduce-w{w}-s0"], runs[f"allreduce-fsdp-w{w}-s0"]
        assert fsdp.status == ddp.status == "ok" and len(fsdp.losses) == len(ddp.losses) == 20
        assert fsdp.losses == pytest.approx(ddp.losses, rel=1e-5, abs=1e-7), scenario
        assert fsdp.losses[-1] < fsdp.losses[0] - 0.05  # it trained
        assert fsdp.summary["final_eval_loss"] == pytest.approx(ddp.summary["final_eval_loss"], rel=1e-5)
        # fp32 reduce-scatter of each layer once per step; the all-gathers of the forward and backward
        assert fsdp.summary["reduce_scatter_bytes_per_step"] == pytest.approx(
            (w - 1) / w * 4 * sum(_padded(o, i, w) for o, i in LAYERS))
        assert fsdp.summary["memory_per_rank_mb"] < 0.75 * ddp.summary["memory_per_rank_mb"]


def _padded(rows: int, cols: int, w: int) -> int:
    """A Linear layer's values as FSDP lays them out: weight and bias, dim 0 padded to W."""
    r = math.ceil(rows / w) * w
    return r * cols + r


def test_each_compressed_forms_bytes_match_its_formula(ranks):
    w, results = ranks
    runs = results[0]["bytes"]
    sizes = [_padded(o, i, w) for o, i in LAYERS]
    rs = {f"fp16_compress-fsdp-w{w}-s0": sum(2 * n for n in sizes),
          f"quantized_allreduce-c64-all_gatherbf16-all_gather_chunk_size16-fsdp-w{w}-s0":
              sum(w * message_bytes(n // w, 64) for n in sizes)}
    rs[rs_key := f"quantized_allreduce-c64-all_gatheruint8-all_gather_chunk_size16-fsdp-w{w}-s0"] = \
        rs[f"quantized_allreduce-c64-all_gatherbf16-all_gather_chunk_size16-fsdp-w{w}-s0"]
    gather = {f"fp16_compress-fsdp-w{w}-s0": [4 * n for n in sizes],
              f"quantized_allreduce-c64-all_gatherbf16-all_gather_chunk_size16-fsdp-w{w}-s0": [2 * n for n in sizes],
              rs_key: [w * message_bytes(n // w, 16) for n in sizes]}
    assert set(runs) == set(rs)
    for name, result in runs.items():
        s = result.summary
        assert s["reduce_scatter_bytes_per_step"] == pytest.approx((w - 1) / w * rs[name]), name
        # the forward gathers both layers, the backward gathers them again (each resharded after its forward)
        per_step = 2 * sum(gather[name])
        assert s["all_gather_bytes_per_step"] == pytest.approx((w - 1) / w * per_step), name
        assert s["comm_bytes_per_step"] == pytest.approx((w - 1) / w * (rs[name] + per_step)), name


def test_an_fsdp_trial_records_its_collectives_in_call_order_as_its_step_timeline(ranks):
    w, results = ranks
    sizes = [_padded(o, i, w) for o, i in LAYERS]
    for name, result in results[0]["bytes"].items():
        recorded = result.timeline
        assert recorded is not None and recorded.sampled_steps == (3, 4), name  # after the warm-up and first step
        t = recorded.timeline
        assert t.buckets == () and t.world_size == w
        # each layer gathered in the forward and again, last layer first, in the backward (the first
        # layer's prefetched before the last one's gradient is reduce-scattered), then each gradient
        assert [(c.kind, c.phase, c.numel) for c in t.sharded] == [
            ("all_gather", "forward", sizes[0]), ("all_gather", "forward", sizes[1]),
            ("all_gather", "backward", sizes[1]), ("all_gather", "backward", sizes[0]),
            ("reduce_scatter", "backward", sizes[1]), ("reduce_scatter", "backward", sizes[0])], name
        assert all(c.comm_ms > 0 for c in t.sharded) and t.forward_ms > 0 and t.backward_end_ms > 0
        assert len(recorded.compute_points) >= 2  # the unsharded copy's forward and backward at two batches
        s = result.summary
        assert s["timeline_steps"] == 2 and s["timeline_step_ms"] > 0, name
        # priced where it was measured, the calls and compute add up to a step of the measured order
        assert 0.3 < s["timeline_vs_measured"] < 2.0, name
        assert recorded.price(48, 8, 1.0).step_ms > recorded.price(48, w, 100.0).compute_ms


def test_nan_grad_is_found_where_it_was_injected_for_every_sharded_hook(ranks):
    w, results = ranks
    for rank in range(w):
        runs = results[rank]["nan"]
        assert len(runs) == len(SHARDED)
        for name, result in runs.items():
            report = result.nan_report
            assert result.status == "nan" and result.steps_done == 5, name
            assert (report.nan_source, report.first_nan_step, report.nan_rank) == ("model_grad", 5, 1), name
            # the poisoned first parameter's module (block 0): its reduce-scatter input was flagged
            assert report.bucket_index == 0 and report.param_names == ["0.weight", "0.bias"], name
            assert report.per_rank[0]["flags"]["model_grad"] == 0


def test_an_eval_fn_workload_evaluates_the_full_parameters_on_rank_0(ranks):
    w, results = ranks
    runs = results[0]["eval_fn"]
    ddp, fsdp = runs[f"allreduce-w{w}-s0"], runs[f"allreduce-fsdp-w{w}-s0"]
    assert fsdp.status == "ok" and fsdp.summary["final_eval_accuracy"] == ddp.summary["final_eval_accuracy"]
    for rank in range(1, w):
        assert "final_eval_accuracy" not in results[rank]["eval_fn"][f"allreduce-fsdp-w{w}-s0"].summary


def test_a_resumed_fsdp_trial_takes_the_uninterrupted_trials_steps(ranks):
    w, results = ranks
    for rank in range(w):
        for key in ("sgd", "adamw"):
            (whole,), (resumed,) = results[rank][f"whole_{key}"].values(), results[rank][f"resumed_{key}"].values()
            assert resumed.steps_done == 12 and len(resumed.losses) == 6 and resumed.summary["restarts"] == 1
            assert resumed.losses == pytest.approx(whole.losses[6:], rel=1e-6, abs=1e-8), key
