"""MetricLogger: rank 0's batching writer of a trial's step metrics and summary."""

from __future__ import annotations

import time
from typing import Any

from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from service.config.limits import DEFAULT_FLUSH_SECONDS
from service.tracking.runs import set_tags
from service.tracking.store import MAX_METRICS_PER_BATCH, resolve_tracking_uri


class MetricLogger:
    """Batching metric logger for one run (used by rank 0 of a trial).

    ``log(step, **metrics)`` buffers points; the buffer goes out as ``log_batch`` requests
    when ``flush_seconds`` have passed since the last flush, on ``flush()`` and on
    ``close()``. Within each key, points are sent in step order, so a crash leaves a prefix
    of each key's history in the store. ``skip_through`` ({key: step}) drops points at or
    below a step that a previous attempt of the trial already logged.
    """

    def __init__(self, run_id: str, tracking_uri: str | None = None, flush_seconds: float = DEFAULT_FLUSH_SECONDS,
                 skip_through: dict[str, int] | None = None):
        self.run_id = run_id
        self.tracking_uri = tracking_uri or resolve_tracking_uri()
        self.flush_seconds = float(flush_seconds)
        self.skip_through = dict(skip_through or {})
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        self._buffer: list[Metric] = []
        self._last_flush = time.monotonic()
        self.points_logged = 0
        self.flush_seconds_spent = 0.0

    def log(self, step: int, **metrics: float) -> None:
        """Buffer one point per metric at ``step``; flush if it is time."""
        now_ms = int(time.time() * 1000)
        for key, value in metrics.items():
            if step <= self.skip_through.get(key, -1):
                continue
            self._buffer.append(Metric(key, float(value), now_ms, int(step)))
        if time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def log_points(self, points: list[tuple[str, float, int, int]]) -> None:
        """Points stamped elsewhere, (key, value, timestamp ms, step) each (rank 0's, sent to the
        sweep's TrialRuns actor), buffered as ``log`` buffers them (``skip_through`` applies);
        flush if it is time."""
        for key, value, timestamp_ms, step in points:
            if step > self.skip_through.get(key, -1):
                self._buffer.append(Metric(key, float(value), int(timestamp_ms), int(step)))
        if time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def log_summary(self, step: int = 0, **metrics: float) -> None:
        """Log summary metrics (one value each) and flush."""
        now_ms = int(time.time() * 1000)
        self._buffer.extend(Metric(k, float(v), now_ms, int(step)) for k, v in metrics.items())
        self.flush()

    def set_tags(self, **tags: Any) -> None:
        """Set tags right away (rare: status, provenance)."""
        set_tags(self.run_id, self.tracking_uri, **tags)

    def log_dict(self, dictionary: dict, artifact_file: str) -> None:
        """Store ``dictionary`` as a JSON (or YAML) artifact of the run."""
        self._client.log_dict(self.run_id, dictionary, artifact_file)

    def flush(self) -> None:
        """Send the buffered points, at most 1000 per request."""
        started = time.monotonic()
        while self._buffer:
            chunk = self._buffer[:MAX_METRICS_PER_BATCH]
            self._send(chunk)
            del self._buffer[:len(chunk)]
            self.points_logged += len(chunk)
        self._last_flush = time.monotonic()
        self.flush_seconds_spent += self._last_flush - started

    def _send(self, chunk: list[Metric], attempts: int = 3) -> None:
        # A shared SQLite file can be briefly locked by another writer (the driver, another
        # trial): retry a couple of times before giving up.
        for attempt in range(attempts):
            try:
                self._client.log_batch(self.run_id, metrics=chunk)
                return
            except MlflowException:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.5 * (attempt + 1))

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> "MetricLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
