"""A sweep's answer, computed once: every configuration's basis, the one pricing, report.project's
and report.cluster's cells, the decision map's grid, the per-bucket plan and the answer itself
(decision.py), each decided by the one rule. service/report/ renders what this returns; nothing
there decides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from service.answer import decision, plan, pricing, projection
from service.answer.projection import Basis, CellProjection, CellWinner


@dataclass
class Answered:
    bases: list[Basis]
    pricing: pricing.Pricing
    answer: decision.SweepAnswer
    cells: list[CellProjection] = field(default_factory=list)      # report.project's cells, then report.cluster's
    cluster_cell: Optional[CellWinner] = None                     # report.cluster's answer
    cluster_refused: str = ""                                     # why report.cluster's cell was not priced
    map_cells: dict = field(default_factory=dict)                 # (W, link) -> the decision map's CellWinner
    plan: Optional[plan.PlanAnswer] = None                        # the per-bucket plan at plan_at's cell
    plan_cell_answer: Optional[str] = None                        # the one rule's answer at that cell


def answer_sweep(sweep, recs: list, reader, report_cfg, plan_at=None) -> Answered:
    """``sweep`` (data.Sweep) with its measured ``recs`` answered, read through ``reader``;
    ``plan_at``: the per-bucket plan's cell (default report.cluster's)."""
    bases = projection.bases(sweep.trials, recs, reader.step_timeline)
    price = pricing.pricing(reader, sweep.parent_run_id, report_cfg)
    cluster = report_cfg.cluster
    if not bases:
        return Answered(bases, price, decision.sweep_answer(recs, cluster, None, "nothing was projected", price))
    global_batch = max(b.global_batch for b in bases)
    sizes, links = projection.cells(report_cfg.project, global_batch)
    cells = projection.project(bases, sizes, links, price.latency_ms, transport=price.transport)
    if cluster is not None and (cluster.world_size not in sizes or cluster.link_gbps not in links):
        # the cluster's cell has its rows too: projection.csv says the headline's answer there
        cells += projection.project(bases, [cluster.world_size], [cluster.link_gbps], price.latency_ms,
                                    transport=price.transport)
    at_cluster, refused = projection.cell_answer(bases, cluster, transport=price.transport)
    plan_cell = plan_at if plan_at is not None else cluster
    at_plan = at_cluster if _same_cell(plan_cell, cluster) else projection.cell_answer(
        bases, plan_cell, transport=price.transport)[0]
    measured = None if plan_cell is None else plan.measured_steps(sweep.trials, plan_cell)
    grid = projection.grid_answers(bases, projection.map_world_sizes(global_batch), price.latency_ms,
                                   transport=price.transport)
    return Answered(bases, price, decision.sweep_answer(recs, cluster, at_cluster, refused, price, bases), cells,
                    at_cluster, refused, grid, plan.answer(bases, plan_cell, price.transport, measured=measured),
                    at_plan.winner.config if at_plan is not None and at_plan.winner is not None else None)


def _same_cell(a, b) -> bool:
    """Two cells (report.cluster's, search.plan's) at the same W, link and latency."""
    key = lambda c: None if c is None else (c.world_size, c.link_gbps, c.latency_ms)  # noqa: E731
    return a is not None and key(a) == key(b)
