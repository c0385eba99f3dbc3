"""The projection's decisions scored against measurement (bench/projection.py):
per held-out (W, link) cell, the hooks ranked by projected and by measured step.

* regret: the measured step of the projected winner against the measured best, %;
* Kendall tau between the two rankings (tau-b: ties in either count as neither order);
* compress-or-not: is "some compressing hook beats allreduce" predicted right; judged only where
  the measured gap between the best compressing hook and allreduce exceeds ``decisive`` (10 %);
* close calls: a cell is hatched when the projected winner's worst (its projection at the band's
  low end) reaches the runner-up's best (at the band's high end), as the report draws it; a
  hatched cell is right when the two measured steps are within that band of each other, a
  decided one when its winner is the measured winner.

Pure Python over the rows of bench/_projection_rows.py (``hook``, ``projected_ms``, ``measured_ms``).
"""

from __future__ import annotations

import itertools
from typing import Optional

BASELINE = "allreduce"
DECISIVE = 0.10


def kendall_tau(a: dict[str, float], b: dict[str, float]) -> Optional[float]:
    """Kendall's tau-b between two scorings of the same keys; None with fewer than two keys."""
    keys = sorted(set(a) & set(b))
    concordant = discordant = ties_a = ties_b = 0
    for x, y in itertools.combinations(keys, 2):
        da, db = a[x] - a[y], b[x] - b[y]
        if da == 0 and db == 0:
            continue
        if da == 0:
            ties_a += 1
        elif db == 0:
            ties_b += 1
        elif (da > 0) == (db > 0):
            concordant += 1
        else:
            discordant += 1
    n = concordant + discordant
    denominator = ((n + ties_a) * (n + ties_b)) ** 0.5
    return (concordant - discordant) / denominator if denominator else None


def _compress_right(projected: dict[str, float], measured: dict[str, float], decisive: float) -> Optional[bool]:
    others = [h for h in measured if h != BASELINE]
    if BASELINE not in measured or not others:
        return None
    best = min(others, key=measured.get)
    if abs(measured[best] / measured[BASELINE] - 1) <= decisive:
        return None  # too close for the decision to matter
    predicted = min(projected[h] for h in others) < projected[BASELINE]
    return predicted == (measured[best] < measured[BASELINE])


def _close_call(projected: dict[str, float], measured: dict[str, float], band: tuple[float, float]):
    """(hatched, right) for the projected winner and runner-up under ``band`` (low %, high %)."""
    low, high = band
    first, second = sorted(projected, key=projected.get)[:2]
    hatched = projected[first] / (1 + low / 100) >= projected[second] / (1 + high / 100)
    if hatched:
        gap = measured[first] / measured[second] - 1
        return True, low / 100 - high / 100 <= gap <= high / 100 - low / 100
    return False, first == min(measured, key=measured.get)


def score_cell(rows: list[dict], band: tuple[float, float], decisive: float = DECISIVE) -> Optional[dict]:
    """One cell's scores from its counted rows (one per hook); None with fewer than two hooks."""
    projected = {r["hook"]: r["projected_ms"] for r in rows}
    measured = {r["hook"]: r["measured_ms"] for r in rows}
    if len(projected) < 2:
        return None
    winner = min(projected, key=projected.get)
    hatched, close_right = _close_call(projected, measured, band)
    return {"projected_winner": winner, "measured_winner": min(measured, key=measured.get),
            "regret_pct": 100.0 * (measured[winner] / min(measured.values()) - 1),
            "kendall_tau": kendall_tau(projected, measured),
            "compress_right": _compress_right(projected, measured, decisive),
            "hatched": hatched, "call_right": close_right}


def score(rows: list[dict], band: tuple[float, float]) -> list[dict]:
    """Every held-out (W, link) cell with at least two counted hooks, scored."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("counted"):
            cells.setdefault((r["world_size"], r["link_gbps"]), []).append(r)
    out = []
    for (w, link), mine in sorted(cells.items(), key=lambda c: (c[0][0], str(c[0][1]))):
        s = score_cell(mine, band)
        if s is not None:
            out.append({"world_size": w, "link_gbps": link, "hooks": len(mine), **s})
    return out


def totals(scored: list[dict]) -> dict:
    """The scores against the targets, over every scored cell: the share of cells whose regret
    is at most 5 %, the median tau, compress-or-not right where it was decisive, close calls right."""
    if not scored:
        return {}
    taus = sorted(c["kendall_tau"] for c in scored if c["kendall_tau"] is not None)
    decisive = [c["compress_right"] for c in scored if c["compress_right"] is not None]
    return {"cells": len(scored),
            "regret_le_5_pct": sum(c["regret_pct"] <= 5.0 for c in scored) / len(scored),
            "median_regret_pct": sorted(c["regret_pct"] for c in scored)[len(scored) // 2],
            "median_tau": taus[len(taus) // 2] if taus else None,
            "compress_right": f"{sum(decisive)}/{len(decisive)}",
            "calls_right": f"{sum(c['call_right'] for c in scored)}/{len(scored)}",
            "hatched": sum(c["hatched"] for c in scored)}
