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

Once per Ray instance, the first trial's controller also starts Ray Data's
``_AutoscalingCoordinatorActor`` (its fixed scaling policy sends the workers' resources to it, so
that an autoscaling cluster grows to fit). On an instance of fixed size, such as the local one a
sweep starts, nothing scales: ``autoscaling_requests=False`` leaves that actor unstarted
(1.6 CPU-s per sweep, measured side by side). On a cluster the requests stay.

Measured side by side (docs/performance.md, "Per-trial overhead"): 4 fewer processes per trial.
Imported only where a trainer is built (it imports torch, through ``ray.train.torch``).
"""

from __future__ import annotations

from ray.train.torch import TorchTrainer
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy

# Ray Train's default callbacks that start an actor a sweep's trial does not use (module doc).
UNUSED_CALLBACKS = (DatasetsCallback, PlacementGroupCleanerCallback)


class FixedScalingWithoutRequests(FixedScalingPolicy):
    """Ray Train's fixed scaling policy less its resource requests to the autoscaling coordinator
    (module doc): for a Ray instance of fixed size."""

    def after_controller_start(self, train_run_context) -> None:
        pass

    def _maybe_send_resource_request(self) -> None:
        pass


class LeanTorchTrainer(TorchTrainer):
    """A ``TorchTrainer`` (no ``datasets``) whose fit starts no DatasetManager nor
    PlacementGroupCleaner actor, and with ``autoscaling_requests=False`` no autoscaling
    coordinator; everything else is Ray Train's own."""

    def __init__(self, *args, autoscaling_requests: bool = True, **kwargs):
        if kwargs.get("datasets"):
            raise ValueError("LeanTorchTrainer drops Ray Train's dataset callback: pass no datasets")
        super().__init__(*args, **kwargs)
        self._autoscaling_requests = autoscaling_requests

    def _create_default_callbacks(self):
        return [c for c in super()._create_default_callbacks() if not isinstance(c, UNUSED_CALLBACKS)]

    def _initialize_and_run_controller(self, **controller_init_kwargs):
        policy = controller_init_kwargs["scaling_policy"]
        if not self._autoscaling_requests and type(policy) is FixedScalingPolicy:
            controller_init_kwargs["scaling_policy"] = FixedScalingWithoutRequests(policy.scaling_config)
        return super()._initialize_and_run_controller(**controller_init_kwargs)
