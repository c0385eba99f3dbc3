"""post_local_sgd and diloco on real gloo groups at W = 2 and 3, through the training loop:
period 1 equals allreduce (SGD), every rank holds the same parameters at every exchange (and a
deliberately broken averager is caught), gradient accumulation, NaN provenance in a local step,
resume mid-period, evals on the anchor, and the exchange's bytes averaged over the steps.

Every scenario of one world size runs in ONE set of spawned processes (module fixture).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist

import hooks
from hooks import local_sgd
from service.config import SweepConfig
from service.train import Start, TrainingContext, load_checkpoint_dir, run_training, save_checkpoint_dir
from service.train.loop import run_eval
from tests.dist_utils import run_distributed
from tests.test_worker import make_cfg

PERIOD_ONE = [{"name": "post_local_sgd", "period": 1},
              {"name": "diloco", "period": 1, "outer_lr": 1.0, "outer_momentum": 0.0}]
PERIODIC = [{"name": "post_local_sgd", "period": 3}, {"name": "diloco", "period": 3}]
RESUMED = [{"name": "post_local_sgd", "period": 4},
           {"name": "diloco", "period": 4, "outer_hook": "quantization_perchannel(chunk_size=64,error_feedback=true)"}]


def cfg_of(hook_entries, world_size, **settings) -> SweepConfig:
    settings.setdefault("global_batch_size", 24)  # splits over 2 and 3 ranks, with 2 micro-batches too
    return make_cfg(hooks=["allreduce", *hook_entries] if settings.pop("baseline", True) else hook_entries,
                    world_sizes=(world_size,), **settings)


# ----------------------------------------------------------------------------- in every rank
def flat_weights(module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def spread_across_ranks(module) -> float:
    """The largest difference of any parameter between this rank and any other."""
    mine = flat_weights(module)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return max(float((mine - other).abs().max()) for other in every)


def checking_build(records: list, states: list, broken: str = ""):
    """hooks.build whose periodic state records, after every optimizer step, whether it exchanged
    and how far the ranks' parameters are apart then. ``broken``: 'anchor_only' (the average
    lands in the anchor, not in the model) or 'no_divide' (a sum, not a mean)."""

    def build(name, process_group=None, **params):
        state, hook = hooks.build(name, process_group, **params)
        if not hooks.available()[name].periodic:
            return state, hook
        states.append(state)
        if broken == "anchor_only":
            state.exchange = lambda: _anchor_only(state)
        elif broken == "no_divide":
            state.world_size = lambda: 1
        after_step = state.after_step

        def recorded(step):
            synced = after_step(step)
            records.append((step, synced, spread_across_ranks(_module_of(state))))
            return synced

        state.after_step = recorded
        return state, hook

    return build


class _Weights(torch.nn.Module):
    def __init__(self, weights):
        super().__init__()
        self.w = torch.nn.ParameterList([torch.nn.Parameter(w, requires_grad=False) for w in weights])


def _module_of(state):
    return _Weights([w.data for w in state.weights])


def _anchor_only(state):
    local = local_sgd._flat(state.weights)
    mean = local / dist.get_world_size()
    dist.all_reduce(mean)
    local_sgd._unflatten_into(mean, state.anchor)
    return 0.0, 0.0


def _losses(cfg, rank, world_size, **ctx):
    out = {}
    for trial in cfg.trials():
        result = run_training(trial, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu", **ctx))
        out[trial.config_label] = result
    return out


def _scenarios(rank, world_size, checkpoint_dir):
    out = {}
    out["period_one"] = _losses(cfg_of(PERIOD_ONE, world_size, steps=12), rank, world_size)
    out["accumulation"] = _losses(cfg_of(PERIOD_ONE[:1], world_size, steps=8, grad_accumulation=2), rank, world_size)
    for broken in ("", "anchor_only", "no_divide"):
        records, states = [], []
        results = _losses(cfg_of(PERIODIC if not broken else PERIOD_ONE[:1], world_size, steps=9, baseline=False),
                          rank, world_size, build_hook=checking_build(records, states, broken))
        out[f"agreement{broken}"] = (records, {k: r.summary for k, r in results.items()}, [r.losses for r in results.values()])
    # the eval reads the anchor: 10 steps, period 4, so the last exchange was at step 8
    records, states = [], []
    cfg = cfg_of([{"name": "post_local_sgd", "period": 4}], world_size, steps=10, baseline=False, eval_every=10)
    trial = cfg.trials()[0]
    result = run_training(trial, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu",
                                                      build_hook=checking_build(records, states)))
    state = states[0]
    module = _Weights([w.data for w in state.weights])  # the trial's module's parameters, as they ended
    from service.workloads import build_workload
    wl = build_workload(cfg.workload.name, trial.seed)
    local_eval = _eval_with(wl, state.weights, rank, world_size)
    anchor_eval = _eval_with(wl, state.anchor, rank, world_size)
    out["anchor"] = (result.summary.get("final_eval_loss"), local_eval, anchor_eval, float(spread_across_ranks(module)))
    out["nan"] = _losses(make_cfg(steps=8, hooks=[{"name": "post_local_sgd", "period": 4}, {"name": "diloco", "period": 4}],
                                  world_sizes=(world_size,), faults=[{"kind": "nan_grad", "step": 5, "rank": 1}],
                                  global_batch_size=24),
                         rank, world_size)
    out["resume"] = _resume(rank, world_size, checkpoint_dir)
    return out


def _eval_with(wl, weights, rank, world_size) -> float:
    with torch.no_grad():
        for p, w in zip(wl.model.parameters(), weights):
            p.copy_(w)
    return run_eval(wl.model, wl, TrainingContext(rank=rank, world_size=world_size, device="cpu"))["eval_loss"]


def _resume(rank, world_size, checkpoint_dir):
    cfg = cfg_of(RESUMED, world_size, steps=10, baseline=False, optimizer="adamw", lr=0.01,
                 checkpoint={"every": 3, "max_failures": 1})
    out = {}
    for trial in cfg.trials():
        directory = os.path.join(checkpoint_dir, trial.config_label)

        def keep(step, state):
            path = os.path.join(directory, f"step_{step}")
            os.makedirs(path, exist_ok=True)
            save_checkpoint_dir(path, state)

        whole = run_training(trial, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu", checkpoint_fn=keep))
        dist.barrier()  # every rank's part is on disk
        start = Start(checkpoint=load_checkpoint_dir(os.path.join(directory, "step_6"), rank), restarts=1)
        resumed = run_training(trial, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu", start=start))
        out[trial.config_label] = (whole, resumed)
    return out


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("checkpoints"))
    return request.param, run_distributed(_scenarios, request.param, args=(directory,), timeout_s=300)


# ----------------------------------------------------------------------------- the checks
def test_period_one_with_sgd_takes_allreduces_steps(ranks):
    """SGD, period 1, start_iter 0: averaging the models after each local step is averaging the
    gradients; diloco with outer lr 1 and no momentum likewise. Equal within float rounding."""
    _, results = ranks
    for rank_results in results:
        runs = rank_results["period_one"]
        base = runs["allreduce"].losses
        assert len(base) == 12
        for label in ("post_local_sgd-p1", "diloco-p1-olr1-om0"):
            assert runs[label].status == "ok"
            assert runs[label].losses == pytest.approx(base, rel=1e-5, abs=1e-6), label
        assert runs["post_local_sgd-p1"].summary["final_eval_loss"] == pytest.approx(
            runs["allreduce"].summary["final_eval_loss"], rel=1e-5)


def test_period_one_with_gradient_accumulation_still_equals_allreduce(ranks):
    _, results = ranks
    runs = results[0]["accumulation"]
    assert runs["post_local_sgd-p1"].losses == pytest.approx(runs["allreduce"].losses, rel=1e-5, abs=1e-6)


def test_every_rank_holds_the_same_parameters_at_every_exchange_and_drifts_between(ranks):
    _, results = ranks
    records, summaries, _ = results[0]["agreement"]
    synced = [(step, spread) for step, did, spread in records if did]
    local = [(step, spread) for step, did, spread in records if not did]
    assert [s for s, _ in synced] == [3, 6, 9, 3, 6, 9]  # both configurations, period 3
    assert all(spread == 0.0 for _, spread in synced), synced
    assert all(spread > 0.0 for _, spread in local), local  # local steps do drift apart
    params_mb = (64 * 32 + 32 + 32 * 10 + 10) * 4 / 2**20
    for label, held in (("post_local_sgd-p3", 3), ("diloco-p3", 4)):
        s = summaries[label]
        assert s["syncs"] == 3 and s["sync_ms"] > 0 and s["replica_drift"] > 0
        # parameters, gradients (SGD keeps no state), the anchor, and DiLoCo's outer momentum
        assert s["memory_per_rank_mb"] == pytest.approx(held * params_mb, rel=1e-9), label


def test_a_broken_averager_is_caught(ranks):
    """The checks above fail on an averager that writes the mean only into its anchor (the
    ranks disagree after the exchange) and on one that sums instead of averaging (the ranks
    agree, but period 1 no longer takes allreduce's steps)."""
    _, results = ranks
    records, _, _ = results[0]["agreement" + "anchor_only"]
    assert any(did and spread > 0 for _, did, spread in records)
    records, _, losses = results[0]["agreement" + "no_divide"]
    assert all(spread == 0.0 for _, did, spread in records if did)
    base = results[0]["period_one"]["allreduce"].losses[:9]
    assert losses[0] != pytest.approx(base, rel=1e-5, abs=1e-6)


def test_evals_read_the_anchor_not_a_ranks_own_parameters(ranks):
    _, results = ranks
    for rank_results in results:
        final, local, anchor, spread = rank_results["anchor"]
        assert spread > 0  # two local steps after the last exchange: the ranks differ
        assert final == pytest.approx(anchor, rel=1e-6)
        assert final != pytest.approx(local, rel=1e-6)


def test_a_nan_in_a_local_step_is_found_on_its_rank_at_its_step(ranks):
    _, results = ranks
    for rank_results in results:
        for label, result in rank_results["nan"].items():
            report = result.nan_report
            assert result.status == "nan" and result.steps_done == 5, label
            assert (report.nan_source, report.first_nan_step, report.nan_rank) == ("model_grad", 5, 1), label


def test_resume_mid_period_ends_where_the_uninterrupted_run_does(ranks):
    """Checkpoint at step 6, two steps into a period of 4: every rank's own model and AdamW state,
    the anchor, DiLoCo's outer momentum and its outer hook's error-feedback residual come back."""
    _, results = ranks
    for rank_results in results:
        for label, (whole, resumed) in rank_results["resume"].items():
            assert resumed.steps_done == whole.steps_done == 10, label
            assert resumed.losses == pytest.approx(whole.losses[6:], rel=1e-6, abs=1e-7), label
            assert resumed.summary["final_eval_loss"] == pytest.approx(whole.summary["final_eval_loss"], rel=1e-6)


def test_the_exchange_s_bytes_are_averaged_over_the_steps(ranks):
    """comm_bytes_per_step of post_local_sgd is 1/period of the allreduce of every parameter."""
    world_size, results = ranks
    summary = results[0]["agreement"][1]["post_local_sgd-p3"]
    params = 64 * 32 + 32 + 32 * 10 + 10
    full = 2 * (world_size - 1) / world_size * 4 * params
    assert summary["comm_bytes_per_step"] == pytest.approx(full / 3, rel=1e-9)


# ----------------------------------------------------------------------------- names, refusals, pricing
def test_trial_names_carry_the_period_and_the_outer_hook():
    cfg = make_cfg(hooks=[{"name": "post_local_sgd", "period": [4, 16]},
                          {"name": "diloco", "period": 64, "outer_hook": "bf16_compress"},
                          {"name": "diloco", "outer_hook": "quantization_perchannel(chunk_size=256,error_feedback=true)"},
                          {"name": "diloco", "period": 8, "outer_lr": 1.0, "outer_momentum": 0.0}],
                   world_sizes=(2,))
    assert [t.config_label for t in cfg.trials()] == [
        "post_local_sgd-p4", "post_local_sgd-p16", "diloco-p64-bf16_compress",
        "diloco-p64-quantization_perchannel-c256-error_feedback", "diloco-p8-olr1-om0"]
    assert len({t.key for t in cfg.trials()}) == 5


@pytest.mark.parametrize("entry, says", [
    ({"name": "post_local_sgd", "period": 0}, "period"),
    ({"name": "diloco", "outer_hook": "nope"}, "unknown hook 'nope'"),
    ({"name": "diloco", "outer_hook": "diloco"}, "exchanges periodically"),
    ({"name": "diloco", "outer_momentum": 1.0}, "outer_momentum"),
    ({"name": "post_local_sgd", "group_size": 3}, "group_size: 3 does not divide world_size 2"),
])
def test_bad_periodic_settings_are_one_line_refusals(entry, says, tmp_path):
    from service.config import ConfigError

    text = ("name: x\nworkload: {name: mlp_digits, steps: 8}\n"
            f"search: {{hooks: [{json_entry(entry)}], world_size: [2, 4]}}\n")
    with pytest.raises(ConfigError) as err:
        parse_config(text, tmp_path)
    assert says in str(err.value) and "\n" not in str(err.value).strip()


def parse_config(text: str, tmp_path):
    from service.config import load_config

    path = tmp_path / "x.yaml"
    path.write_text(text)
    return load_config(str(path))


def json_entry(entry: dict) -> str:
    import json

    return json.dumps(entry)


def test_a_split_network_sweep_must_time_an_exchange(tmp_path):
    from service.config import ConfigError

    text = ("name: x\nworkload: {name: mlp_digits, steps: 80, warmup_steps: 5}\n"
            "search: {hooks: [allreduce, {name: diloco, period: 64}], world_size: [2]}\n"
            "network: {link_gbps: [1, 2.5], timing_steps: 30}\n")
    with pytest.raises(ConfigError, match="network.timing_steps: 30 steps time no exchange of diloco with period 64 "
                                          "after the 5 warm-up steps; allowed: 69 or more"):
        parse_config(text, tmp_path)


def _timeline(hook="post_local_sgd", sync=None):
    from service.step_model.timeline import BucketTiming, LinearCost, StepTimeline
    from service.step_model.trial import ComputePoint, TrialTimeline

    bucket = BucketTiming(ready_ms=5.0, numel=100_000, encode_ms=0.1, comm_ms=0.0, decode=LinearCost(0.0))
    step = StepTimeline(hook, 2, 32, forward_ms=10.0, buckets=(bucket,), backward_end_ms=20.0, optimizer_ms=2.0,
                        hook_params=hooks.validate(hook))
    return TrialTimeline(step, (6, 7), (ComputePoint(32, 10.0, 20.0), ComputePoint(16, 6.0, 11.0)), sync=sync)


def test_the_step_model_prices_a_local_step_and_the_exchange_amortized_over_the_period():
    from hooks.cost import collective_seconds
    from service.step_model.timeline import SyncTiming
    from service.step_model.trial import TrialTimeline

    sync = SyncTiming(period=4, hook="allreduce", numel=1_000_000, compute_ms=3.0, comm_ms=0.0)
    local, periodic = _timeline(), _timeline(sync=sync)
    for w, link in ((2, 1.0), (32, 1.0), (32, 100.0)):
        bare = local.price(64, w, link, 25e-6)
        priced = periodic.price(64, w, link, 25e-6)
        wire_ms = 1000 * collective_seconds("allreduce", 4_000_000, w, link, 25e-6)
        # a cluster cell: a core per rank, so the exchange's compute as measured
        assert priced.sync_ms == pytest.approx(3.0 + wire_ms, rel=1e-6)
        assert priced.step_ms == pytest.approx(bare.step_ms + priced.sync_ms / 4, rel=1e-9)
    assert bare.step_ms == pytest.approx(local.price(64, 32, 1.0, 25e-6).step_ms)  # a local step sends nothing
    back = TrialTimeline.from_json(json.loads(json.dumps(periodic.to_json())))
    assert back.sync == sync and back.price(64, 8, 1.0).step_ms == periodic.price(64, 8, 1.0).step_ms


def test_post_local_sgd_groups_allreduce_within_the_group_in_the_model():
    """group_size 2: a local step's allreduce runs across 2 ranks whatever the world size."""
    from hooks.cost import collective_seconds
    from hooks.wire import Collective

    params = hooks.validate("post_local_sgd", group_size=2)
    assert hooks.cost.hook_collectives("post_local_sgd", 1000, 32, **params) == [Collective("allreduce", 4000, 1.0, 2)]
    t = _timeline().timeline
    from dataclasses import replace as _replace
    grouped = _replace(t, hook_params=params)
    from service.step_model.price import comm_ms
    assert comm_ms(grouped, t.buckets[0], 32, 1.0, 25e-6) == pytest.approx(
        1000 * collective_seconds("allreduce", 400_000, 2, 1.0, 25e-6))
