"""Progress of a running sweep: a cheap channel from each trial's rank 0 to the driver.

Ray Train's own reporting (``ray.train.report``) is a barrier across all ranks (its cost:
docs/performance.md, "Per-trial overhead"), so it cannot carry per-step progress. Instead:

- :class:`ProgressBoard` is a small Ray actor (0 CPUs) owned by the driver. It holds, per
  trial, the latest step and loss and whether the trial is running or done.
- Rank 0 of a trial calls ``progress(step, loss)`` every step; the :class:`Publisher` it
  was given drops all but one call every ``min_interval_s`` (2 s) and sends that one
  fire-and-forget (``board.update.remote``: no wait, no result), so a step never waits on it.
- The driver's :class:`ProgressPrinter` polls the board once a second and prints one line
  when something a person cares about changed (a trial started or ended, a few seconds of
  steps went by), so Ray's own log output does not drown it.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Any, TextIO

import ray

# How often rank 0 sends its step to the board, and how often the driver prints a step line.
PUBLISH_EVERY_S = 2.0
PRINT_EVERY_S = 10.0


@ray.remote(num_cpus=0)
class ProgressBoard:
    """The latest state of every trial of one sweep (driver-owned actor)."""

    def __init__(self, total: int, already_done: int = 0):
        self._total = total
        self._already_done = already_done
        self._trials: dict[str, dict[str, Any]] = {}
        self._interrupted = False
        self._round: tuple[int, int] | None = None   # adaptive seeds: (round, at most this many)

    def trial_started(self, key: str, name: str, steps: int) -> None:
        self._trials[key] = {"name": name, "steps": steps, "step": 0, "loss": None,
                             "state": "running", "started": time.time(), "status": None}

    def update(self, key: str, step: int, loss: float) -> None:
        trial = self._trials.setdefault(key, {"name": key, "steps": None, "state": "running",
                                              "started": time.time(), "status": None})
        trial["step"] = step
        trial["loss"] = loss

    def trial_ended(self, key: str, status: str) -> None:
        trial = self._trials.setdefault(key, {"name": key, "steps": None, "step": None, "loss": None,
                                              "started": time.time()})
        trial["state"] = "done"
        trial["status"] = status

    def round_started(self, round_: int, rounds: int, planned: int) -> None:
        """Adaptive seeds: round ``round_`` of at most ``rounds`` is planned, bringing the
        trials planned so far (those already done included) to ``planned``."""
        self._round = (round_, rounds)
        self._total = planned

    def add_trials(self, count: int) -> None:
        """A round beyond the grid (search.plan's) brings ``count`` more trials."""
        self._total += count

    def interrupt(self) -> None:
        """The sweep was interrupted (Ctrl-C/SIGTERM): trials whose fit fails from now on were
        torn down by it, and end KILLED rather than FAILED."""
        self._interrupted = True

    def interrupted(self) -> bool:
        return self._interrupted

    def snapshot(self) -> dict[str, Any]:
        return {"total": self._total, "already_done": self._already_done, "round": self._round,
                "trials": {k: dict(v) for k, v in self._trials.items()}}


class Publisher:
    """``progress(step, loss)`` for rank 0 of one trial: at most one fire-and-forget update
    every ``min_interval_s``; never raises into the training loop."""

    def __init__(self, board, trial_key: str, min_interval_s: float = PUBLISH_EVERY_S):
        self.board = board
        self.trial_key = trial_key
        self.min_interval_s = min_interval_s
        self._last = -math.inf

    def __call__(self, step: int, loss: float) -> None:
        now = time.monotonic()
        if now - self._last < self.min_interval_s:
            return
        self._last = now
        try:
            self.board.update.remote(self.trial_key, int(step), float(loss))
        except Exception:  # progress is a nicety: losing the board must not fail a trial
            pass

    def __getstate__(self):
        return {"board": self.board, "trial_key": self.trial_key, "min_interval_s": self.min_interval_s}

    def __setstate__(self, state):
        self.__init__(**state)


def format_progress(snapshot: dict[str, Any], now: float | None = None) -> str:
    """One line: trials done/total (with adaptive seeds: of those planned so far, and the
    round) and, for each running trial, its step and loss."""
    now = time.time() if now is None else now
    trials = snapshot["trials"].values()
    done = snapshot.get("already_done", 0) + sum(1 for t in trials if t.get("state") == "done")
    round_ = snapshot.get("round")
    parts = [f"[{done}/{snapshot['total']} trials done, round {round_[0]} of at most {round_[1]}]" if round_
             else f"[{done}/{snapshot['total']} trials done]"]
    running = [t for t in trials if t.get("state") == "running"]
    for t in running:
        step = t.get("step")
        if step:
            of = f"/{t['steps']}" if t.get("steps") else ""
            loss = f" loss {t['loss']:.4g}" if t.get("loss") is not None else ""
            parts.append(f"{t['name']}: step {step}{of}{loss}")
        else:
            parts.append(f"{t['name']}: starting ({now - t.get('started', now):.0f} s)")
    return "  ".join(parts)


class ProgressPrinter:
    """Polls a :class:`ProgressBoard` from a driver thread and prints progress lines.

    A line is printed when a trial starts or ends, and otherwise at most every
    ``print_every_s`` while steps advance.
    """

    def __init__(self, board, out: TextIO = sys.stdout, poll_s: float = 1.0,
                 print_every_s: float = PRINT_EVERY_S):
        self.board = board
        self.out = out
        self.poll_s = poll_s
        self.print_every_s = print_every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sweep-progress", daemon=True)
        self._seen_states: dict[str, str] = {}
        self._last_line = ""
        self._last_print = 0.0

    def start(self) -> "ProgressPrinter":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling, after one last look (so the last trial's end is shown)."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._poll_once()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._poll_once()

    def _poll_once(self) -> None:
        try:
            snapshot = ray.get(self.board.snapshot.remote(), timeout=10)
        except Exception:  # the board is gone (Ray shutting down): nothing to show
            return
        self._maybe_print(snapshot)

    def _maybe_print(self, snapshot: dict[str, Any]) -> None:
        changed = False
        for key, trial in snapshot["trials"].items():
            state = trial.get("state")
            if self._seen_states.get(key) != state:
                self._seen_states[key] = state
                changed = True
                if state == "done":
                    self._print(f"  trial {trial['name']} ended: {trial.get('status')}")
        # What a person follows: which trials run and their steps (not the seconds ticking by).
        signature = repr(sorted((k, t.get("state"), t.get("step")) for k, t in snapshot["trials"].items()))
        if signature == self._last_line:
            return
        if not any(t.get("state") == "running" for t in snapshot["trials"].values()):
            return  # between trials: the "ended" line said it, the next trial's start will follow
        if changed or time.monotonic() - self._last_print >= self.print_every_s:
            self._print(format_progress(snapshot))
            self._last_line = signature
            self._last_print = time.monotonic()

    def _print(self, line: str) -> None:
        print(line, file=self.out, flush=True)
