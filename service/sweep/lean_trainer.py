"""``LeanTorchTrainer``: Ray Train's ``TorchTrainer`` without the helper actors a sweep's trials
never use, each a fresh Python process importing ``ray.train`` (1.3 CPU-s and more) at every trial.

Ray Train V2 (2.60) starts, for every ``fit()``, besides its controller, workers and
synchronization actor:

- a ``DatasetManager`` actor, even when the trainer has no ``datasets`` (the trials read their
  data inside the train function);
- a detached ``PlacementGroupCleaner`` actor, which removes the trial's placement group if the
  controller dies without doing so itself. A controller dies that way only with the Tune trial
  that owns it, which happens when the sweep itself is stopped; the placement group, owned by
  the sweep's job, goes with the sweep (the local Ray instance is stopped, a Ray Jobs job ends);
- a ``PreemptionWatcher`` (``RAY_TRAIN_ENABLE_PREEMPTION_WATCHER``, set off in
  service/sweep/ray_runtime.py: a sweep's trials run on nodes nobody preempts with notice);
- and, through ``TuneReportCallback``, a ``_QueueActor`` that forwards Train's checkpoint reports
  to Tune, which reads only the trial function's own final ``tune.report``.

Measured side by side (docs/performance.md, "The first hour"): 4 fewer processes per trial.
Imported only where a trainer is built (it imports torch, through ``ray.train.torch``).
"""

from __future__ import annotations

from ray.train.torch import TorchTrainer
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

# Ray Train's default callbacks that start an actor a sweep's trial does not use (module doc).
UNUSED_CALLBACKS = (DatasetsCallback, PlacementGroupCleanerCallback)


class LeanTorchTrainer(TorchTrainer):
    """A ``TorchTrainer`` (no ``datasets``) whose fit starts no DatasetManager nor
    PlacementGroupCleaner actor; everything else is Ray Train's own."""

    def __init__(self, *args, **kwargs):
        if kwargs.get("datasets"):
            raise ValueError("LeanTorchTrainer drops Ray Train's dataset callback: pass no datasets")
        super().__init__(*args, **kwargs)

    def _create_default_callbacks(self):
        return [c for c in super()._create_default_callbacks() if not isinstance(c, UNUSED_CALLBACKS)]
