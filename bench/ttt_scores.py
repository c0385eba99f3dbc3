"""Time to target scored where quality trials exist: a sweep's smallest world size projected, by
the report's own code, to a larger world size the same sweep measured, and the decisions that
projection makes scored against what that world size measured.

    .venv/bin/python bench/ttt_scores.py DIR [--experiment NAME] [--out JSON]

DIR holds the sweep's SQLite store (DIR/mlflow.db; e.g. a fresh clone after `make sweep`, whose
trials ran at W = 2 and 4 on loopback, each with its quality). For every larger W the sweep ran
(the held-out W), the report's bases are built from the trials below it only
(``service.answer.projection.bases``: quality, the crossing step and its verdict, and the step
timelines from W = 2), and each configuration is priced at the held-out W where its trials ran:
loopback, this machine's cores shared by the W ranks (``TrialTimeline.price(..., cores=...)``,
the sweep's transport.json). Projected time to target = W = 2's mean crossing step x that step;
measured = the held-out W's trials' own time to target (their target: allreduce's final eval loss
at that W, + report.target_tolerance; evals left out, as the report does), mean over the seeds
both world sizes ran. Printed, per configuration and per pair of configurations:

* the error of the projected time to target, and of its two factors: the step (the model) and
  the crossing step (the quality assumed from W = 2);
* the error of every pair's projected ratio against the measured one (what decides a cell);
* the cell decided by the report's rule (service/step_model/pairs.py) under the machine-shape
  step pair bands (projection_pairs.json: these cells are priced with the machine's shape), and
  the scores of bench/_projection_scores.py: the winner, regret <= 5 %, Kendall tau, compress or
  not, with the share of random rankings that pass each (the power).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import table, write_json  # noqa: E402

import _projection_scores as scores  # noqa: E402
from service.answer import data, projection, recommend  # noqa: E402
from service.step_model import pairs  # noqa: E402
from service.step_model.bands import SHAPE_ERROR_FILE, error_bands  # noqa: E402



def load(store: Path, experiment: str):
    """``experiment``'s latest sweep in ``store`` (or a run id's): (reader, data.Sweep)."""
    from service import tracking

    reader = data.open_store(f"sqlite:///{store}")
    try:
        parent = reader.resolve_parent(experiment)
    except tracking.StoreError as e:
        raise SystemExit(f"error: {e}") from None
    return reader, data.load_sweep(reader, parent)


def _on_loopback(t) -> bool:
    """An eager trial on this machine's loopback: what the held-out cells compare."""
    return t.link == recommend.LOOPBACK and not t.compiled


def held_out(sweep, recs, reader, world_size: int, cores: int) -> list[dict]:
    """Each configuration that ran at ``world_size`` and below it: projected from below, measured there."""
    below = [t for t in sweep.trials if t.world_size < world_size and _on_loopback(t)]
    bases = projection.bases(below, [r for r in recs if r.world_size < world_size], reader.step_timeline)
    transport = reader.transport(sweep.parent_run_id)
    out = []
    for b in bases:
        at_w = [t for t in sweep.trials if t.config == b.config and t.world_size == world_size and _on_loopback(t)
                and t.state == "ok" and t.time_to_target is not None and t.time_to_target.seconds is not None]
        basis_seeds = _basis_seeds(sweep, b.config, b.measured_world_size)
        seeds = sorted({t.seed for t in at_w} & basis_seeds)
        if not seeds or b.crossing_step is None:
            continue
        steps = [tl.price(b.global_batch, world_size, math.inf, 0.0, transport, cores=cores).step_ms for tl in b.timelines]
        step = statistics.median(steps)
        mine = [t for t in at_w if t.seed in seeds]
        measured_s = statistics.fmean(t.time_to_target.seconds for t in mine)
        measured_crossing = statistics.fmean(t.time_to_target.step for t in mine)
        out.append({"config": b.config, "hook": b.hook, "error_feedback": b.error_feedback, "seeds": seeds,
                    "projected_s": b.crossing_step * step / 1000.0, "measured_s": measured_s,
                    "projected_step_ms": step, "measured_step_ms": 1000.0 * measured_s / measured_crossing,
                    "crossing_below": b.crossing_step, "crossing_here": measured_crossing,
                    "matches_below": b.matches_quality, "seed_steps_ms": steps})
    return out


def _basis_seeds(sweep, config: str, world_size: int) -> set[int]:
    return {t.seed for t in sweep.trials if t.config == config and t.world_size == world_size and t.state == "ok"}


def errors(rows: list[dict]) -> None:
    for r in rows:
        r["error_pct"] = 100.0 * (r["projected_s"] / r["measured_s"] - 1.0)
        r["step_error_pct"] = 100.0 * (r["projected_step_ms"] / r["measured_step_ms"] - 1.0)
        r["crossing_error_pct"] = 100.0 * (r["crossing_below"] / r["crossing_here"] - 1.0)


def pair_errors(rows: list[dict]) -> list[dict]:
    out = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            projected, measured = a["projected_s"] / b["projected_s"], a["measured_s"] / b["measured_s"]
            out.append({"a": a["config"], "b": b["config"], "projected_ratio": projected, "measured_ratio": measured,
                        "error_pct": 100.0 * (projected / measured - 1.0)})
    return out


def decide(rows: list[dict], world_size: int) -> dict:
    """The cell as the report decides it (matching configurations only) and the scores against measurement."""
    bands = pairs.pair_bands(pairs.SHAPE_PAIR_FILE)  # these cells share the machine's cores
    absolute = error_bands(SHAPE_ERROR_FILE)          # for a pair the bench never measured, as the report does
    ranked = {r["config"]: r for r in rows if r["matches_below"]}
    contenders = [pairs.Contender(c, r["projected_s"], r["crossing_below"] * min(r["seed_steps_ms"]) / 1000.0,
                                  r["crossing_below"] * max(r["seed_steps_ms"]) / 1000.0) for c, r in ranked.items()]

    def band_of(a: str, b: str):
        ra, rb = ranked[a], ranked[b]
        return bands.between(pairs.Configured(ra["hook"], ra["error_feedback"]),
                             pairs.Configured(rb["hook"], rb["error_feedback"]), world_size, absolute)

    d = pairs.decide(contenders, band_of)
    projected = {c: r["projected_s"] for c, r in ranked.items()}
    measured = {c: r["measured_s"] for c, r in ranked.items()}
    return {"decision": d, "decided": d.decided, **score(projected, measured, ranked)}


def score(projected: dict, measured: dict, rows: dict) -> dict:
    """A cell's ranking ``projected`` (config -> s) against ``measured``: the winner, regret %, Kendall
    tau, and compress or not (None where the measured gap is within bench/_projection_scores's DECISIVE)."""
    best_projected = min(projected, key=projected.get)
    best_measured = min(measured, key=measured.get)
    regret = 100.0 * (measured[best_projected] / measured[best_measured] - 1.0)
    compressing = [c for c in measured if rows[c]["hook"] != scores.BASELINE]
    baseline = next((c for c in measured if rows[c]["hook"] == scores.BASELINE), None)
    compress_right = None
    if baseline and compressing:
        best_c = min(compressing, key=measured.get)
        gap = measured[baseline] / measured[best_c] - 1.0
        if abs(gap) > scores.DECISIVE:
            compress_right = (min(projected[c] for c in compressing) < projected[baseline]) == (gap > 0)
    return {"projected_winner": best_projected, "measured_winner": best_measured, "winner_right": best_projected == best_measured,
            "regret_pct": regret, "kendall_tau": scores.kendall_tau(projected, measured), "compress_right": compress_right}


def power(rows: list[dict], draws: int, seed: int = 0) -> dict:
    """How often a random ranking (the projected times shuffled among the configurations) scores as well."""
    rng = random.Random(seed)
    ranked = {r["config"]: r for r in rows if r["matches_below"]}
    measured = {c: r["measured_s"] for c, r in ranked.items()}
    model = score({c: r["projected_s"] for c, r in ranked.items()}, measured, ranked)
    passed = {"winner_right": 0, "regret_le_5_pct": 0, "tau_ge_model": 0}
    for _ in range(draws):
        values = [r["projected_s"] for r in ranked.values()]
        rng.shuffle(values)
        s = score(dict(zip(ranked, values)), measured, ranked)
        passed["winner_right"] += s["winner_right"]
        passed["regret_le_5_pct"] += s["regret_pct"] <= 5.0
        passed["tau_ge_model"] += (s["kendall_tau"] or -1) >= (model["kendall_tau"] or -1)
    return {k: v / draws for k, v in passed.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path, help="folder with the sweep's mlflow.db")
    ap.add_argument("--experiment", default="quant", help="the sweep's experiment or parent run id (default quant: "
                    "the main job's)")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="the cores the sweep's ranks shared")
    ap.add_argument("--draws", type=int, default=1000, help="random rankings for the power")
    ap.add_argument("--out", help="JSON path (default bench/results/ttt_scores-*.json)")
    args = ap.parse_args(argv)
    store = args.dir / "mlflow.db"
    if not store.exists():
        print(f"error: no mlflow.db in {args.dir}", file=sys.stderr)
        return 2
    reader, sweep = load(store, args.experiment)
    recs = data.recommendations(sweep)
    result = {"sweep": sweep.parent_name, "cells": []}
    for w in [w for w in sweep.world_sizes if w > min(sweep.world_sizes)]:
        rows = held_out(sweep, recs, reader, w, args.cores)
        if len(rows) < 2:
            print(f"W = {w}: fewer than two configurations to compare")
            continue
        errors(rows)
        print(f"\nW = {w} on loopback ({args.cores} cores), projected from W = {min(sweep.world_sizes)}:")
        print(table(["configuration", "seeds", "projected s", "measured s", "error %", "step error %",
                     "crossing step error %", "matches (below)"],
                    [[r["config"], ",".join(map(str, r["seeds"])), round(r["projected_s"], 2), round(r["measured_s"], 2),
                      round(r["error_pct"], 1), round(r["step_error_pct"], 1), round(r["crossing_error_pct"], 1),
                      r["matches_below"]] for r in rows]))
        pair_rows = pair_errors(rows)
        print(table(["a", "b", "projected a/b", "measured a/b", "ratio error %"],
                    [[p["a"], p["b"], round(p["projected_ratio"], 3), round(p["measured_ratio"], 3),
                      round(p["error_pct"], 1)] for p in pair_rows]))
        absolute = [abs(p["error_pct"]) for p in pair_rows]
        print(f"pairs: median |ratio error| {statistics.median(absolute):.1f} %, max {max(absolute):.1f} %")
        cell = decide(rows, w)
        d = cell.pop("decision")
        pw = power(rows, args.draws)
        print(f"decided: {d.decided} (winner {d.winner}, runner-up {d.runner_up}, band "
              f"{d.band.text() if d.band else '-'}); projected winner {cell['projected_winner']}, measured "
              f"{cell['measured_winner']}: right {cell['winner_right']} (random: {pw['winner_right']:.2f}); regret "
              f"{cell['regret_pct']:.1f} % (<= 5 %: random {pw['regret_le_5_pct']:.2f}); Kendall tau "
              f"{cell['kendall_tau'] if cell['kendall_tau'] is None else round(cell['kendall_tau'], 2)} (random as good: "
              f"{pw['tau_ge_model']:.2f}); compress or not right: {cell['compress_right']} (None: gap within 10 %)")
        result["cells"].append({"world_size": w, "rows": rows, "pairs": pair_rows, **cell, "power": pw,
                                "decided_winner": d.winner, "decided_runner_up": d.runner_up})
    path = write_json("ttt_scores", result, args.out)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
