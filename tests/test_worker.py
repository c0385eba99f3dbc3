"""service.train.run_training for real: gloo process groups (1 in-process rank, or 2 spawned
processes), the real mlp_digits workload, the real hooks, a temporary SQLite MLflow store
read back with MlflowClient. No Ray here (the sweep's end-to-end tests cover Ray)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from service.config import SweepConfig
from service.train import GlobalBatches, TrainingContext, run_training
from tests.dist_utils import init_single_rank_group, run_distributed
from tests.tiny_workload import TINY

STEPS = 12


def make_cfg(steps: int = STEPS, hooks=("allreduce",), world_sizes=(1, 2), faults=(), on_nan=True,
             workload: str = TINY, checkpoint=None, tracking=None, **settings) -> SweepConfig:
    """A sweep config for these tests; ``settings`` go to the workload section, ``tracking`` to
    the tracking section."""
    return SweepConfig.model_validate({
        "name": "worker-test",
        "workload": {"name": workload, "steps": steps, "global_batch_size": 32, "lr": 0.05,
                     "eval_every": 5, "warmup_steps": 2, **settings},
        "search": {"hooks": list(hooks), "world_size": list(world_sizes), "seed": [0]},
        "stop": {"on_nan": on_nan},
        "faults": list(faults),
        "tracking": {"flush_seconds": 0.5, **(tracking or {})},
        "checkpoint": checkpoint or {},
    })


def trial_of(cfg: SweepConfig, world_size: int, hook: str = "allreduce"):
    return next(t for t in cfg.trials() if t.world_size == world_size and t.hook == hook)


@pytest.fixture
def single_rank_group():
    """A real gloo process group of one rank in this process."""
    torch.set_num_threads(1)
    init_single_rank_group()
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A temporary SQLite MLflow store."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


def test_single_rank_loop_logs_every_step_and_the_summary(single_rank_group, store):
    from mlflow.tracking import MlflowClient  # here, not at the top: spawned ranks import this module

    from service import tracking

    cfg = make_cfg(workload="mlp_digits")  # a built-in workload, as the sweep runs it
    trial = trial_of(cfg, 1)
    parent = tracking.start_parent_run(cfg, None, tracking_uri=store)
    run_id = tracking.start_child_run(parent, trial, cfg, tracking_uri=store)
    seen = []
    logger = tracking.MetricLogger(run_id, store, cfg.tracking.flush_seconds)

    result = run_training(trial, cfg, TrainingContext(rank=0, world_size=1, device="cpu", logger=logger,
                          progress=lambda step, loss: seen.append((step, loss))))

    client = MlflowClient(store)
    loss = client.get_metric_history(run_id, "loss")
    assert sorted(m.step for m in loss) == list(range(1, STEPS + 1))  # one point per optimizer step
    assert sorted(m.step for m in client.get_metric_history(run_id, "step_time_ms")) == list(range(1, STEPS + 1))
    assert sorted(m.step for m in client.get_metric_history(run_id, "eval_accuracy")) == [5, 10, 12]
    run = client.get_run(run_id)
    summary = run.data.metrics
    for key in ("samples_per_s", "step_time_ms_median", "comm_bytes_per_step", "compression_ratio",
                "hook_time_ms", "final_loss", "final_eval_accuracy", "nan_detected"):
        assert key in summary, key
    assert summary["nan_detected"] == 0 and "first_nan_step" not in summary
    assert summary["samples_per_s"] > 0 and summary["warmup_steps_excluded"] == 2
    assert summary["compression_ratio"] == pytest.approx(1.0)  # allreduce sends float32 as is
    steps_ms = sorted(m.value for m in client.get_metric_history(run_id, "step_time_ms") if m.step > 2)
    import statistics
    q1, _, q3 = statistics.quantiles(steps_ms, n=4, method="inclusive")
    assert summary["step_time_ms_iqr"] == pytest.approx(q3 - q1)  # the measured steps' spread
    assert run.data.tags["status"] == "ok"
    # the loss went down on real digits, and what was logged is what the loop computed
    by_step = {m.step: m.value for m in loss}
    assert by_step[STEPS] < by_step[1]
    assert result.status == "ok" and result.steps_done == STEPS
    assert result.losses == pytest.approx([by_step[s] for s in range(1, STEPS + 1)])
    assert summary["final_loss"] == pytest.approx(by_step[STEPS])
    assert seen and seen[-1][0] == STEPS  # progress: first step, then at most every ~2 s, and the end


def test_gradient_accumulation_keeps_the_global_batch(single_rank_group):
    """grad_accumulation=4 (three micro-batches under no_sync) trains the same model as 1."""
    plain = run_training(trial_of(make_cfg(steps=6), 1), make_cfg(steps=6), TrainingContext(rank=0, world_size=1,
                         device="cpu"))
    cfg = make_cfg(steps=6, grad_accumulation=4)
    accumulated = run_training(trial_of(cfg, 1), cfg, TrainingContext(rank=0, world_size=1, device="cpu"))
    assert accumulated.losses == pytest.approx(plain.losses, rel=1e-4)


def test_global_batches_partition_the_global_batch_across_ranks():
    world = [GlobalBatches(100, 16, seed=3, rank=r, world_size=4, grad_accumulation=2) for r in range(4)]
    one = GlobalBatches(100, 16, seed=3, rank=0, world_size=1, grad_accumulation=1)
    for step in (1, 6, 7, 13):  # 6 batches per epoch: 7 and 13 start new epochs
        parts = [torch.cat(b.micro_batches(step)) for b in world]
        assert all(len(m) == 2 for b in world for m in b.micro_batches(step))
        assert torch.equal(torch.cat(parts), one.micro_batches(step)[0])
    assert not torch.equal(one.micro_batches(1)[0], one.micro_batches(7)[0])  # reshuffled per epoch
    with pytest.raises(ValueError, match="does not split"):
        GlobalBatches(100, 16, seed=0, rank=0, world_size=3, grad_accumulation=1)


def _two_rank_scenarios(rank, world_size, clean_cfg, nan_cfg):
    """Runs in each of 2 spawned ranks (one spawn for both: importing torch and sklearn in a
    fresh process is most of the cost on a busy machine)."""
    results = {}
    for name, cfg_dict in (("clean", clean_cfg), ("nan", nan_cfg)):
        cfg = SweepConfig.model_validate(cfg_dict)
        results[name] = run_training(trial_of(cfg, world_size), cfg, TrainingContext(rank=rank, world_size=world_size,
                                     device="cpu"))
    # Paired timing (service/train/paired_timing.py): the same fp16 trial with baseline windows every
    # 2nd step and with none must train the same trajectory, bit for bit.
    for every in (0, 2):
        cfg = SweepConfig.model_validate({**clean_cfg, "tracking": {**clean_cfg["tracking"],
                                                                    "paired_timing_every": every}})
        fp16 = next(t for t in cfg.trials() if t.world_size == world_size and t.hook == "fp16_compress")
        results[f"paired_{every}"] = run_training(fp16, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu"))
    # A failed collective inside the hook (fp16_compress, whose callback used to drop the error
    # and hand back this rank's own bucket as the mean) must end the trial with that error.
    from tests.hooks_checks import build_with_failing_collectives

    cfg = SweepConfig.model_validate(clean_cfg)
    fp16 = next(t for t in cfg.trials() if t.world_size == world_size and t.hook == "fp16_compress")
    try:
        run_training(fp16, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu",
                     build_hook=build_with_failing_collectives))
        results["collective_failure"] = None
    except RuntimeError as exc:
        results["collective_failure"] = str(exc)
    return results


@pytest.fixture(scope="module")
def two_ranks():
    clean = make_cfg(steps=6, hooks=("allreduce", "fp16_compress"))
    nan = make_cfg(steps=10, faults=[{"kind": "nan_grad", "step": 4, "rank": 1}])
    return run_distributed(_two_rank_scenarios, 2, args=(clean.model_dump(), nan.model_dump()))


def test_two_ranks_train_the_same_model_as_one(single_rank_group, two_ranks):
    """World size 2 splits the same global batch: the mean loss follows the W=1 run."""
    cfg = make_cfg(steps=6)
    one = run_training(trial_of(cfg, 1), cfg, TrainingContext(rank=0, world_size=1, device="cpu"))
    two = [r["clean"] for r in two_ranks]
    assert two[0].losses == two[1].losses  # every rank holds the same agreed mean
    assert two[0].losses == pytest.approx(one.losses, rel=1e-4)
    assert two[0].status == "ok" and two[0].steps_done == 6
    assert two[0].summary["comm_bytes_per_step"] > 0  # ring all-reduce: 2(W-1)/W * gradient bytes
    assert one.summary["comm_bytes_per_step"] == 0  # nothing on the wire at world size 1


def test_paired_baseline_windows_leave_the_trial_untouched_and_give_the_ratio(two_ranks):
    for ranks in two_ranks:
        plain, paired = ranks["paired_0"], ranks["paired_2"]
        assert paired.losses == plain.losses  # every step's agreed loss, exactly
        for metric in ("final_loss", "final_eval_loss", "comm_bytes_per_step"):
            assert paired.summary.get(metric) == plain.summary.get(metric), metric
        assert "step_ratio_vs_baseline" not in plain.summary
    summary = two_ranks[0]["paired_2"].summary
    assert summary["paired_windows"] == 2  # steps 4 and 6: after the 2 warm-up steps
    assert summary["step_ratio_vs_baseline"] > 0 and summary["step_ratio_vs_baseline_iqr"] >= 0
    assert summary["cpu_share"] > 0 and summary["load_avg_1m"] >= 0
    # the baseline trial is not timed against itself
    assert "step_ratio_vs_baseline" not in two_ranks[0]["clean"].summary


def test_two_ranks_stop_together_at_an_injected_nan(two_ranks):
    """A NaN in rank 1's gradient at step 4: both ranks stop at step 4, status nan."""
    for r in (ranks["nan"] for ranks in two_ranks):
        assert r.status == "nan" and r.steps_done == 4
        assert r.summary["nan_detected"] == 1 and r.summary["first_nan_step"] == 4
        assert r.nan_report.nan_source == "model_grad" and r.nan_report.nan_rank == 1
        assert all(math.isfinite(v) for v in r.losses[:3]) and len(r.losses) == 4
    assert "final_eval_accuracy" not in two_ranks[0]["nan"].summary  # the final weights are NaN


def test_a_failed_collective_in_the_hook_ends_the_trial_with_the_error_on_every_rank(two_ranks):
    from tests.hooks_checks import INJECTED

    for ranks in two_ranks:
        assert ranks["collective_failure"] is not None, "the trial trained on after its collective failed"
        assert INJECTED in ranks["collective_failure"]


def test_a_fault_configured_after_the_nan_step_never_fires(single_rank_group):
    """The NaN verdict of step 3 is read during step 4; a fault configured at step 4 must not
    fire first (the trial stops at 3, as it did when the verdict was read at once)."""
    cfg = make_cfg(steps=6, world_sizes=(1,), faults=[{"kind": "nan_grad", "step": 3, "rank": 0},
                                                      {"kind": "scale_grad", "step": 4, "rank": 0,
                                                       "factor": 2.0}])
    fired = []
    result = run_training(trial_of(cfg, 1), cfg, TrainingContext(rank=0, world_size=1, device="cpu",
                          on_fault=lambda index, fault: fired.append(index)))
    assert result.status == "nan" and result.steps_done == 3 and fired == [0]


def test_without_stop_on_nan_the_trial_runs_to_the_end(single_rank_group):
    cfg = make_cfg(steps=6, on_nan=False, world_sizes=(1,),
                   faults=[{"kind": "nan_grad", "step": 3, "rank": 0}])
    result = run_training(trial_of(cfg, 1), cfg, TrainingContext(rank=0, world_size=1, device="cpu"))
    assert result.status == "nan" and result.steps_done == 6
    assert result.summary["first_nan_step"] == 3


def _eval_on_ranks(rank: int, world_size: int, workload: str) -> dict:
    from service.train.loop import run_eval
    from service.workloads import build_workload

    wl = build_workload(workload, 0)
    return run_eval(wl.model, wl, TrainingContext(rank=rank, world_size=world_size, device=torch.device("cpu")))


@pytest.mark.parametrize("workload", ["char_lm", "tests.dict_workload:dict_digits"])
def test_every_rank_evaluates_its_share_and_gets_the_whole_sets_metrics(workload):
    """run_eval at W = 3 (each rank a contiguous third of the eval set, one float64 all-reduce)
    gives every rank the metrics one process gets from the whole set (to float32's rounding of
    the per-batch means), for a loss_fn workload and a batch_loss one."""
    from service.workloads import build_workload, evaluate_workload

    wl = build_workload(workload, 0)
    whole = evaluate_workload(wl, wl.model)
    ranks = run_distributed(_eval_on_ranks, 3, args=(workload,))
    assert ranks[0] == ranks[1] == ranks[2]
    assert ranks[0].keys() == whole.keys()
    for key, value in whole.items():
        assert ranks[0][key] == pytest.approx(value, rel=1e-6), key


def test_a_workloads_own_eval_fn_runs_on_rank_0_alone():
    ranks = run_distributed(_eval_on_ranks, 2, args=("tests.dict_workload:with_eval_fn",))
    assert ranks[1] == {} and set(ranks[0]) >= {"eval_loss"}, ranks
