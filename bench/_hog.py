"""CPU hogs that run exactly while a sweep's baseline trials run: another job sharing the
machine with some of a sweep's trials and not others (issue 23). Used by bench/verdicts.py and
the load tests (tests/test_paired_under_load.py, tests/test_like_with_like.py).

Two kinds. ``busy(count)``: plain spinners at normal priority, what bench/verdicts.py measured
docs/performance.md's tables with; how much they slow a trial depends on everything else that
runs (under the test suite's second worker, 4 of them slowed a trial 1.15-1.2x where alone they
slowed it 3.6x). ``core_share(share)``: one realtime spinner per core, busy ``share`` of every
4 ms, which leaves every other process ``1 - share`` of the machine whatever else runs; what the
load tests use, so their power does not hang on the other worker's load.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

from mlflow.tracking import MlflowClient

LIFETIME_S = 1800.0  # a hog orphaned by a killed test stops by itself
PERIOD_S = 0.004  # short against a step (tens of ms), so every step loses the same share


def _spin() -> None:
    deadline = time.monotonic() + LIFETIME_S
    while time.monotonic() < deadline:
        pass


def _take_share(cpu: int, share: float) -> None:
    """Busy ``share`` of every period on ``cpu``, at realtime priority where allowed (root; a
    container without realtime runtime keeps normal priority and the share is a lower bound)."""
    os.sched_setaffinity(0, {cpu})
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except PermissionError:
        pass
    busy, idle = PERIOD_S * share, PERIOD_S * (1 - share)
    deadline = time.monotonic() + LIFETIME_S
    while time.monotonic() < deadline:
        start = time.perf_counter()
        while time.perf_counter() - start < busy:
            pass
        time.sleep(idle)


def _fork(target, *args) -> multiprocessing.Process:
    return multiprocessing.get_context("fork").Process(target=target, args=args, daemon=True)


def busy(count: int) -> Callable[[], list[multiprocessing.Process]]:
    """``count`` plain spinners."""
    return lambda: [_fork(_spin) for _ in range(count)]


def core_share(share: float) -> Callable[[], list[multiprocessing.Process]]:
    """One realtime spinner per core this process may run on, busy ``share`` of its time."""
    return lambda: [_fork(_take_share, cpu, share) for cpu in sorted(os.sched_getaffinity(0))]


class HogDuringBaseline(threading.Thread):
    """Polls the sweep's MLflow store; while a run tagged ``trial_config = baseline`` (and, with
    ``seed``, ``trial_seed = seed``: only that seed's trial) is RUNNING, the ``hogs`` run, and
    none otherwise. ``seen``: the hogs ran at all."""

    def __init__(self, uri: str, experiment: str, hogs: Callable[[], list[multiprocessing.Process]],
                 baseline: str = "allreduce", seed: int | None = None):
        super().__init__(daemon=True)
        self.client, self.experiment, self.make, self.baseline = MlflowClient(uri), experiment, hogs, baseline
        self.where = f"tags.trial_config = '{baseline}'" + ("" if seed is None else f" and tags.trial_seed = '{seed}'")
        self.stop, self.hogs, self.seen = threading.Event(), [], False
        self.hogged_s = 0.0

    @contextmanager
    def around(self, on: bool = True):
        """Hogs while the baseline runs inside the ``with`` block (nothing when ``on`` is false);
        the watcher stopped, and its hogs killed, however the block ends."""
        if on:
            self.start()
        try:
            yield self
        finally:
            self.stop.set()
            if self.is_alive():
                self.join()

    def _baseline_running(self) -> bool:
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is None:
            return False
        runs = self.client.search_runs([exp.experiment_id], self.where)
        return any(r.info.status == "RUNNING" for r in runs)

    def run(self) -> None:
        started = 0.0
        while not self.stop.is_set():
            try:
                running = self._baseline_running()
            except Exception:  # the store not made yet, or busy: keep the hogs as they are
                running = bool(self.hogs)
            if running and not self.hogs:
                self.seen, started = True, time.monotonic()
                self.hogs = self.make()
                for p in self.hogs:
                    p.start()
            elif not running and self.hogs:
                self.kill()
                self.hogged_s += time.monotonic() - started
            time.sleep(0.3)
        if self.hogs:
            self.hogged_s += time.monotonic() - started
        self.kill()

    def kill(self) -> None:
        for p in self.hogs:
            p.kill()
            p.join()
        self.hogs = []
