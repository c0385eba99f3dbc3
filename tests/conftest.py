"""Fixtures shared across test files.

``smoke_sweep``: ONE real `python -m service.sweep smoke` per test session (local Ray, a
temporary SQLite MLflow store), read by every test that only inspects what such a sweep
recorded (all in test_sweep_e2e.py: the CLI's output, the runs, the report rebuilt from them;
one file, so that pytest-xdist's --dist loadfile runs the sweep once, on one worker). Each
4-trial sweep costs minutes on a 2-core machine (~30 s of Ray Train start-up and tear-down per
trial), so running the same sweep once per reader was most of their time.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "tune_configs" / "smoke.yaml"
# 4 trials of ~30 s of Ray Train start-up each; far slower on a busy shared machine. The
# tests that use the fixture carry a timeout above this (pytest-timeout counts fixture set-up).
SMOKE_SWEEP_TIMEOUT_S = 1400


@dataclass(frozen=True)
class SmokeSweep:
    proc: subprocess.CompletedProcess
    uri: str
    workdir: Path
    # The parent run's artifacts right after the sweep: what the sweep itself attached, before
    # any test rebuilds (and re-attaches) the report.
    attached_by_sweep: frozenset[str]
    # The Ray actor processes that ran under the sweep, as (class, pid): ("TrainController", 4242),
    # from their process titles ("ray::RayTrainWorker.run_train_fn"), sampled while it ran.
    ray_processes: frozenset[tuple[str, int]]

    @property
    def ray_actors(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.ray_processes)


def _actor_processes_below(pid: int) -> set[tuple[str, int]]:
    """(Ray actor class, pid) of ``pid``'s descendants titled ``ray::Class...`` now."""
    parents = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    classes = set()
    for p in found:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                title = f.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith("ray::") and title[5:].strip():
            classes.add((title[5:].split(".")[0].split()[0], p))
    return classes


def _sample_actors(proc: subprocess.Popen, every_s: float = 0.25) -> set[tuple[str, int]]:
    """Poll ``_actor_processes_below(proc.pid)`` until ``proc`` ends (every actor of a trial lives
    for seconds at least)."""
    seen = set()
    while proc.poll() is None:
        seen |= _actor_processes_below(proc.pid)
        time.sleep(every_s)
    return seen


@pytest.fixture(scope="session")
def smoke_sweep(tmp_path_factory) -> SmokeSweep:
    """The smoke preset run once, for real, as a user runs it (a subprocess, its own local Ray)."""
    from mlflow.tracking import MlflowClient

    workdir = tmp_path_factory.mktemp("smoke_sweep")
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # always a local Ray
    env.update(MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    with subprocess.Popen([sys.executable, "-m", "service.sweep", str(SMOKE)], cwd=workdir, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as running:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            actors = pool.submit(_sample_actors, running)
            try:
                out, err = running.communicate(timeout=SMOKE_SWEEP_TIMEOUT_S)
            finally:
                running.kill()
        proc = subprocess.CompletedProcess(running.args, running.returncode, out, err)
    attached: frozenset[str] = frozenset()
    # (a client on a missing SQLite file would create an empty store: look only if the sweep made one)
    client = MlflowClient(tracking_uri=uri) if (workdir / "mlflow.db").exists() else None
    experiment = client.get_experiment_by_name("smoke") if client is not None else None
    if experiment is not None:
        parents = [r for r in client.search_runs([experiment.experiment_id], max_results=100)
                   if "mlflow.parentRunId" not in r.data.tags]
        if len(parents) == 1:
            attached = frozenset(a.path for a in client.list_artifacts(parents[0].info.run_id))
    return SmokeSweep(proc, uri, workdir, attached, frozenset(actors.result()))


# ----------------------------------------------------------------------------- the suite's own time
# `make test` ends with the files that took longest (setup, call and teardown of every test,
# added up per file): where the suite's minutes go, in every CI log. Under pytest-xdist the
# controller receives every worker's reports, so the table covers the whole run.
SLOWEST_FILES_SHOWN = 15
_seconds_by_file: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:
    path = report.nodeid.split("::", 1)[0]
    _seconds_by_file[path] = _seconds_by_file.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    if not _seconds_by_file or hasattr(terminalreporter.config, "workerinput"):  # an xdist worker: none
        return
    slowest = sorted(_seconds_by_file.items(), key=lambda kv: -kv[1])[:SLOWEST_FILES_SHOWN]
    terminalreporter.write_sep("=", f"slowest {len(slowest)} test files (s, all their tests' phases)")
    for path, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f}  {path}")
    terminalreporter.write_line(f"{sum(_seconds_by_file.values()):8.1f}  all {len(_seconds_by_file)} files "
                                "(the workers' time added up: wall x workers, roughly)")


# The longest files first (their seconds in a fresh clone's `make test` on 2026-12-06, a 2-core
# AMD EPYC, most first; test_compose's includes building its image): xdist's loadfile hands files
# out in collection order, so a long file collected last ran alone at the end while the other
# worker idled (2.5 min of a 29.7-min run). Files not named keep their order after these.
LONGEST_FILES = ("test_bench_smoke.py", "test_compose.py", "test_cluster_hosts.py", "test_resume.py",
                 "test_adaptive_sweep.py", "test_netem.py", "test_sweep_e2e.py", "test_cluster.py",
                 "test_plan_round.py", "test_refusals.py", "test_fsdp_sweep.py", "test_compile_sweep.py",
                 "test_local_sgd_sweep.py", "test_hf_sweep.py", "test_cli.py", "test_workload_contract.py",
                 "test_hooks_dist.py", "test_netem_docker.py", "test_faults.py", "test_paired_timing.py")


def _file_rank(item) -> int:
    name = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)


def pytest_collection_modifyitems(config, items) -> None:
    """``slow``: what the inner loop skips (``-m "not slow"``): every test that starts Ray, a
    cluster or Docker, and those marked slow by hand (benches that run sweeps, the tests of
    test_workload_contract's 2-rank bf16 trials). Then the longest
    files first (a stable sort: each file's tests keep their order)."""
    for item in items:
        if any(item.get_closest_marker(m) for m in ("ray", "cluster", "docker")):
            item.add_marker(pytest.mark.slow)
    items.sort(key=_file_rank)
