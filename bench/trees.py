"""One bench script in two checkouts of the project, alternately: did a change slow it down?

    python bench/trees.py OTHER_CHECKOUT --key summary.on.step_ms_median --repeat 4 \\
        -- instrumentation.py --rounds 2 --steps 150

Runs ``bench/SCRIPT ARGS --out FILE`` in this checkout and in ``OTHER_CHECKOUT`` (e.g. a
`git worktree add --detach /tmp/old <commit>`), alternating which goes first each repeat so both
see the same machine, and reads ``--key`` (dotted path into the script's JSON) from every run.
Prints each pair, each one's median, and this/other - 1 (median of the paired ratios), with the
load average. Both checkouts run with this interpreter and its installed packages; each
script imports its own checkout's code (bench/_common.py puts its root first on sys.path).
``--other-python`` runs the other checkout with another interpreter (its own virtualenv's python):
with OTHER the same checkout, that compares two interpreters on the same code::

    python bench/trees.py . --other-python /tmp/old-venv/bin/python --key wall_s --repeat 2 -- main_job.py --quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, load_average, table, write_json  # noqa: E402


def _run(tree: Path, python: str, script: list[str], key: str, out: Path) -> float:
    cmd = [python, str(tree / "bench" / script[0]), *script[1:], "--out", str(out)]
    subprocess.run(cmd, cwd=tree, check=True, stdout=subprocess.DEVNULL)
    value = json.loads(out.read_text())
    for part in key.split("."):  # a list's items by their index: summary.0.feedback
        value = value[int(part)] if isinstance(value, list) else value[part]
    return float(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage="%(prog)s OTHER --key KEY [--repeat N] -- SCRIPT [ARGS]",
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("other", type=Path, help="the other checkout's root")
    parser.add_argument("--key", required=True, help="dotted path to a number in the script's JSON (a list's item by its index)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--other-python", default=sys.executable,
                        help="the interpreter the other checkout runs with (default: this one)")
    parser.add_argument("--out", help="JSON path (default bench/results/trees.json)")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, script = parser.parse_args(argv[:cut]), argv[cut + 1:]
    if not script:
        parser.error("give the bench script after --, e.g. -- instrumentation.py --quick")
    trees = {"this": ROOT, "other": args.other.resolve()}
    pythons = {"this": sys.executable, "other": args.other_python}
    before, rows = load_average(), []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            order = ["this", "other"] if r % 2 == 0 else ["other", "this"]
            got = {name: _run(trees[name], pythons[name], script, args.key, Path(tmp) / f"{name}{r}.json") for name in order}
            rows.append([r + 1, order[0], got["this"], got["other"], got["this"] / got["other"] - 1])
            print(f"repeat {r + 1}: this {got['this']:.4g}, other {got['other']:.4g}", flush=True)
    ratio = statistics.median(row[4] for row in rows)
    print(table(["repeat", "first", f"this ({args.key})", "other", "this/other - 1"], rows))
    print(f"\nthis/other - 1, median of {len(rows)} paired repeats: {100 * ratio:+.1f}% "
          f"(this median {statistics.median(r[2] for r in rows):.4g}, other {statistics.median(r[3] for r in rows):.4g}); "
          f"load {before} -> {load_average()}")
    path = write_json("trees", {"trees": {k: str(v) for k, v in trees.items()}, "pythons": pythons, "script": script, "key": args.key,
                                "rows": rows, "ratio_median": ratio, "load_average_before": before,
                                "load_average_after": load_average()}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
