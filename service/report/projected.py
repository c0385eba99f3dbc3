"""The report's projected half: the sweep's configurations at ``report.project``'s cells
(projection.csv, the table), at ``report.cluster`` (the headline) and over the decision map's grid
(decision_map.png), all through service/answer/projection.py's one step model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from service.answer import decision, plan, pricing
from service.report import cluster_answer, decision_map, plan_section, transport_table

from service.answer import projection
from service.answer.projection import Basis, CellProjection
from service.step_model.transport import TransportFit


@dataclass
class Projected:
    bases: list[Basis]
    cells: list[CellProjection] = field(default_factory=list)   # report.project's cells
    cluster: str = ""                                          # the headline's projected sentence
    image: Optional[Path] = None                               # decision_map.png, when anything was priced
    csv: Optional[Path] = None                                 # projection.csv
    latency_ms: float = 0.0                                    # report.project's, every cell priced at it
    transport: Optional[TransportFit] = None                   # the sweep's transport.json, when measured
    transport_failure: Optional[str] = None                    # else why its probe failed, when it did
    plan: Optional[plan.PlanAnswer] = None              # the per-bucket plan for plan_at's cell
    plan_at: tuple = (None, "report.cluster")                  # (its cell, where the cell came from)
    compiled_note: str = ""                                    # COMPILED_NOTE where some trial compiled
    cluster_winner: Optional[str] = None                       # what the cluster's answer names, at plan_at's cell
    pricing: Optional[pricing.Pricing] = None                   # how every projected figure was priced
    answer: Optional[decision.SweepAnswer] = None               # the sweep's answer (answer.json)
    map_cells: dict = field(default_factory=dict)              # (W, link) -> the map's CellWinner

    def markdown(self) -> str:
        lines = ["", "## Projected time to target at scale", ""]
        if not self.cells:
            lines += [EMPTY, ""] + ([self.compiled_note, ""] if self.compiled_note else [])
            return "\n".join(lines)
        header, rows = projection.table(self.cells)
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        lines += [""] + [f"Refused: {why}." for why in projection.refusals(self.cells)]
        lines += ["", projection.note(self.latency_ms, latency_from=self.pricing.latency_from if self.pricing else "report.project.latency_ms"), ""] + ([self.compiled_note, ""] if self.compiled_note else [])
        lines += transport_table.markdown(self.transport, self.transport_failure)
        if self.cluster:
            lines += [self.cluster, ""]
        lines += plan_section.markdown(self.plan, *self.plan_at, cluster_winner=self.cluster_winner)
        return "\n".join(lines)


# Why a compiled trial is not projected (service/train/setup.py samples no timeline for it).
COMPILED_NOTE = ("Compiled trials (search.compile, workload.compile) record no step timeline, so they are not "
                 "projected: its compute windows time the bare module, eager, which is not the compiled model's "
                 "compute (compiled, the bare module would need compilations of its own, at two batch sizes).")
EMPTY = ("No trial recorded a step timeline (tracking.timeline_steps: 0, or a sweep from before it was "
          "recorded): there is nothing to project from.")


def projected(sweep, recs, reader, report_cfg, out_dir: Path, title: str = "", plan_at=None) -> Projected:
    """Everything projected for ``sweep`` (data.Sweep) with its ``recs``, files written to ``out_dir``;
    ``plan_at``: (the per-bucket plan's cell, 'search.plan' or 'report.cluster'), default report.cluster's.
    Every part priced one way (service/answer/pricing.py) and decided by one rule."""
    bases = projection.bases(sweep.trials, recs, reader.step_timeline)
    price = pricing.pricing(reader, sweep.parent_run_id, report_cfg)
    failure = None if price.sweep_transport is not None else reader.transport_failure(sweep.parent_run_id)
    out = Projected(bases, latency_ms=price.latency_ms, transport=price.sweep_transport, transport_failure=failure,
                    plan_at=plan_at or (report_cfg.cluster, "report.cluster"), pricing=price,
                    compiled_note=COMPILED_NOTE if any(t.compiled for t in sweep.trials) else "")
    if not bases:
        out.answer = decision.sweep_answer(recs, report_cfg.cluster, None, "nothing was projected", price, bases)
        return out
    global_batch = max(b.global_batch for b in bases)
    sizes, links = projection.cells(report_cfg.project, global_batch)
    out.cells = projection.project(bases, sizes, links, price.latency_ms, transport=price.transport)
    cluster = report_cfg.cluster
    if cluster is not None and (cluster.world_size not in sizes or cluster.link_gbps not in links):
        # the cluster's cell has its rows too: projection.csv says the headline's answer there
        out.cells += projection.project(bases, [cluster.world_size], [cluster.link_gbps], price.latency_ms,
                                        transport=price.transport)
    out.csv = projection.write_csv(out.cells, out_dir / projection.CSV)
    answered, refused = cluster_answer.cluster_cell(bases, report_cfg.cluster, transport=price.transport)
    out.answer = decision.sweep_answer(recs, report_cfg.cluster, answered, refused, price, bases)
    out.cluster = cluster_answer.cluster_text(report_cfg.cluster, answered, refused)
    cell = out.plan_at[0]
    at_plan = answered if _same_cell(cell, report_cfg.cluster) else cluster_answer.cluster_cell(
        bases, cell, transport=price.transport)[0]
    if at_plan is not None and at_plan.winner is not None:
        out.cluster_winner = at_plan.winner.config   # the plan section names the same answer first
    out.plan = plan.answer(bases, cell, price.transport,
                           measured=None if cell is None else plan.measured_steps(sweep.trials, cell))
    grid = out.map_cells = decision_map.winners(bases, decision_map.map_world_sizes(global_batch), price.latency_ms,
                                                transport=price.transport)
    measured = sorted({(t.world_size, (t.timing or t).record.link_gbps) for t in sweep.trials if t.state == "ok"},
                      key=lambda m: (m[0], m[1] or 0))
    star = None if cluster is None else (cluster.world_size, cluster.link_gbps)
    out.image = decision_map.plot(grid, measured, out_dir / decision_map.IMAGE, title=title, cluster=star,
                                  quality_from=decision_map.quality_note(bases, price.latency_ms) + "\n"
                                  + price.transport_source(), here=out.answer.measured,
                                  hidden_above_gbps=price.hidden_above_gbps())
    return out


def _same_cell(a, b) -> bool:
    """Two cells (report.cluster's, search.plan's) at the same W, link and latency."""
    key = lambda c: None if c is None else (c.world_size, c.link_gbps, c.latency_ms)  # noqa: E731
    return a is not None and key(a) == key(b)
