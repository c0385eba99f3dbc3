"""Where a trial's wall time goes, on rank 0: start-up until the first step, a compiled trial's
compilation (service/train/compiled.py), the training steps, the paired-timing and step-timeline
windows, evals, checkpoints, and the end of the trial
(summary, the timeline's gather). Each window is a ``with clock.time("eval"):`` statement in the
loop, so the loop shows what it times; the rest of the loop is the training steps (NaN checks
and metric logging included). The driver adds the tear-down (until TorchTrainer.fit returns)
from ``phase_ended_at`` (service/sweep/trial_runs.py), so the phases add up to the trial's wall.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

WINDOWS = ("paired", "timeline", "eval", "checkpoint")  # every trial's; "compile" only a compiled trial's


class PhaseClock:
    """Seconds per phase of one trial on this rank, made as its loop starts. ``started_at``: when
    the sweep created the trial's trainer (unix seconds; None: not under a sweep, no start-up)."""

    def __init__(self, started_at: float | None = None):
        self.started_at = started_at
        self.seconds = dict.fromkeys(WINDOWS, 0.0)
        self._loop_start = self._loop_end = time.time()

    def loop_ended(self) -> None:
        self._loop_end = time.time()

    @contextmanager
    def time(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def summary(self) -> dict[str, float]:
        """phase_*_s metrics; phase_ended_at: unix seconds at the end of the trial's own work."""
        now = time.time()
        loop = self._loop_end - self._loop_start
        out = {f"phase_{name}_s": s for name, s in self.seconds.items()}
        out["phase_train_s"] = max(0.0, loop - sum(self.seconds.values()))
        out["phase_finish_s"] = now - self._loop_end
        out["phase_ended_at"] = now
        if self.started_at is not None:
            out["phase_startup_s"] = self._loop_start - self.started_at
        return out
