"""The report's text: markdown and CSV tables, the headline, and report.html rendered from the
Jinja2 template templates/report.html.j2 (autoescaped: every value from MLflow is text)."""

from __future__ import annotations

import base64
import csv
import json
import math
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import jinja2

from service import uris
from service.config.trial import COMPILED, KNOB_DEFAULTS
from service.report import plan_section
from service.answer import recommend
from service.answer import decision
from service.answer.data import SummaryRow, Sweep, link_order
from service.answer.decision import SweepAnswer
from service.answer.recommend import BASELINE_HOOK
from service.text import format_bytes


# --------------------------------------------------------------------------------------------
# The answer in a sentence
# --------------------------------------------------------------------------------------------

def headline(answer: SweepAnswer, sweep: Sweep | None = None, hidden_above_gbps: float | None = None) -> list[str]:
    """The answer a person reads in ten seconds, one short sentence each (rendered from the
    sweep's answer, answer.json): the answer here per world size; for report.cluster, the answer
    there and what it was priced on; what is open and what would decide it."""
    if not answer.measured:
        return ["No trial has finished yet: nothing to recommend."]
    lines = ["Here: " + "; ".join(_here_clauses(answer)) + "."]
    if answer.cluster is not None:
        lines.append(_cluster_sentence(answer.cluster, _backend(sweep), hidden_above_gbps))
    if answer.open:
        lines.append("Open (quality undecided): " + "; ".join(f"{o.config} at {o.where}: {o.decides}"
                                                         for o in answer.open) + ".")
    return lines


def _here_clauses(answer: SweepAnswer) -> list[str]:
    """'keep allreduce at W = 2 and 4 on loopback', 'use bf16_compress at W = 8 on 1 Gbit/s (1.31x
    faster than allreduce)': each answer once with the places it holds at."""
    groups: dict[tuple, list[tuple[int, str]]] = {}
    for w, m in sorted(answer.measured.items()):
        for where, a in (m.links or {m.link: m.answer}).items():
            firm = a.decided or a.answer == BASELINE_HOOK  # allreduce is kept the same way, decided or not
            key = (a.answer, firm, None if firm else a.runner_up, a.why_none)
            groups.setdefault(key, []).append((w, where))
    clauses = []
    for (choice, firm, tied_with, why_none), places in groups.items():
        at = _places_of(places)
        if choice is None:
            clauses.append(f"nothing qualifies at {at} ({why_none})")
        elif choice == BASELINE_HOOK:
            clauses.append(f"keep {choice} at {at}")
        elif firm:
            ups = [a.speedup for w, where in places for a in [_entry(answer, w, where)] if a.speedup]
            faster = f" ({' / '.join(f'{u:.2f}x' for u in ups)} faster than {BASELINE_HOOK})" if ups else ""
            clauses.append(f"use {choice} at {at}{faster}")
        else:
            clauses.append(f"use {choice} at {at} (faster than {BASELINE_HOOK}; too close to call against {tied_with})")
    return clauses


def _entry(answer: SweepAnswer, w: int, where: str):
    m = answer.measured[w]
    return m.links.get(where, m.answer) if m.links else m.answer


def _places_of(places: list[tuple[int, str]]) -> str:
    """'W = 2 and 4 on loopback', 'W = 2 on 1 Gbit/s and W = 4 on loopback'."""
    by_link: dict[str, list[int]] = {}
    for w, where in places:
        by_link.setdefault(where, []).append(w)
    return _and([f"W = {_and(sorted(set(ws)))} on {where}" for where, ws in by_link.items()])


def _backend(sweep: Sweep | None) -> str:
    params = sweep.trials[0].record.params if sweep is not None and sweep.trials else {}
    return "NCCL on GPU" if params.get("backend") == "nccl" else "gloo on CPU"


def _cluster_sentence(c, backend: str, hidden_above_gbps: float | None) -> str:
    """'Your cluster (W = 32 on 10 Gbit/s): keep allreduce (bf16_compress 3 % faster, inside the 14 %
    error), priced as hosts like this one: 2 cores, gloo on CPU; ...'."""
    where = f"Your cluster (W = {c.world_size} on {c.link_gbps:g} Gbit/s, report.cluster)"
    a = c.answer
    if a.answer is None:
        return f"{where}: not priced: {c.refused or a.why_none}."
    verb = "keep" if a.answer == BASELINE_HOOK else "use"
    if a.runner_up is None or a.margin_pct is None:
        call = ""
    elif a.decided:
        call = f" ({a.margin_pct:.0f} % ahead of {a.runner_up}, beyond the {_error(a)} error)"
    elif a.answer == BASELINE_HOOK:
        call = f" ({a.runner_up} {-a.margin_pct / (1 + a.margin_pct / 100):.0f} % faster, inside the {_error(a)} error)"
    else:
        call = f" (too close to call against {a.runner_up}: {a.margin_pct:.0f} % inside the {_error(a)} error)"
    hosts = _priced_on(c, backend)
    hidden = ("" if hidden_above_gbps is None else
              f"; on such hosts a link above {hidden_above_gbps:.2g} Gbit/s changes nothing: they move bytes slower")
    return f"{where}: {verb} {a.answer}{call}, {hosts}{hidden}."


def _error(a) -> str:
    return "unbounded" if a.error_pct is None else f"{a.error_pct:.0f} %"


def _priced_on(c, backend: str) -> str:
    """'priced as hosts like this one: 2 cores, gloo on CPU' (your cluster's probe named where given)."""
    compute = c.compute_hosts[0] if c.compute_hosts else None
    here = f"{compute.cores:g} cores, {backend}" if compute is not None else backend
    if c.transport_from_cluster:
        probed = c.transport_hosts[0] if c.transport_hosts else None
        theirs = f" ({probed.cores:g} cores per host, {probed.cpu_model})" if probed is not None else ""
        return f"priced with your cluster's transport probe{theirs} and compute measured on hosts like this one: {here}"
    return f"priced as hosts like this one: {here}"


def _and(items: list) -> str:
    items = [str(x) for x in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def place(r: recommend.Recommendation) -> str:
    """'loopback', '1 Gbit/s', or 'loopback, compiled' for a cell of compiled trials."""
    return decision.place(r)


def _trials_saved(recs: list[recommend.Recommendation], sweep: Sweep) -> str:
    """' Adaptive seeds: 14 trials of 25 ...' (nothing for a fixed grid of seeds)."""
    rule = sweep.rule
    if rule.looks == 1:
        return ""
    everyone = sum(len(r.candidates) for r in recs) * rule.max_seeds
    return (f" Adaptive seeds ({rule.min_seeds} to {rule.max_seeds}): {len(sweep.trials)} trials, "
            f"{everyone - len(sweep.trials)} fewer than {rule.max_seeds} seeds for every configuration "
            f"({everyone}).")


_RULE = ("Time to target: training seconds (the sum of measured step times, eval excluded) until "
         "the eval loss first reaches allreduce's final eval loss at the same world size, link and "
         "seed plus {tolerance:.0%}. Quality verdict of a configuration's paired eval-loss gap to "
         "allreduce: matches (its interval within +{tolerance:.0%}), worse (wholly beyond it: listed "
         "under avoid), undecided (the interval holds +{tolerance:.0%}: listed as open, with what "
         "would decide it), nan / failed. The interval: {rule}. The recommendation ranks by speed-up "
         "against allreduce among configurations whose every trial ended ok and that match; then by "
         "throughput, then bytes. Two configurations are compared on the seeds both ran only. A "
         "configuration is called faster only by more than the spread of the times (step-time IQR, "
         "seed scatter); otherwise it is the same speed here and allreduce is kept.")


def rule_text(sweep: Sweep) -> str:
    return _RULE.format(tolerance=sweep.tolerance, rule=sweep.rule.text())


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------

_COLUMNS = [  # (header, metric, formatter of the mean, formatter of the std)
    ("time to target (s)", "time_to_target_s", lambda v: f"{v:.2f}", lambda v: f"{v:.2f}"),
    ("final eval loss", "final_eval_loss", lambda v: f"{v:.4g}", lambda v: f"{v:.2g}"),
    ("final loss", "final_loss", lambda v: f"{v:.4g}", lambda v: f"{v:.2g}"),
    (f"loss gap to {BASELINE_HOOK}", "loss_gap", lambda v: f"{v:+.3g}", lambda v: f"{v:.2g}"),
    ("eval accuracy", "final_eval_accuracy", lambda v: f"{v:.3f}", lambda v: f"{v:.3f}"),
    ("samples/s", "samples_per_s", lambda v: f"{v:,.0f}", lambda v: f"{v:,.0f}"),
    ("step ms (median)", "step_time_ms_median", lambda v: f"{v:.1f}", lambda v: f"{v:.1f}"),
    ("step ms IQR", "step_time_ms_iqr", lambda v: f"{v:.1f}", lambda v: f"{v:.1f}"),
    ("bytes/step", "comm_bytes_per_step", format_bytes, format_bytes),
    ("compression", "compression_ratio", lambda v: f"{v:.2f}x", lambda v: f"{v:.2f}"),
    ("hook ms", "hook_time_ms", lambda v: f"{v:.2f}", lambda v: f"{v:.2f}"),
    # a periodic hook's exchange (post_local_sgd, diloco): shown where some configuration has one
    ("syncs", "syncs", lambda v: f"{v:.0f}", lambda v: f"{v:.0f}"),
    ("sync ms (median)", "sync_ms", lambda v: f"{v:.1f}", lambda v: f"{v:.1f}"),
    ("replica drift (max |θ_r − θ̄|)", "replica_drift", lambda v: f"{v:.3g}", lambda v: f"{v:.2g}"),
    # an fsdp trial's bytes split by collective (search.parallelism: fsdp), and what a rank holds
    ("reduce-scatter bytes/step", "reduce_scatter_bytes_per_step", format_bytes, format_bytes),
    ("all-gather bytes/step", "all_gather_bytes_per_step", format_bytes, format_bytes),
    ("memory/rank (MB)", "memory_per_rank_mb", lambda v: f"{v:.3g}", lambda v: f"{v:.2g}"),
]
# shown where some configuration recorded them: a periodic hook's exchange, fsdp's collectives,
# the memory (sweeps recorded before it have none)
_WHERE_ANY = ("syncs", "sync_ms", "replica_drift", "reduce_scatter_bytes_per_step", "all_gather_bytes_per_step",
              "memory_per_rank_mb")


def _cell(row: SummaryRow, metric: str, fmt, fmt_std) -> str:
    mean, std, n = row.stats.get(metric, (math.nan, math.nan, 0))
    if n == 0:
        return ""
    if metric == "loss_gap" and row.hook == BASELINE_HOOK and not row.hook_params:
        return "baseline"
    return fmt(mean) + (f" ± {fmt_std(std)}" if n > 1 and std > 0 else "")


def _states_text(row: SummaryRow) -> str:
    return ", ".join(f"{n} {s}" if n > 1 or len(row.states) > 1 else s
                     for s, n in sorted(row.states.items()))


def _versus_cells(c: recommend.Candidate | None, rec: recommend.Recommendation | None,
                  part: str) -> list[str]:
    """Against fp32 allreduce and the best 16-bit hook of the same world size and link: the
    time-to-target speed-up (``part`` speed) or the paired eval-loss gap (quality)."""
    if c is None or rec is None:
        return ["", ""]
    cells = []
    for ref, gap in ((rec.baseline, c.gap), (rec.best_16bit, c.gap_16bit)):
        if ref is None:
            cells.append("")
        elif ref is c:
            cells.append("ref")
        elif part == "speed":  # on the seeds both ran
            up = recommend.speedup(c, ref)
            cells.append(f"{up:.2f}x" if math.isfinite(up) else "")
        else:
            cells.append(gap.text() if gap else "")
    return cells


def _candidate_of(row: SummaryRow, recs: list[recommend.Recommendation]
                  ) -> tuple[recommend.Candidate | None, recommend.Recommendation | None]:
    rec = next((r for r in recs if (r.world_size, r.link, r.compiled) == (row.world_size, row.link, row.compiled)),
               None)
    return (next((c for c in rec.candidates if c.config == row.config), None) if rec else None), rec


def _verdict(row: SummaryRow, recs: list[recommend.Recommendation]) -> str:
    candidate, _ = _candidate_of(row, recs)
    return candidate.verdict.value if candidate is not None else ""


# The summary is two tables that each fit a page: quality (the verdicts) and speed.
_PARTS = {
    "quality": (["final_eval_loss", "final_loss", "loss_gap", "final_eval_accuracy"],
                ["eval-loss gap vs allreduce (CI)", "eval-loss gap vs best 16-bit (CI)"]),
    "speed": (["time_to_target_s", "samples_per_s", "step_time_ms_median", "step_time_ms_iqr",
               "comm_bytes_per_step", "compression_ratio", "hook_time_ms", *_WHERE_ANY],
              ["speed-up vs allreduce", "speed-up vs best 16-bit"]),
}


def table_cells(rows: list[SummaryRow], recs: list[recommend.Recommendation], part: str
                ) -> tuple[list[str], list[list[str]]]:
    """The ``part`` ("quality" or "speed") table of the summary: its header and rows."""
    metrics, versus = _PARTS[part]
    metrics = [m for m in metrics if m not in _WHERE_ANY or any(r.stats.get(m, (0, 0, 0))[2] for r in rows)]
    columns = [c for m in metrics for c in _COLUMNS if c[1] == m]
    lead = (["seeds", "status", "verdict"] if part == "quality" else [])
    header = ["configuration", "world size", "link"] + lead + [c[0] for c in columns] + versus
    body = []
    for r in rows:
        cells = [r.config, str(r.world_size), r.link]
        cells += [str(len(r.seeds)), _states_text(r), _verdict(r, recs)] if part == "quality" else []
        cells += [_cell(r, metric, fmt, fmt_std) for _, metric, fmt, fmt_std in columns]
        body.append(cells + _versus_cells(*_candidate_of(r, recs), part))
    return header, body


def write_summary_csv(rows: list[SummaryRow], recs: list[recommend.Recommendation], path: Path) -> None:
    """Machine-readable: the quality verdict, the seeds used (space-separated), every mean and
    std as its own column (empty when not recorded)."""
    metrics = [c[1] for c in _COLUMNS] + list(_CSV_ONLY)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["configuration", "hook", "hook_params", "world_size", "link", "verdict", "seeds",
                         "trials", "ok", "nan", "failed", "other", "speedup_vs_baseline"]
                        + [f"{m}_{s}" for m in metrics for s in ("mean", "std")])
        for r in rows:
            other = sum(n for s, n in r.states.items() if s not in ("ok", "nan", "failed"))
            values = []
            for m in metrics:
                mean, std, n = r.stats.get(m, (math.nan, math.nan, 0))
                values += [repr(mean) if n else "", repr(std) if n > 1 else ""]
            writer.writerow([r.config, r.hook,
                             ";".join(f"{k}={v}" for k, v in sorted(r.hook_params.items())),
                             r.world_size, r.link, _verdict(r, recs), " ".join(map(str, r.seeds)),
                             len(r.run_ids),
                             r.states.get("ok", 0), r.states.get("nan", 0),
                             r.states.get("failed", 0), other, _speedup(r, recs)] + values)


# Per trial, in summary.csv only: the step time paired with the baseline's in the same trial
# (service/train/paired_timing.py; > 1 slower) and its spread, the load the trial ran under.
_CSV_ONLY = ("step_ratio_vs_baseline", "step_ratio_vs_baseline_iqr", "load_avg_1m", "cpu_share",
             "first_nan_step")


def _speedup(row: SummaryRow, recs: list[recommend.Recommendation]) -> str:
    """The baseline's time to target over this configuration's on the seeds both ran (paired
    when the trials timed the baseline); empty when either never reached it."""
    c, rec = _candidate_of(row, recs)
    up = recommend.speedup(c, rec.baseline) if c is not None and rec.baseline is not None else math.nan
    return repr(up) if math.isfinite(up) else ""


def summary_markdown(sweep: Sweep, rows: list[SummaryRow], recs: list[recommend.Recommendation], scale) -> str:
    """summary.md's top: the headline (from the sweep's answer), how it was priced, then the
    quality and speed tables (``scale``: service/report/projected.py's Projected)."""
    lines = [f"# Sweep `{sweep.experiment}` — parent run `{sweep.parent_run_id}`", ""]
    answer = scale.answer or decision.sweep_answer(recs)
    lines += [f"- **{line}**" for line in headline(answer, sweep, _hidden(scale))]
    lines += ["", "### How this was priced", ""] + [f"- {line}" for line in how_priced(scale, sweep, recs)]
    for part in _PARTS:
        header, body = table_cells(rows, recs, part)
        lines += ["", f"## {part.capitalize()}", "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in body]
    lines += ["", f"Metrics average the trials that ended ok (mean ± std over seeds). "
              f"Loss gap = final loss minus {BASELINE_HOOK}'s at the same world size and seed. "
              f"{rule_text(sweep)}{shared_knobs_text(sweep)}", ""]
    return "\n".join(lines)


def _hidden(scale) -> float | None:
    return scale.pricing.hidden_above_gbps() if scale.pricing is not None else None


def how_priced(scale, sweep: Sweep, recs: list[recommend.Recommendation]) -> list[str]:
    """The headline's figures' basis, one line each: the cluster cell as projected (its band and
    runner-up), the compute's and the transport's hosts, the links the hosts hide, the rule,
    the seeds adaptive sampling saved, where the answer is kept."""
    from service.answer.pricing import compute_hosts, hosts_text

    lines = [scale.cluster] if scale.cluster else []
    if scale.pricing is not None and scale.bases:
        p = scale.pricing
        lines.append(f"Compute: each configuration's own trials' recorded steps, measured on "
                     f"{hosts_text(compute_hosts(t for b in scale.bases for t in b.timelines))}; "
                     f"{p.transport_source()}; latency {1000 * p.latency_ms:g} µs per message.")
        hidden = p.hidden_above_gbps()
        if hidden is not None:
            lines.append(f"These hosts' gloo moves an allreduce's bytes at about {hidden:.2g} Gbit/s of CPU work: on a "
                         "faster link their own cost hides the link's, so the map's dotted cells change nothing "
                         "with the link speed.")
    lines.append("The rule: the fastest configuration to target is the answer only when it beats every other by "
                 f"more than that pair's error (measured: the paired step times' spread; projected: the pair's "
                 f"error band and the seeds' and probe's spread); otherwise {BASELINE_HOOK} is kept.")
    saved = _trials_saved(recs, sweep).strip()
    if saved:
        lines.append(saved)
    lines.append(f"The same answer, machine-readable: {decision.ARTIFACT} on the parent run.")
    return lines


def shared_knobs_text(sweep: Sweep) -> str:
    """' Every trial ran with DDP's bucket_cap_mb=1 …' (' Every trial compiled its model …') where
    every trial shares knobs off their defaults: the names leave out a knob no two configurations differ in."""
    settings = {json.dumps(t.record.knobs, sort_keys=True) for t in sweep.trials}
    if len(settings) != 1:
        return ""
    off = {k: v for k, v in json.loads(settings.pop()).items() if v != KNOB_DEFAULTS.get(k, v)}
    compiled = (" Every trial compiled the module inside DDP (torch.compile; the reducer and the hook stay eager)."
                if off.pop("compile", False) else "")
    return (f" Every trial ran with DDP's {', '.join(f'{k}={v}' for k, v in off.items())}." if off else "") + compiled


# --------------------------------------------------------------------------------------------
# report.html
# --------------------------------------------------------------------------------------------

_TEMPLATES = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
                                autoescape=True, trim_blocks=True, lstrip_blocks=True,
                                undefined=jinja2.StrictUndefined)

_CAPTIONS = {
    "loss_curves": "Training loss against step, one panel per world size; colour = hook, "
                   "line style = chunk size; bands = ±std over seeds; ✕ = trial went NaN "
                   "and stopped there, + = trial failed there.",
    "throughput": "Samples per second against world size, one line per configuration "
                  "(trials that ended ok; bars = ±std over seeds).",
    "tradeoff": "{quality} against bytes per step on the wire (per rank), each point the mean over the seeds "
                "every configuration at its world size ran (as the tables' gaps pair them). The line joins the "
                "Pareto front: the configurations worth choosing; everything else is beaten on "
                "both axes by one of them.",
    "decision_map": "Projected: the configuration that reaches the target eval loss soonest among those "
                    "whose quality matched allreduce's, per world size (global batch kept) and link speed; "
                    "hatched grey, naming both by their legend numbers, where its margin over the runner-up "
                    "is inside the step model's measured error band and the spread of its trials' own "
                    "timelines (too close to call: no winner's colour); circles and triangles mark where trials ran, the star "
                    "report.cluster.",
}


def _number(value: float, fmt: str) -> str:
    return fmt.format(value) if math.isfinite(value) else ""


def render_html(sweep: Sweep, rows: list[SummaryRow], recs: list[recommend.Recommendation],
                images: dict[str, Path], quality_metric: str, scale) -> str:
    """report.html: self-contained (images inline as data URIs), from templates/report.html.j2;
    ``scale``: the projected half (service/report/projected.py's Projected)."""
    from service.report import transport_table  # imports hooks (torch): only when a report is built
    from service.report import projection_table
    from service.report.projected import EMPTY
    picks = {(r.choice.config, r.world_size, r.link) for r in recs if r.choice is not None}
    quality = "Final eval accuracy" if quality_metric == "final_eval_accuracy" else "Final loss"
    summary = []
    for part in _PARTS:
        header, body = table_cells(rows, recs, part)
        summary.append({"part": part, "header": header, "rows": [
            {"cells": cells, "pick": (row.config, row.world_size, row.link) in picks,
             "status": None if row.all_ok else next(s for s in row.states if s != "ok")}
            for row, cells in zip(rows, body)]})
    trials = [{"name": t.run_name, "state": t.state, "run_id": t.run_id, "nan_source": t.nan_source or "",
               "final_loss": _number(t.metric("final_loss"), "{:.4g}"),
               "accuracy": _number(t.metric("final_eval_accuracy"), "{:.3f}"),
               "first_nan": _number(t.metric("first_nan_step"), "{:.0f}"),
               "error": ((t.error or "").strip().splitlines() or [""])[-1][:200]}
              for t in sweep.runs or sweep.trials]  # one row per MLflow run (a split sweep's too)
    images_ = [{"id": name, "title": name.replace("_", " ").capitalize(),
                "data": base64.b64encode(path.read_bytes()).decode(),
                "caption": _CAPTIONS.get(name, "").format(quality=quality)}
               for name, path in images.items()]
    projected = projection_table.table(scale.cells) if scale.cells else None
    return _TEMPLATES.get_template("report.html.j2").render(
        sweep=sweep, states=sorted(Counter(t["state"] for t in trials).items()),
        headline=headline(scale.answer or decision.sweep_answer(recs), sweep, _hidden(scale)), how_priced=how_priced(scale, sweep, recs),
        recs=recs, rule=rule_text(sweep),
        baseline=BASELINE_HOOK, place=place, summary=summary, images=images_, trials=trials,
        projection_header=projected[0] if projected else None,
        projection_rows=projected[1] if projected else None, projection_note=projection_table.note(scale.latency_ms, latency_from=scale.pricing.latency_from if scale.pricing else "report.project.latency_ms"),
        projection_empty=EMPTY, compiled_note=scale.compiled_note, cluster=scale.cluster, refusals=projection_table.refusals(scale.cells),
        transport=transport_table.table(scale.transport), transport_heading=transport_table.HEADING,
        transport_missing=transport_table.not_measured(scale.transport_failure),
        transport_failed=bool(scale.transport_failure),
        plan=plan_section.html_parts(plan_section.markdown(scale.plan, *scale.plan_at,
                                                             cluster_winner=scale.cluster_winner)),
        local_store=uris.tracking_store(sweep.tracking_uri).kind == "sqlite",
        generated=f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}")
