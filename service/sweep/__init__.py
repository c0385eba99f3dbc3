"""``python -m service.sweep CONFIG``: sweep DDP communication hooks, one Ray Train run per trial.

The shape of a sweep:

    load_config (validated before anything starts)
      -> ray.init: a local Ray instance, or the cluster RAY_ADDRESS names
      -> MLflow parent run (tracking.start_parent_run)
      -> Ray Tune, one function trial per grid point (run._run_trial), max_concurrent_trials at once
           -> MLflow child run (opened by the sweep's TrialRuns actor, service/sweep/trial_runs.py)
           -> TorchTrainer(service.train.train_loop_per_worker).fit(): world_size workers,
              rank 0 logs the trial into the child run
           -> the child run ends FINISHED, or FAILED with the error text (TrialRuns again)
      -> the parent run ends FINISHED; a table of the trials, read back from MLflow

The modules, by what they hold:

    cli.py       the command line: parser, main (exit codes, the end-of-sweep printout)
    run.py       run_sweep: Ray start, the Tune experiment, one Tune trial (_run_trial), run ends
    context.py   SweepContext: what every Tune trial of the sweep runs with, built once
    resume.py    plan_resume -> ResumePlan: what --resume continues (one read of the records)
    checks.py    before any trial: the tracking store answers, the cluster can hold the trials
    capacity.py  the CPUs and GPUs a sweep's trials need, and the one check that they fit
    network.py   network: sections: the links measured, each trial's emulated hosts
    results.py   the end-of-sweep table (read back from MLflow), the MLflow UI hint, the report
    signals.py   SIGINT/SIGTERM as KeyboardInterrupt, once
    logs.py      the sweep's log file; Ray's and MLflow's records routed into it
    paths.py     where the sweep writes: storage root, local directory, Tune's trial directories
    errors.py    SweepError: a problem the user can fix, said in one line
    trial_runs.py  TrialRuns: the actor that opens and closes the trials' MLflow runs
    progress.py  progress of a running sweep: trial rank 0s to the driver, cheaply
    ray_runtime.py  how the sweep starts and tunes Ray (environment, ray.init arguments)
    cluster.py   checks that storage and tracking reach every host of a Ray cluster
    submit.py    python -m service.submit: a sweep shipped to a Ray cluster as a Ray Job

Ray is only here: the workers see plain PyTorch (service/train/) and MLflow is only behind
service/tracking/. The Tune trial's process never imports MLflow (a CPU-heavy import on the
trial's critical path, docs/performance.md): it asks the TrialRuns actor, which imported it
once for the sweep.
"""

from service.sweep.capacity import TRIAL_DRIVER_CPUS
from service.sweep.cli import build_parser, main
from service.sweep.errors import SweepError
from service.sweep.results import SweepOutcome
from service.sweep.run import run_sweep

__all__ = ["TRIAL_DRIVER_CPUS", "SweepError", "SweepOutcome", "build_parser", "main", "run_sweep"]
