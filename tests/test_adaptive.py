"""service/sweep/adaptive.py on synthetic outcomes: which configurations get another seed (issue
23): decided at min, decided later, undecided at max, NaN/failed, the baseline paired with every
seed used, and the same rounds when an interrupted sweep's outcomes are replayed."""
from __future__ import annotations

import hooks
from service.config import TrialSpec
from service.sweep.adaptive import Outcome, SeedRounds
from service.sweep.searcher import SeedSearcher

CONFIGS = ["allreduce", "bf16_compress", "quantization_pertensor", "topk", "signsgd"]
MAX = 5


def _grid(world_sizes=(2,)):
    return [TrialSpec(hook=h, hook_params=hooks.validate(h), world_size=w, seed=s)
            for w in world_sizes for s in range(MAX) for h in CONFIGS]


# Final eval loss per configuration and seed, relative to allreduce's 1.0 (tolerance 1%):
LOSSES = {
    "allreduce": [1.0] * MAX,
    "bf16_compress": [1.0001, 1.0002, 1.0001, 1.0, 1.0],     # matches at 2 seeds
    "quantization_pertensor": [1.05, 1.0501, 1.04, 1.05, 1.05],  # worse at 2 seeds (they agree)
    "topk": [1.002, 0.998, 1.003, 1.001, 1.0],               # needs more seeds to match
    "signsgd": [1.0, 1.03, 0.99, 1.04, 0.98],                 # the tolerance inside at max: undecided
}


def _run(rounds: SeedRounds, outcome_of, outcomes=None):
    """Plan rounds until done, every planned trial ending as ``outcome_of(trial)`` says."""
    outcomes = {} if outcomes is None else outcomes
    plan = []
    while True:
        trials = rounds.plan(outcomes)
        if not trials:
            return plan, outcomes
        plan.append(trials)
        for t in trials:
            outcomes.setdefault(t.key, outcome_of(t))


def _ok(t):
    return Outcome("ok", LOSSES[t.hook][t.seed])


def _by_hook(verdicts):
    """{hook: verdict} from {configuration label (e.g. signsgd-c512): Verdict}."""
    return {name.split("-")[0]: v.value for name, v in verdicts.items()}


def _seeds(trials, hook):
    return sorted(t.seed for t in trials if t.hook == hook)


def test_undecided_configurations_get_seeds_until_decided_or_max_and_the_baseline_every_one():
    rounds = SeedRounds(_grid(), 2, MAX, tolerance=0.01)
    plan, outcomes = _run(rounds, _ok)
    everything = [t for r in plan for t in r]
    assert len(plan[0]) == 2 * len(CONFIGS)               # every configuration at min seeds
    assert _seeds(everything, "bf16_compress") == [0, 1]   # decided at min: no more seeds
    assert _seeds(everything, "quantization_pertensor") == [0, 1]
    assert _seeds(everything, "allreduce") == list(range(MAX))  # paired with every seed used
    assert _seeds(everything, "signsgd") == list(range(MAX))
    topk = _seeds(everything, "topk")
    assert 2 < len(topk) < MAX
    verdicts = _by_hook(rounds.verdicts(outcomes)[(2, None, False)])
    assert verdicts == {"allreduce": "baseline", "bf16_compress": "matches", "quantization_pertensor": "worse",
                        "topk": "matches", "signsgd": "undecided"}
    assert len(everything) == len({t.key for t in everything})   # no trial twice
    assert rounds.range_text() == "10 to 25 trials"


def test_nan_and_failed_are_decided_and_a_broken_baseline_stops_its_group():
    def outcome(t):
        if t.hook == "signsgd" and t.seed == 1:
            return Outcome("nan")
        if t.hook == "topk" and t.seed == 0:
            return Outcome("failed")
        return _ok(t)
    rounds = SeedRounds(_grid(), 2, MAX, tolerance=0.01)
    plan, outcomes = _run(rounds, outcome)
    everything = [t for r in plan for t in r]
    assert _seeds(everything, "signsgd") == [0, 1] and _seeds(everything, "topk") == [0, 1]
    verdicts = _by_hook(rounds.verdicts(outcomes)[(2, None, False)])
    assert verdicts["signsgd"] == "nan" and verdicts["topk"] == "failed"
    assert len(plan) == 1  # nothing left undecided after round 1

    def baseline_fails(t):
        return Outcome("failed") if t.hook == "allreduce" and t.seed == 1 else _ok(t)
    rounds = SeedRounds(_grid(), 2, MAX, tolerance=0.01)
    plan, _ = _run(rounds, baseline_fails)
    assert len(plan) == 1  # nothing can be paired at seed 1 any more: no seed is added


def test_world_sizes_decide_apart():
    def outcome(t):  # topk matches at W=2 at once, stays undecided at W=4
        if t.hook == "topk" and t.world_size == 2:
            return Outcome("ok", 1.0)
        return _ok(t)
    rounds = SeedRounds(_grid((2, 4)), 2, MAX, tolerance=0.01)
    plan, _ = _run(rounds, outcome)
    later = [t for r in plan[1:] for t in r]
    assert {(t.hook, t.world_size) for t in later} >= {("topk", 4), ("allreduce", 4)}
    assert not [t for t in later if t.world_size == 2 and t.hook == "topk"]


def test_replaying_an_interrupted_sweeps_outcomes_plans_the_same_rounds():
    first = SeedRounds(_grid(), 2, MAX, tolerance=0.01)
    plan, outcomes = _run(first, _ok)
    # interrupted during round 3: its first trial and everything before it had finished
    done_keys = {t.key for r in plan[:2] for t in r} | {plan[2][0].key}
    replay = SeedRounds(_grid(), 2, MAX, tolerance=0.01)
    again, _ = _run(replay, _ok, {k: v for k, v in outcomes.items() if k in done_keys})
    assert [[t.key for t in r] for r in again] == [[t.key for t in r] for r in plan]


def test_the_searcher_hands_out_rounds_waits_between_them_and_skips_done_trials():
    rounds = SeedRounds(_grid(), 2, MAX, tolerance=0.01)
    done = {t.key: _ok(t) for t in _grid() if t.seed == 0}       # seed 0 ran before an interrupt
    searcher = SeedSearcher(rounds, done)
    handed = []
    for i in range(len(CONFIGS)):                                  # round 1 less what is done
        handed.append(searcher.suggest(f"t{i}")["trial"])
    assert {d["seed"] for d in handed} == {1} and searcher.suggest("wait") is None
    for i, d in enumerate(handed):
        searcher.on_trial_complete(f"t{i}", {"status": "ok", "final_eval_loss": LOSSES[d["hook"]][d["seed"]]})
    second = searcher.suggest("t9")["trial"]
    assert second["seed"] == 2 and rounds.round == 2
    searcher.on_trial_complete("t9", None, error=True)            # a trial Tune saw error out
    assert searcher._outcomes[TrialSpec.from_dict(second).key].state == "failed"


def test_a_split_network_sweeps_timing_runs_run_in_round_one_and_decide_nothing():
    """Issue 24: quality runs (loopback, every seed) decide; the timing runs (one per configuration
    and link, at seed 0) run in round 1 whatever their few steps' loss, and never again."""
    quality = [t.model_copy(update={"kind": "quality"}) for t in _grid()]
    timing = [t.model_copy(update={"kind": "timing", "link_gbps": g}) for t in _grid() if t.seed == 0
              for g in (1.0, 2.5)]
    rounds = SeedRounds(quality + timing, 2, MAX, tolerance=0.01)
    assert rounds.range_text() == f"{10 + len(timing)} to {25 + len(timing)} trials"
    plan, outcomes = _run(rounds, lambda t: Outcome("ok", 9.0) if t.kind == "timing" else _ok(t))
    assert {t.key for t in timing} <= {t.key for t in plan[0]} and not any(t.kind == "timing" for r in plan[1:] for t in r)
    assert list(rounds.verdicts(outcomes)) == [(2, None, False)]  # the quality runs' group only
    assert _by_hook(rounds.verdicts(outcomes)[(2, None, False)])["topk"] == "matches"


def test_left_to_run_replays_the_rounds_over_what_is_done():
    """--resume decides what is unfinished before anything is measured or started: after the whole
    schedule nothing is left; after round 1 alone, round 2's trials are."""
    from service.sweep.adaptive import left_to_run

    plan, outcomes = _run(SeedRounds(_grid(), 2, MAX, tolerance=0.01), _ok)
    assert left_to_run(SeedRounds(_grid(), 2, MAX, tolerance=0.01), outcomes) == []
    first = {t.key: outcomes[t.key] for t in plan[0]}
    left = left_to_run(SeedRounds(_grid(), 2, MAX, tolerance=0.01), first)
    assert [t.key for t in left] == [t.key for t in plan[1]] and left
