"""The command line: ``python -m service.sweep CONFIG [--dry-run] [--resume]``.

Exit status: 0 every trial finished (ok or nan), 1 some trial failed or the sweep itself failed
(its traceback in the log file), 2 bad config or an environment that cannot run it (one line
each, no traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from service.config import ConfigError, load_config
from service.sweep import signals
from service.sweep.errors import SweepError
from service.sweep.logs import start_log_file
from service.sweep.results import format_table, mlflow_ui_hint, trial_rows, write_report
from service.sweep.run import adaptive_range, run_sweep, seed_rounds
from service.sweep.transport import probe_interrupted
from service.text import count, one_line

log = logging.getLogger("service.sweep")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m service.sweep",
        description=(
            "Sweep PyTorch DDP gradient-communication hooks: one Ray Tune trial per "
            "(hook configuration, world size, seed), each a Ray Train TorchTrainer run, every "
            "trial recorded in MLflow (a parent run per sweep, a nested run per trial). "
            "The config is validated before anything starts."),
        epilog=(
            "Environment: RAY_ADDRESS - run on that Ray cluster instead of starting a local "
            "Ray instance; MLFLOW_TRACKING_URI - record there instead of ./mlflow.db (SQLite). "
            "A config's network: section (e.g. the preset network) runs every rank on its own "
            "emulated host, each host's link shaped by tc to network.link_gbps; it needs root "
            "(CAP_NET_ADMIN) and iproute2, and is refused in one line without them. "
            "Exit status: 0 every trial finished (ok or nan), 1 some trial failed or the sweep "
            "itself failed, 2 bad config or an environment that cannot run it, 130 interrupted."),
    )
    parser.add_argument(
        "config", metavar="CONFIG",
        help="the sweep's YAML file, or the name of a preset in tune_configs/ "
             "(e.g. smoke, quant, fp16, all_hooks)")
    parser.add_argument(
        "--dry-run", action="store_true",
        help="print the expanded trial list (hook, its params, world size, seed) and the "
             "trial count, then exit; starts no Ray and creates no MLflow run")
    parser.add_argument(
        "--resume", action="store_true",
        help="continue the latest sweep of this config's experiment (e.g. after Ctrl-C): run "
             "only the trials that did not finish, under the same MLflow parent run, continuing "
             "interrupted trials' runs (and their checkpoints) instead of creating new ones")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg, config_path = load_config(args.config)
        trials = cfg.trials()
    except ConfigError as exc:
        for line in exc.lines():  # every problem, one line each: fix them all in one go
            print(f"error: {line}", file=sys.stderr)
        return 2

    if args.dry_run:
        print_dry_run(cfg, trials)
        return 0

    log_path = start_log_file(cfg)
    signals.stop_once()  # a Ctrl-C stops the sweep once: any after it finish the same exit (130, the hint)
    try:
        outcome = run_sweep(cfg, config_path, trials, resume=args.resume)
    except SweepError as exc:
        log.error("sweep refused: %s", exc)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug or an unexpected environment: one line here, the traceback in the log
        log.exception("sweep failed")
        print(f"error: the sweep failed: {one_line(exc)} (details: {log_path})", file=sys.stderr)
        return 1

    if outcome.interrupted:
        log.info("interrupted: writing the report")  # (tests/test_resume.py signals again here)
    report_line = write_report(cfg, outcome)  # first: it records each trial's time to target
    rows = trial_rows(outcome.parent_run_id, outcome.tracking_uri, outcome.trials or trials,
                      ran_only=cfg.search.adaptive is not None)
    print()
    print(format_table(rows))
    print()
    print(f"{count(len(outcome.rows), 'trial')}, {outcome.failed} failed. Log: {log_path}")
    print(mlflow_ui_hint(outcome.tracking_uri, outcome.parent_run_id))
    print(report_line, flush=True)
    if outcome.interrupted:
        print(f"Interrupted: unfinished trials ended KILLED. Finish them with: "
              f"python -m service.sweep {args.config} --resume", flush=True)
        if probe_interrupted():  # at once, as service.probe: the interpreter's exit with the probe's
            sys.stderr.flush()  # thread inside Ray crashed the process (SIGSEGV in place of 130)
            logging.shutdown()
            os._exit(130)
        return 130
    return 1 if outcome.failed else 0


def print_dry_run(cfg, trials) -> None:
    """The trials, one line each, and how many; with adaptive seeds the first round's, the
    range of trials and the rule that adds seeds."""
    if cfg.splits_links:
        print(f"quality once, time per link: each configuration, world size and seed trains its "
              f"{cfg.workload.steps} steps once on loopback (quality); per link, one timing run of "
              f"{cfg.network.timing_steps} steps at seed {cfg.search.seeds[0]} (timing)")
    if cfg.search.adaptive is None:
        for trial in trials:
            print(trial.describe())
        print(count(len(trials), "trial"))
    else:
        _print_rounds(cfg, trials)
    if cfg.search.plan is not None:
        print("then a plan round (search.plan): a per-bucket plan designed from these trials' step timelines, "
              "trained at every world size, link and seed the baseline ran, unless the plan is one hook everywhere")


def _print_rounds(cfg, trials) -> None:
    """Adaptive seeds: the first round's trials, the rounds after it and the rule."""
    rounds = seed_rounds(cfg, trials)
    first = rounds.plan({})
    seeds = cfg.search.adaptive
    print(f"round 1: every configuration at seeds 0 to {seeds.min - 1}")
    for trial in first:
        print(trial.describe())
    if seeds.max > seeds.min:
        which = (f"round 2: seed {seeds.min}" if seeds.max == seeds.min + 1 else
                 f"rounds 2 to {rounds.rule.looks}: seed {seeds.min}, then the next, up to {seeds.max - 1},")
        print(f"{which} for each configuration (per world size and link) whose quality verdict is "
              f"still undecided, and for the baseline at that seed")
    print(f"{adaptive_range(cfg, trials)} (adaptive seeds {seeds.min} to {seeds.max}); the rule: "
          f"{rounds.rule.text()}")
