"""The report's per-bucket plan for ``report.cluster``: designed from the sweep's step timelines
(service/step_model/planner.py) among the configurations whose quality matched the baseline's,
shown beside the best uniform configuration with the sentence a user pastes into
``search.hooks`` to prove it by a trial. Designed, not trained: the sweep has not measured it."""

from __future__ import annotations

from typing import Optional

from service.answer.plan import PlanAnswer, hook_entry
from service.answer.recommend import BASELINE_HOOK

HEADING = "A per-bucket plan for W={w} on {gbps:g} Gbit/s ({source})"


def markdown(a: Optional[PlanAnswer], cell=None, source: str = "report.cluster",
             cluster_winner: Optional[str] = None) -> list[str]:
    """The section's lines for summary.md (nothing without a cell: report.cluster or search.plan's);
    ``cluster_winner``: the answer at this same cell under the one rule (the headline's, for
    report.cluster's cell), which the section names first: the plan is one candidate of it."""
    if a is None:
        return []
    heading = HEADING.format(w=cell.world_size, gbps=cell.link_gbps, source=source) if cell else "A per-bucket plan"
    lines = [f"### {heading}", ""]
    if cluster_winner is not None:
        lines += [f"The answer at this cell: **{cluster_winner}** (the one rule's, as in the headline and the map); "
                  "a plan becomes the answer only once its own trials win beyond the error (search.plan trains it).", ""]
    if a.plan is None:
        return lines + [f"No plan: {a.why_not}.", ""]
    p = a.plan
    lines += ["| bucket | MB (fp32) | configuration |", "|---|---:|---|"]
    lines += [f"| {i} | {4 * n / 1e6:.2f} | {c} |" for i, (n, c) in enumerate(zip(a.numels, p.choices))]
    rule = f"searched: {p.searched}; {_margin_rule(a)}"
    pricing = pricing_sentence(p.choices[0] if p.is_uniform else p.uniform, cluster_winner)
    if p.is_uniform:
        same = "" if p.choices[0] == BASELINE_HOOK else f"; {BASELINE_HOOK} everywhere {_priced(a, (BASELINE_HOOK,), p.baseline_step_ms)}"
        return lines + ["", f"No per-bucket plan beats a uniform configuration here: {_why_uniform(a)}; "
                            f"projected step {_priced(a, p.choices, p.step_ms)}{same} ({rule}). {pricing}", ""]
    mine, theirs = a.time_to_target_s(p.choices, p.step_ms), a.time_to_target_s((p.uniform,), p.uniform_step_ms)
    ttt = ("" if mine is None or theirs is None else
           f" Time to target {mine:.3g} s against {theirs:.3g} s, assuming the plan crosses at the slowest "
           "crossing step of the configurations it mixes (a trial of it measures its own).")
    lines += ["", f"Projected step {p.step_ms:.3g} ms against {p.uniform_step_ms:.3g} ms for {p.uniform} "
                  f"everywhere: {p.gain_pct:+.1f} % shorter; {BASELINE_HOOK} everywhere {p.baseline_step_ms:.3g} ms "
                  f"({rule}).{ttt} {pricing}", ""]
    if a.trained is None:
        return lines + ["Designed from the timelines, not yet trained. To prove it by a trial, add to "
                        f"search.hooks: `{hook_entry(a)}` (or set search.plan to train it in a last round).", ""]
    return lines + [_trained_text(a, cell), ""]


def _priced(a: PlanAnswer, choices: tuple[str, ...], step_ms: float) -> str:
    """'59 ms, time to target 5.9 s' (the step alone where a configuration it runs never crossed)."""
    seconds = a.time_to_target_s(choices, step_ms) if a.crossings else None
    return f"{step_ms:.3g} ms" + ("" if seconds is None else f", time to target {seconds:.3g} s")


def pricing_sentence(pick: str, cluster_winner: Optional[str]) -> str:
    """The one sentence that says how this section's figures differ from the answer's: a plan
    mixes buckets on one backward pass, so it prices every configuration with the baseline's
    compute and by its step; the answer (the headline's, the projection table's, the map's)
    prices each with its own trials' compute, what the error bands were measured on, and
    decides by time to target beyond the error. Where the plan's design picks another
    configuration, the answer still stands."""
    how = (f"a plan mixes buckets on one backward pass, so here every configuration is priced with "
           f"{BASELINE_HOOK}'s compute and compared by its step, where the answer prices each with its own "
           "trials' compute (what its error band was measured on) and decides by time to target beyond the error")
    if cluster_winner is None or cluster_winner == pick:
        return f"How these figures are priced: {how}."
    return f"The design picks {pick} by its step, the answer stays {cluster_winner}: {how}."


def _trained_text(a: PlanAnswer, cell) -> str:
    """What the plan's own trials showed: quality, and the step measured where the cell is this machine's."""
    t, p = a.trained, a.plan
    quality = "matched" if t.matches else "did not match (its verdict is in the table above)"
    where = f"W={t.quality_world_size}" + ("" if cell is None or cell.world_size == t.quality_world_size
                                            else f" (the quality W={cell.world_size} assumes)")
    text = f"Proven by a trial: {t.config} trained at the baseline's seeds; its quality {quality} {BASELINE_HOOK}'s at {where}."
    own = "" if t.projected_own_ms is None else f", {t.projected_own_ms:.3g} ms from its own timeline"
    if t.measured_ms is None or t.uniform_measured_ms is None:
        return text + (f" The cell is not one this machine measured: projected {p.step_ms:.3g} ms as designed{own}.")
    gain = 100.0 * (1.0 - t.measured_ms / t.uniform_measured_ms)
    return text + (f" Measured here at the cell: step {t.measured_ms:.3g} ms against {t.uniform_measured_ms:.3g} ms for "
                   f"{p.uniform} everywhere ({gain:+.1f} % shorter); projected {p.step_ms:.3g} ms as designed{own} "
                   f"(error {100.0 * (p.step_ms / t.measured_ms - 1):+.1f} %).")


def _margin_rule(a: PlanAnswer) -> str:
    """The band rule with each candidate's margin."""
    each = ", ".join(f"{c} {m:.1f} %" for c, m in sorted((a.margins or {}).items()))
    return (f"a bucket leaves {BASELINE_HOOK} only where it saves more of the step than the spread of the model's "
            f"error on its configuration's step over {BASELINE_HOOK}'s at this W ({each or 'none measured'})")


def _why_uniform(a: PlanAnswer) -> str:
    choice = a.plan.choices[0]
    if len(a.numels) == 1:
        return f"the model has one bucket ({choice})"
    if choice == BASELINE_HOOK:
        return f"compressing no bucket saves more than its margin ({choice} everywhere)"
    return f"every bucket's communication is exposed ({choice} everywhere)"


def html_parts(lines: list[str]) -> Optional[dict]:
    """The section's markdown lines as the HTML report draws them: heading, the bucket table,
    paragraphs (None: no section)."""
    if not lines:
        return None
    table = [[c.strip().strip("`") for c in line.strip("|").split("|")] for line in lines if line.startswith("|")]
    return {"heading": lines[0].lstrip("# "), "header": table[0] if table else [],
            "rows": [r for r in table[2:]], "paragraphs": [line.replace("`", "").replace("**", "") for line in lines[1:]
                                                        if line and not line.startswith("|")]}
