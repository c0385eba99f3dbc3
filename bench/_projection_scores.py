"""The projection's decisions scored against measurement (bench/projection.py's held-out cells):
per counted (W, link) cell, the hooks decided by the report's own rule
(``service.step_model.pairs.decide``) and ranked by projected and by measured step.

The pair bands that decide a cell come from the *other* cells only (leave one cell out): the
scored cell's own errors never shape the band that judges it, so every score below can fail.

* decided right: of the decided cells, the share whose projected winner is the measured winner
  (target >= 90 %);
* regret: the measured step of the projected winner against the measured best, %; the share of
  cells at or under 5 % (target >= 90 %);
* Kendall tau between the two rankings (tau-b: ties in either count as neither order); its
  median over the cells (target >= 0.8);
* compress-or-not: is "some compressing hook beats allreduce" predicted right, judged where the
  measured gap between the best compressing hook and allreduce exceeds ``decisive`` (10 %);
  target: right in every such cell;
* hatched right: a hatched cell is right when the measured ratio of its two named hooks lies in
  the range their pair band gives the projected ratio (``RatioBand.measured_range``: the tie the
  band claims possible is what was measured); target >= 90 % of hatched cells;
* power: the share of random rankings that pass each score: each cell's projected steps
  shuffled among its hooks, their bands derived from their own errors and the rule applied, as
  for the model.

Pure Python over the rows of bench/_projection_rows.py (``hook``, ``projected_ms``, ``measured_ms``).
"""

from __future__ import annotations

import itertools
import random
import statistics
from typing import Optional

import _projection_pairs as pair_mod

from service.step_model.bands import error_feedback_of, sharding_in
from service.step_model.pairs import Configured, Contender, PairBands, decide

BASELINE = pair_mod.BASELINE
DECISIVE = 0.10
TARGETS = {"decided_right": 0.90, "regret_le_5_pct": 0.90, "median_tau": 0.80, "compress_right": 1.0,
           "hatched_right": 0.90}


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
    """Is "some compressing configuration beats allreduce" predicted right (allreduce: DDP's, else
    fsdp's where a cell has only fsdp's; neither compresses)?"""
    others = [h for h in measured if pair_mod.hook_of(h) != BASELINE]
    base = BASELINE if BASELINE in measured else next((h for h in measured if pair_mod.hook_of(h) == BASELINE), None)
    if base is None or not others:
        return None
    best = min(others, key=measured.get)
    if abs(measured[best] / measured[base] - 1) <= decisive:
        return None  # too close for the decision to matter
    predicted = min(projected[h] for h in others) < projected[base]
    return predicted == (measured[best] < measured[base])


def score_cell(rows: list[dict], bands: PairBands, error_feedback: bool = True,
               decisive: float = DECISIVE) -> Optional[dict]:
    """One cell's scores from its counted rows (one per configuration, by ``pair_mod.name``),
    decided under ``bands``; None with fewer than two."""
    projected = {pair_mod.name(r): r["projected_ms"] for r in rows}
    measured = {pair_mod.name(r): r["measured_ms"] for r in rows}
    if len(projected) < 2:
        return None
    w = rows[0]["world_size"]
    side = {pair_mod.name(r): Configured(r["hook"], error_feedback_of(r["hook"], {"error_feedback": error_feedback}),
                                         *sharding_in(r)) for r in rows}

    def band_of(a: str, b: str):
        return bands.for_pair(side[a], side[b], w)

    d = decide([Contender(h, p, p, p) for h, p in projected.items()], band_of)
    best = min(measured, key=measured.get)
    low, high = d.band.measured_range(projected[d.winner] / projected[d.runner_up])
    inside = low <= measured[d.winner] / measured[d.runner_up] <= high
    return {"projected_winner": d.winner, "measured_winner": best, "runner_up": d.runner_up, "decided": d.decided,
            "band": (round(d.band.low_pct, 1), round(d.band.high_pct, 1)),
            "regret_pct": 100.0 * (measured[d.winner] / measured[best] - 1),
            "kendall_tau": kendall_tau(projected, measured),
            "compress_right": _compress_right(projected, measured, decisive),
            "winner_right": d.winner == best if d.decided else None,
            "hatched_right": None if d.decided else inside}


def score(rows: list[dict], error_feedback: bool = True) -> list[dict]:
    """Every counted (W, link) cell with at least two hooks, decided under the pair bands of the
    other cells (leave one cell out) and scored."""
    cells = pair_mod.counted_cells(rows)
    out = []
    for (w, link), mine in sorted(cells.items(), key=lambda c: (c[0][0], str(c[0][1]))):
        others = [r for r in rows if (r["world_size"], r["link_gbps"]) != (w, link)]
        bands = pair_mod.pair_bands(pair_mod.pair_cells(others, error_feedback))
        s = score_cell(list(mine.values()), bands, error_feedback)
        if s is not None:
            out.append({"world_size": w, "link_gbps": link, "hooks": len(mine), **s})
    return out


def pair_calls(rows: list[dict], error_feedback: bool = True) -> dict:
    """Every pair of hooks at every counted cell decided by the rule on its own (two contenders),
    under the other cells' bands: how many pairs it decided and how many of those it ordered as
    measured; how many it left hatched and how many of those measured inside their band."""
    decided = right = hatched = inside = 0
    for (w, link), mine in pair_mod.counted_cells(rows).items():
        others = [r for r in rows if (r["world_size"], r["link_gbps"]) != (w, link)]
        bands = pair_mod.pair_bands(pair_mod.pair_cells(others, error_feedback))
        for a, b in itertools.combinations(sorted(mine), 2):
            s = score_cell([mine[a], mine[b]], bands, error_feedback)
            decided, hatched = decided + s["decided"], hatched + (not s["decided"])
            right, inside = right + bool(s["winner_right"]), inside + bool(s["hatched_right"])
    return {"decided": decided, "right": right, "hatched": hatched, "inside": inside}


def _share(flags: list) -> Optional[float]:
    scored = [f for f in flags if f is not None]
    return sum(scored) / len(scored) if scored else None


def totals(scored: list[dict]) -> dict:
    """Each score over the scored cells, its target, and whether it passed (None: nothing to score)."""
    if not scored:
        return {}
    taus = [c["kendall_tau"] for c in scored if c["kendall_tau"] is not None]
    values = {"decided_right": _share([c["winner_right"] for c in scored]),
              "regret_le_5_pct": _share([c["regret_pct"] <= 5.0 for c in scored]),
              "median_tau": statistics.median(taus) if taus else None,
              "compress_right": _share([c["compress_right"] for c in scored]),
              "hatched_right": _share([c["hatched_right"] for c in scored])}
    out = {"cells": len(scored), "decided": sum(c["decided"] for c in scored),
           "decisive": sum(c["compress_right"] is not None for c in scored),
           "median_regret_pct": statistics.median(c["regret_pct"] for c in scored)}
    for name, value in values.items():
        out[name] = {"value": value, "target": TARGETS[name],
                     "passed": None if value is None else value >= TARGETS[name] - 1e-12}
    return out


def shuffled(rows: list[dict], rng: random.Random) -> list[dict]:
    """A random ranking: each counted cell's projected steps shuffled among its hooks."""
    out = []
    for mine in pair_mod.counted_cells(rows).values():
        values = [r["projected_ms"] for r in mine.values()]
        rng.shuffle(values)
        out += [{**r, "projected_ms": v} for r, v in zip(mine.values(), values)]
    return out


def power(rows: list[dict], draws: int = 500, seed: int = 0, error_feedback: bool = True) -> dict[str, float]:
    """Per score, the share of ``draws`` random rankings (:func:`shuffled`) that pass it."""
    rng = random.Random(seed)
    passed = {name: 0 for name in TARGETS}
    for _ in range(draws):
        t = totals(score(shuffled(rows, rng), error_feedback))
        for name in TARGETS:
            passed[name] += bool(t.get(name, {}).get("passed"))  # no scored cell: nothing passed
    return {name: n / draws for name, n in passed.items()}
