"""``search.plan``: the sweep's last round, a per-bucket plan designed from what its trials
recorded, then trained like any configuration.

After the configured trials end, the sweep reads itself back as the report does (the quality
verdicts, each configuration's step timelines, the transport every projected figure is priced
with: service/answer/pricing.py) and designs the plan for ``search.plan.cell`` among the
configurations whose quality matched the baseline's (service/answer/plan.py,
service/step_model/planner.py). A plan that mixes
configurations then trains at every world size, link and seed the baseline ran, so each of its
trials pairs with one of the baseline's (like with like: the same seeds, the same links). A
uniform plan is one of the configurations already trained: nothing new runs.

``--resume`` designs the plan again from the same records (the plan's own trials are never a
candidate) and runs only the plan trials without an ended run.
"""

from __future__ import annotations

from typing import TextIO

from service.config import SweepConfig, TrialSpec
from service.answer.plan import PLAN, PlanAnswer, answer, hook_entry, plan_params
from service.answer.recommend import BASELINE_HOOK


def design(cfg: SweepConfig, parent_run_id: str, tracking_uri: str) -> PlanAnswer:
    """The plan for ``cfg.search.plan.cell`` from the sweep's records so far."""
    from service.answer.data import load_sweep, open_store, recommendations
    from service.answer.pricing import pricing
    from service.answer.projection import bases

    reader = open_store(tracking_uri)
    sweep = load_sweep(reader, parent_run_id)
    found = bases(sweep.trials, recommendations(sweep), reader.step_timeline)
    cell = cfg.report.cluster if cfg.search.plan.cell == "cluster" else cfg.search.plan.cell
    # priced as the report's plan section prices it: the same transport (the cluster's probe where given)
    return answer(found, cell, pricing(reader, parent_run_id, cfg.report).transport)


def plan_trials(cfg: SweepConfig, trials: list[TrialSpec], plan: PlanAnswer, ran: set[str]) -> list[TrialSpec]:
    """The plan's trials: one per trial of the baseline that ran (``ran``: the keys of the trials
    with a run), the same world size, link, seed and run kind, with the plan as its hook. []
    for no plan or a uniform one."""
    if plan.plan is None or plan.plan.is_uniform:
        return []
    params = plan_params(plan)
    return [t.model_copy(update={"hook": PLAN, "hook_params": params})
            for t in _baseline(trials) if t.key in ran]


def _baseline(trials: list[TrialSpec]) -> list[TrialSpec]:
    return [t for t in trials if t.config_label == BASELINE_HOOK]


def trials_to_measure(cfg: SweepConfig, trials: list[TrialSpec], pending: list[TrialSpec]) -> list[TrialSpec]:
    """The trials whose links a ``--resume`` measures: the pending ones and, with search.plan, the
    baseline's, whose links the plan round trains on (``plan_trials``) whether or not they are pending."""
    if cfg.search.plan is None:
        return pending
    keys = {t.key for t in pending}
    return pending + [t for t in _baseline(trials) if t.key not in keys]


def announce(plan: PlanAnswer, trials: list[TrialSpec], out: TextIO) -> None:
    """One line: what the plan round trains, or why it trains nothing."""
    if plan.plan is None:
        line = f"Plan round: no plan ({plan.why_not}); nothing more to train."
    elif plan.plan.is_uniform:
        line = (f"Plan round: the designed plan is {plan.plan.choices[0]} on every bucket, a configuration "
                "the sweep already trained; nothing more to train.")
    else:
        line = (f"Plan round: {len(trials)} trials of {hook_entry(plan)} (projected step "
                f"{plan.plan.step_ms:.3g} ms against {plan.plan.uniform_step_ms:.3g} ms for {plan.plan.uniform} "
                "everywhere)")
    print(line, file=out, flush=True)
