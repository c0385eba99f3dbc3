"""CPU hogs that run exactly while a sweep's baseline trials run: another job sharing the
machine with some of a sweep's trials and not others. Used by bench/verdicts.py and the load
tests (tests/test_adaptive_sweep.py).

Two kinds. ``busy(count)``: plain spinners at normal priority, what bench/verdicts.py measured
docs/performance.md's tables with; how much they slow a trial depends on everything else that
runs (under the test suite's second worker, 4 of them slowed a trial 1.15-1.2x where alone they
slowed it 3.6x), and they slow everything else too. ``throttle(share)``: the trial's own ranks
(this process's descendants titled ``ray::RayTrainWorker``) stopped ``share`` of every
millisecond, as a CPU quota on a noisy node would; it slows them by the same factor whatever
else runs, and nothing else: what the load tests use, whose steps (tens of ms) are far longer
than the throttle's period, so every step loses the same share. (A realtime core share that
slowed the whole machine is gone: a test may slow only the processes it started.)
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from mlflow.tracking import MlflowClient

LIFETIME_S = 1800.0  # a hog orphaned by a killed test stops by itself
THROTTLE_PERIOD_S = 0.001  # far shorter than a step, so every step loses the same share
RANK_TITLE = b"ray::RayTrainWorker"


def _spin() -> None:
    deadline = time.monotonic() + LIFETIME_S
    while time.monotonic() < deadline:
        pass


def _realtime() -> None:
    """SCHED_FIFO where allowed (root; a container without realtime runtime keeps normal priority)."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except PermissionError:
        pass


def _descendants(root: int) -> set[int]:
    """Every process below ``root`` (from /proc: no psutil here)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, rest = stat.read_text().split(" (", 1)
            children.setdefault(int(rest.rsplit(") ", 1)[1].split()[1]), []).append(int(pid))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _ranks(root: int) -> list[int]:
    pids = []
    for pid in _descendants(root):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(RANK_TITLE):
                pids.append(pid)
        except OSError:
            continue
    return pids


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _throttle(root: int, share: float) -> None:
    """Stop ``root``'s ranks ``share`` of every period until terminated; continued on the way out."""
    ranks: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: (_signal(ranks, signal.SIGCONT), os._exit(0)))
    _realtime()  # on time, whatever else runs: it sleeps most of each period, so it takes little from anyone
    deadline, looked = time.monotonic() + LIFETIME_S, 0.0
    while time.monotonic() < deadline:
        if time.monotonic() - looked > 0.5:  # ranks start after the run opens
            ranks[:], looked = _ranks(root), time.monotonic()
        _signal(ranks, signal.SIGSTOP)
        time.sleep(THROTTLE_PERIOD_S * share)
        _signal(ranks, signal.SIGCONT)
        time.sleep(THROTTLE_PERIOD_S * (1 - share))
    _signal(ranks, signal.SIGCONT)


def _fork(target, *args) -> multiprocessing.Process:
    return multiprocessing.get_context("fork").Process(target=target, args=args, daemon=True)


def busy(count: int) -> Callable[[], list[multiprocessing.Process]]:
    """``count`` plain spinners."""
    return lambda: [_fork(_spin) for _ in range(count)]


def throttle(share: float) -> Callable[[], list[multiprocessing.Process]]:
    """One process that stops this process's Ray Train ranks ``share`` of the time."""
    root = os.getpid()
    return lambda: [_fork(_throttle, root, share)]


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
            p.terminate()  # a throttle continues what it stopped on SIGTERM
            p.join()
        self.hogs = []
