"""One trial's training on one rank: plain PyTorch, with Ray only at the entry point.

    loop.py        run_training: the loop, top to bottom (TrialResult; forward/backward, eval)
    context.py     TrainingContext: what a rank's training is given (rank, device, logger, callbacks), Start
    batches.py     GlobalBatches: which samples each rank trains on at each step
    metrics.py     StepMeter (step times), HookAccounting (the hook's counters), trial_summary
    fidelity.py    FidelitySampler: gradient fidelity on every N-th step
    step_sampling.py  TimelineSampler: the trial's DDP step sampled on a few steps, gathered at the end
    reporter.py    Reporter: rank 0's MLflow step metrics, progress and the trial's end
    faults.py      FaultInjector: configured NaN / scaled gradients and crashes
    checkpoint.py  capture / restore a rank's state; the checkpoint directory Ray merges
    ddp.py         DDP's arguments for a trial (knobs, unused parameters, buffers)
    ray_entry.py   train_loop_per_worker: the function TorchTrainer runs (pickled by module path)
    preflight.py   checks at the start of a trial, before DDP wraps the model
    nan.py         NanMonitor: the cross-rank agreement that a step is finite, and NanReport (its cause)
    training_options.py  precision (autocast), gradient clipping, the learning-rate schedule

The names below are the package's interface (the sweep, benches and tests run the loop).
"""

from service.train.batches import GlobalBatches
from service.train.checkpoint import load_checkpoint_dir, save_checkpoint_dir
from service.train.fidelity import FidelitySampler
from service.train.context import Start, TrainingContext
from service.train.loop import TrialResult, run_training
from service.train.metrics import HookAccounting, StepMeter
from service.train.reporter import Reporter
from service.train.ray_entry import train_loop_per_worker

__all__ = ["FidelitySampler", "GlobalBatches", "HookAccounting", "Reporter", "Start", "StepMeter",
           "TrainingContext", "TrialResult", "load_checkpoint_dir", "run_training", "save_checkpoint_dir",
           "train_loop_per_worker"]
