"""The headline's projected half: report.cluster's cell priced (service/answer/projection.py's
:func:`~service.answer.projection.project_cell` for every basis) and decided by its
:func:`~service.answer.projection.winner`, in the sentence the headline says it."""

from __future__ import annotations

from typing import Optional

from service.answer.projection import Basis, CellProjection, CellWinner, cell_text, project_cell, winner
from service.step_model.bands import ErrorBands
from service.step_model.pairs import PairBands
from service.step_model.transport import TransportFit


def cluster_cell(bases_: list[Basis], cluster, bands: Optional[ErrorBands] = None,
                 transport: Optional[TransportFit] = None,
                 pairs: Optional[PairBands] = None) -> tuple[Optional[CellWinner], str]:
    """``report.cluster``'s cell as the headline answers it: (its :func:`winner`, ''), or (None,
    why it was not priced); (None, '') without a cluster. The plan section names this winner."""
    if cluster is None or not bases_:
        return None, ""
    at = [project_cell(b, cluster.world_size, cluster.link_gbps, cluster.latency_ms, bands, transport) for b in bases_]
    refused = next((p.refused for p in at if p.refused), "")
    return (None, refused) if refused else (winner(at, pairs), "")


def cluster_answer(bases_: list[Basis], cluster, bands: Optional[ErrorBands] = None,
                   transport: Optional[TransportFit] = None, pairs: Optional[PairBands] = None) -> str:
    """The headline's projected half: 'projected for W=64 on 10 Gbit/s: ...' (empty without a cluster)."""
    return cluster_text(cluster, *cluster_cell(bases_, cluster, bands, transport, pairs))


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
