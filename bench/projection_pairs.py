"""The step model's error on the ratio of two hooks' steps, re-derived from the committed held-out
cells without running a trial, and the decisions it makes scored against measurement.

    .venv/bin/python bench/projection_pairs.py        # the report's cells; writes projection_pairs_cluster.json
    .venv/bin/python bench/projection_pairs.py --cells service/step_model/projection_cells.json \
        --out service/step_model/projection_pairs.json    # this machine's shape (error feedback on)
    .venv/bin/python bench/projection_pairs.py --cells X.json --error-feedback off --out P.json --draws 200

Reads service/step_model/projection_cells_cluster.json (bench/projection.py's counted cells on the
emulated cluster: per hook, error feedback, W and link the projected and measured step), writes
service/step_model/projection_pairs_cluster.json (the raw pair cells and the bands per pair, error
feedback and W: bench/_projection_pairs.py; every setting the cells ran), and prints, per setting,

* per hook against allreduce and W, the ratio error at each held-out link, and its band;
* per W over every pair: the range and median |error|, and how far a pair's error moves between
  links (what widens every band);
* each held-out cell decided by the report's rule under bands from the *other* cells, and the
  scores against their targets with their power (bench/_projection_scores.py).

Time to target is not scored here: the committed cells' runs trained 20 steps with no quality
trials (bench/projection.py --quality-steps 0), so no crossing step was measured on a held-out cell.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from _common import table  # noqa: F401  (puts the repository on sys.path)

import _projection_pairs as pair_mod  # noqa: E402
import _projection_scores as scores  # noqa: E402
from service.step_model.bands import RAW_FILE, sharding_in  # noqa: E402
from service.step_model.pairs import PAIR_FILE  # noqa: E402

NOT_SCORED = ("time to target: not scored. The committed cells' runs trained 20 steps with no quality trials "
              "(bench/projection.py --quality-steps 0): no crossing step was measured on a held-out cell. A "
              "projected time to target is the measured crossing step times the projected step, so where the "
              "crossing step is the cell's own its ratio error is the step's; elsewhere it rests on the quality "
              "assumed from another W, which no held-out cell checked.")


def print_baseline_pairs(cells: list[dict], bands: list[dict]) -> None:
    """Each configuration's step over allreduce's (an fsdp one's: over fsdp's allreduce): the error
    at each held-out link, the band, per W."""
    rows = []
    for band in bands:
        if band["b"] != pair_mod.BASELINE or sharding_in(band, "a_")[0] != sharding_in(band, "b_")[0]:
            continue
        errors = [c["error_pct"] for c in cells
                  if (pair_mod.pair_key(c), c["world_size"]) == (pair_mod.pair_key(band), band["world_size"])]
        side = {"hook": band["a"], **{k[2:]: v for k, v in band.items() if k in ("a_parallelism", "a_all_gather")}}
        rows.append([pair_mod.name(side), band["a_error_feedback"], band["world_size"],
                     " / ".join(f"{e:+.1f}" for e in errors),
                     f"{band['low_pct']:+.1f} … {band['high_pct']:+.1f}"])
    rows.sort(key=lambda r: (r[0], r[2]))
    print(table(["configuration / allreduce", "error feedback", "W", "ratio error % per link", "band %"], rows))


def print_pooled(cells: list[dict], moves: dict[int, float]) -> None:
    """Per W over every pair: the errors' range and median |error|, and the link move."""
    rows = []
    for w in sorted(moves):
        errors = [c["error_pct"] for c in cells if c["world_size"] == w]
        rows.append([w, len(errors), f"{min(errors):+.1f} … {max(errors):+.1f}",
                     round(statistics.median(abs(e) for e in errors), 1), round(moves[w], 1)])
    print(table(["W", "pair cells", "ratio error range %", "median |error| %", "link move % (widens bands)"], rows))


def print_decisions(scored: list[dict]) -> None:
    print(table(["W", "Gbit/s", "projected winner", "runner-up", "decided", "band %", "measured winner", "regret %",
                 "Kendall tau", "compress right", "winner right", "hatched right"],
                [[c["world_size"], c["link_gbps"], c["projected_winner"], c["runner_up"], c["decided"],
                  f"{c['band'][0]:+.1f} … {c['band'][1]:+.1f}", c["measured_winner"], round(c["regret_pct"], 1),
                  None if c["kendall_tau"] is None else round(c["kendall_tau"], 2), c["compress_right"],
                  c["winner_right"], c["hatched_right"]] for c in scored]))


def print_totals(t: dict, power: dict[str, float], draws: int) -> None:
    if not t:  # scores.totals of no scored cell (one hook, or no held-out cell with two)
        print("scores: no held-out cell with two hooks to rank, nothing to score")
        return

    def value(v):
        return "nothing to score" if v is None else f"{v:.2f}"

    print(table(["score", "value", "target", "passed", f"random rankings passing ({draws})"],
                [[name, value(t[name]["value"]), t[name]["target"], t[name]["passed"], power[name]]
                 for name in scores.TARGETS]))
    print(f"{t['cells']} cells, {t['decided']} decided, compress-or-not decisive in {t['decisive']}, "
          f"median regret {t['median_regret_pct']:.1f} %")


def settings(saved: dict, choices: list[str] | None) -> list[dict]:
    """The cells split by error-feedback setting (the pairs rank hooks within one setting): one
    part per setting chosen, else per setting the cells ran."""
    ran = saved["error_feedback"]
    if choices is None and isinstance(ran, list):
        choices = ["on" if ef else "off" for ef in ran]
    return [one_setting(saved, c) for c in (choices or [None])]


def one_setting(saved: dict, choice: str | None) -> dict:
    """The cells of one error-feedback setting (the pairs rank hooks by name within one): the
    chosen one, else the file's only one."""
    if choice is None:
        return saved
    want = choice == "on"
    rows = [r for r in saved["cell_rows"] if r.get("error_feedback", want) in (want, None)]
    return {**saved, "cell_rows": rows, "error_feedback": want}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--cells", default=str(RAW_FILE), help="a projection_cells.json (default: the committed one)")
    parser.add_argument("--out", default=str(PAIR_FILE), help="where to write the pair file ('-': nowhere)")
    parser.add_argument("--draws", type=int, default=500, help="random rankings for the power")
    parser.add_argument("--error-feedback", choices=["on", "off"], nargs="+", help="cells that ran both settings: "
                        "the pairs of these (each with the hooks that have none), all in one file")
    args = parser.parse_args(argv)
    saved = json.loads(Path(args.cells).read_text())
    parts = settings(saved, args.error_feedback)
    data = pair_mod.pair_file(parts, Path(args.cells).name)
    for part in parts:
        report_setting(part, args.cells, args.draws)
    if args.out != "-":
        print(f"wrote {pair_mod.write(data, args.out)}")
    return 0


def report_setting(saved: dict, source: str, draws: int) -> None:
    """The tables of one error-feedback setting's cells: pairs against allreduce, pooled, every
    held-out cell decided under bands from the others, the scores with their power."""
    cells = pair_mod.pair_cells(saved["cell_rows"], saved["error_feedback"])
    print(f"{len(cells)} pair cells from {source} ({saved['cells']}; error feedback "
          f"{'on' if saved['error_feedback'] else 'off'}; measured {saved['measured']})\n")
    print_baseline_pairs(cells, pair_mod.bands(cells))
    print()
    print_pooled(cells, pair_mod.link_moves(cells))
    print("\ndecisions per held-out cell (bands from the other cells):")
    scored = scores.score(saved["cell_rows"], saved["error_feedback"])
    print_decisions(scored)
    print()
    print_totals(scores.totals(scored), scores.power(saved["cell_rows"], draws, error_feedback=saved["error_feedback"]),
                 draws)
    calls = scores.pair_calls(saved["cell_rows"], saved["error_feedback"])
    print(f"\nevery pair at every cell on its own: {calls['decided']} decided, {calls['right']} of them in the measured "
          f"order; {calls['hatched']} hatched, {calls['inside']} of them measured inside their band")
    print(f"\n{NOT_SCORED}\n")


if __name__ == "__main__":
    sys.exit(main())
