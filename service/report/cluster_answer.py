"""report.cluster's cell as projected (service/answer/projection.py's ``cell_answer``), in the
sentence the report's "How this was priced" block says it: its time to target, error band and
runner-up."""

from __future__ import annotations

from typing import Optional

from service.answer.projection import CellProjection, CellWinner
from service.report.projection_table import cell_text


def cluster_text(cluster, cell: Optional[CellWinner], refused: str = "") -> str:
    """:func:`cluster_cell`'s answer as the headline says it."""
    if cell is None and not refused:
        return ""
    where = (f"Projected for W={cluster.world_size} on {cluster.link_gbps:g} Gbit/s at "
             f"{1000 * cluster.latency_ms:g} µs per message (report.cluster)")
    if refused:
        return f"{where}: not priced: {refused}."
    return _cluster_text(where, cell)


def _spread(p: CellProjection) -> str:
    """What the decision's spread spans besides the pair's band."""
    return "the seeds' and the transport probe's spread" if p.quartile_steps_ms else "the seeds' spread"


def _cluster_text(where: str, cell: CellWinner) -> str:
    if cell.winner is None:
        return f"{where}: no configuration that matched the baseline's quality reached the target."
    w = cell.winner
    band = "unmeasured" if w.band is None else w.band.described()
    text = f"{where}: {w.config}, {cell_text(w)} to the target, error band {band}"
    if cell.runner_up is not None:
        r = cell.runner_up
        text += f"; runner-up {r.config} {r.time_to_target_s / w.time_to_target_s - 1:+.0%}"
        if cell.band is not None:
            text += (f" ({'too close to call' if cell.too_close else 'decided'}: the pair's ratio error "
                     f"{cell.band.described()}, {'measured' if cell.band.measured else 'not measured'}, and {_spread(w)})")
    return text + f"; quality from W={w.quality.world_size}."
