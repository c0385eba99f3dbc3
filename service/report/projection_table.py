"""The projection as the report shows it: a cell's figures in words, the table of every
configuration's projected time to target, the bands and the note on what it assumes (the
figures themselves: service/answer/projection.py)."""

from __future__ import annotations

import math
from typing import Optional

from service.answer.projection import Basis, CellProjection
from service.step_model.bands import ErrorBands, error_bands
from service.step_model.bands import band_text as one_band


def cell_text(p: CellProjection) -> str:
    """'41.2 s (137 ms/step)'; 'refused' (the reason: :func:`refusals`) or 'target not reached'."""
    if p.refused:
        return "refused"
    step = f"{_figure(p.step_ms)} ms/step"
    if p.time_to_target_s is None:
        return f"target not reached ({step})"
    return f"{_figure(p.time_to_target_s)} s ({step})"


def _figure(x: float) -> str:
    """Three significant figures, thousands separated: 12,345 / 137 / 41.2 / 0.0123."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def refusals(projections: list[CellProjection]) -> list[str]:
    """Why cells were refused, each reason once."""
    return list(dict.fromkeys(p.refused for p in projections if p.refused))


def table(projections: list[CellProjection]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: per configuration, its projected time to target at every cell."""
    keys = list(dict.fromkeys((p.world_size, p.link_gbps) for p in projections))
    header = ["configuration", "quality from", "step from", "error band"] + [f"W={w} @{g:g} Gbit/s" for w, g in keys]
    rows, by_config = [], {}
    for p in projections:
        by_config.setdefault(p.config, {})[(p.world_size, p.link_gbps)] = p
    for config, at in by_config.items():
        first = next(iter(at.values()))
        rows.append([config, quality_from(list(at.values())), f"W={first.basis.timeline_world_size}",
                     band_text(list(at.values()))] + [cell_text(at[k]) if k in at else "" for k in keys])
    return header, rows


def quality_from(cells: list[CellProjection]) -> str:
    """Where one configuration's cells take their quality: 'W=4', or 'W=2 at W=2; W=4 at W=8, 16'
    when some cells ran at their own W; '(not matching)' after a W whose verdict did not match."""
    by_source: dict[int, list[int]] = {}
    for p in cells:
        by_source.setdefault(p.quality.world_size, []).append(p.world_size)
    basis = cells[0].basis
    if len(by_source) == 1:
        return _verdict_at(basis, next(iter(by_source)))
    return "; ".join(f"{_verdict_at(basis, q)} at W={', '.join(str(w) for w in sorted(set(ws)))}"
                     for q, ws in sorted(by_source.items()))


def _verdict_at(basis: Basis, world_size: int) -> str:
    return f"W={world_size}" + ("" if basis.quality_at(world_size).matches else " (not matching)")


def band_text(cells: list[CellProjection]) -> str:
    """One configuration's error band over its cells, each band once with where it was checked and
    the cells that use it beyond: '-18 % (checked at W = 8, used beyond it at W = 16, 32)'; a
    second band only where cells nearer another checked W take that one's."""
    beyond_at: dict[tuple, list[int]] = {}
    for p in cells:
        if p.band is not None:
            at = beyond_at.setdefault((p.band.low_pct, p.band.high_pct, p.band.checked_w), [])
            if p.band.beyond and p.world_size not in at:
                at.append(p.world_size)
    return "; ".join(one_band(lo, hi, w, beyond_at=tuple(sorted(ws)))
                     for (lo, hi, w), ws in beyond_at.items()) or "unmeasured"


def note(latency_ms: float, bands: Optional[ErrorBands] = None, latency_from: str = "report.project.latency_ms") -> str:
    """The projection's assumptions and where its error band comes from (summary.md, report.html)."""
    bands = bands or error_bands()
    return ("Projected time to target = the configuration's crossing step (mean over its seeds, measured at the "
            "world size in 'quality from': a world size the sweep ran keeps its own, any other assumes that "
            "one's) x the step the step model (service/step_model/) prices from the trials' own recorded step "
            "timelines at that world size and link, keeping the sweep's global batch (each rank's compute at "
            "its share of it; evals left out, as in the measured time to target; latency "
            f"{1000 * latency_ms:g} µs per message, {latency_from}). Error band: (projected - "
            "measured) / measured for the hook with its error-feedback setting at the nearest checked world "
            f"size, over held-out emulated cells, {bands.provenance}; a hook the bench did not measure gets "
            "the widest band measured. docs/results.md says how to read it.")
