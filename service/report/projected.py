"""The report's projected half: the sweep's configurations at ``report.project``'s cells
(projection.csv, the table), at ``report.cluster`` (the headline) and over the decision map's grid
(decision_map.png), all through service/answer/projection.py's one step model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from service.answer import compute, decision, plan, pricing
from service.report import cluster_answer, decision_map, plan_section, projection_table, transport_table

from service.answer import projection
from service.answer.projection import Basis, CellProjection
from service.step_model.transport import TransportFit


@dataclass
class Projected:
    bases: list[Basis]
    cells: list[CellProjection] = field(default_factory=list)   # report.project's cells, then report.cluster's
    cluster: str = ""                                          # the headline's projected sentence
    image: Optional[Path] = None                               # decision_map.png, when anything was priced
    csv: Optional[Path] = None                                 # projection.csv
    latency_ms: float = 0.0                                    # every projected cell's (pricing.Pricing)
    transport: Optional[TransportFit] = None                   # the sweep's transport.json, when measured
    transport_failure: Optional[str] = None                    # else why its probe failed, when it did
    plan: Optional[plan.PlanAnswer] = None              # the per-bucket plan for plan_at's cell
    plan_at: tuple = (None, "report.cluster")                  # (its cell, where the cell came from)
    compiled_note: str = ""                                    # COMPILED_NOTE where some trial compiled
    cluster_winner: Optional[str] = None                       # the one rule's answer at plan_at's cell
    pricing: Optional[pricing.Pricing] = None                   # how every projected figure was priced
    answer: Optional[decision.SweepAnswer] = None               # the sweep's answer (answer.json)
    map_cells: dict = field(default_factory=dict)              # (W, link) -> the map's CellWinner

    def markdown(self) -> str:
        lines = ["", "## Projected time to target at scale", ""]
        if not self.cells:  # a failed probe still says why (the trials may have recorded nothing to price)
            lines += [EMPTY, ""] + ([self.compiled_note, ""] if self.compiled_note else [])
            lines += transport_table.markdown(None, self.transport_failure) if self.transport_failure else []
            return "\n".join(lines)
        header, rows = projection_table.table(self.cells)
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        lines += [""] + [f"Refused: {why}." for why in projection_table.refusals(self.cells)]
        lines += ["", projection_table.note(self.latency_ms, latency_from=self.pricing.latency_from if self.pricing else "report.project.latency_ms"), ""] + ([self.compiled_note, ""] if self.compiled_note else [])
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
    """Everything projected for ``sweep`` (data.Sweep) with its ``recs``, answered once by
    service/answer/compute.py and rendered here, files written to ``out_dir``; ``plan_at``: (the
    per-bucket plan's cell, 'search.plan' or 'report.cluster'), default report.cluster's."""
    plan_at = plan_at or (report_cfg.cluster, "report.cluster")
    a = compute.answer_sweep(sweep, recs, reader, report_cfg, plan_at[0])
    price = a.pricing
    failure = None if price.sweep_transport is not None else reader.transport_failure(sweep.parent_run_id)
    out = Projected(a.bases, a.cells, latency_ms=price.latency_ms, transport=price.sweep_transport,
                    transport_failure=failure, plan=a.plan, plan_at=plan_at, cluster_winner=a.plan_cell_answer,
                    pricing=price, answer=a.answer, map_cells=a.map_cells,
                    compiled_note=COMPILED_NOTE if any(t.compiled for t in sweep.trials) else "")
    if not a.bases:
        return out
    out.csv = projection.write_csv(a.cells, out_dir / projection.CSV)
    out.cluster = cluster_answer.cluster_text(report_cfg.cluster, a.cluster_cell, a.cluster_refused)
    measured = sorted({(t.world_size, (t.timing or t).record.link_gbps) for t in sweep.trials if t.state == "ok"},
                      key=lambda m: (m[0], m[1] or 0))
    cluster = report_cfg.cluster
    star = None if cluster is None else (cluster.world_size, cluster.link_gbps)
    out.image = decision_map.plot(a.map_cells, measured, out_dir / decision_map.IMAGE, title=title, cluster=star,
                                  quality_from=decision_map.quality_note(a.bases, price.latency_ms) + "\n"
                                  + price.transport_source(), here=a.answer.measured,
                                  hidden_above_gbps=price.hidden_above_gbps())
    return out
