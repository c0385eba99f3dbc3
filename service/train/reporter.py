"""Rank 0's outputs of the loop: MLflow step metrics (through a batching logger), progress,
the trial's end (summary, status and NaN tags)."""

from __future__ import annotations

import time

from service.step_model.trial import ARTIFACT as TIMELINE_ARTIFACT

STEP_METRICS = ("loss", "step_time_ms", "eval_loss", "eval_accuracy", "grad_rel_error", "grad_cosine")
PROGRESS_EVERY_S = 2.0


class Reporter:
    """Rank 0's outputs: MLflow step metrics (batched by the logger), progress, the end."""

    def __init__(self, logger, progress, rank: int):
        self.logger = logger if rank == 0 else None
        self.progress = progress if rank == 0 else None
        self.losses: list[float] = []
        self.last_loss = float("nan")
        self._last_progress = 0.0
        self._recorded: tuple[int, float, dict] = (0, 0.0, {})

    def record(self, step: int, step_time_ms: float, fidelity: dict | None = None) -> None:
        """A step ran: its metrics wait for its agreed loss (``log``)."""
        self._recorded = (step, step_time_ms, fidelity or {})

    def log(self, check) -> None:
        """Log the recorded step with its agreed mean loss (``check``; None: no step was pending)."""
        if check is None:
            return
        step, step_time_ms, fidelity = self._recorded
        assert step == check.step, (step, check.step)
        self.losses.append(check.mean_loss)
        self.last_loss = check.mean_loss
        if self.logger:
            self.logger.log(step, loss=check.mean_loss, step_time_ms=step_time_ms, **fidelity)
        if self.progress and time.monotonic() - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = time.monotonic()
            _call_quietly(self.progress, step, check.mean_loss)

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        if self.logger:
            self.logger.log(step, **metrics)

    def flush(self) -> None:
        if self.logger:
            self.logger.flush()

    def finish(self, summary: dict, status: str, nan_report, timeline=None) -> None:
        """The summary, status and NaN tags, and the step timeline (a TrialTimeline or None) as
        its JSON artifact; then the logger is closed."""
        if self.progress:
            _call_quietly(self.progress, int(summary["steps_done"]), self.last_loss)
        if not self.logger:
            return
        self.logger.log_summary(**summary)
        tags = {"status": status}
        if nan_report:
            tags.update(nan_source=nan_report.nan_source, nan_rank=nan_report.nan_rank,
                        first_nan_step=nan_report.first_nan_step,
                        nan_bucket_index=nan_report.bucket_index,
                        nan_params=",".join(nan_report.param_names))
            self.logger.log_dict(nan_report.to_dict(), "nan_provenance.json")
        if timeline is not None:
            self.logger.log_dict(timeline.to_json(), TIMELINE_ARTIFACT)
        self.logger.set_tags(**{k: v for k, v in tags.items() if v is not None})
        self.logger.close()


def _call_quietly(fn, *args) -> None:
    """Progress is a convenience: its failure must not fail the trial."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - deliberately broad, see docstring
        pass
