"""CPU hogs that run exactly while a sweep's baseline trials run: another job sharing the
machine with some of a sweep's trials and not others (issue 23). Used by bench/verdicts.py and
tests/test_paired_under_load.py."""

from __future__ import annotations

import multiprocessing
import threading
import time
from contextlib import contextmanager

from mlflow.tracking import MlflowClient


def _spin() -> None:
    while True:
        pass


class HogDuringBaseline(threading.Thread):
    """Polls the sweep's MLflow store; while a run tagged ``trial_config = baseline`` (and, with
    ``seed``, ``trial_seed = seed``: only that seed's trial) is RUNNING, ``count`` busy processes
    run, and none otherwise. ``seen``: the hogs ran at all."""

    def __init__(self, uri: str, experiment: str, count: int, baseline: str = "allreduce", seed: int | None = None):
        super().__init__(daemon=True)
        self.client, self.experiment, self.count, self.baseline = MlflowClient(uri), experiment, count, baseline
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
            except Exception:  # the sweep is still creating the store
                running = False
            if running and not self.hogs:
                self.seen, started = True, time.monotonic()
                self.hogs = [multiprocessing.get_context("fork").Process(target=_spin, daemon=True)
                             for _ in range(self.count)]
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
