"""WHERE THE YAML IS VALIDATED: the sweep's typed configuration, its presets and its trial grid.

    cfg, path = load_config("tune_configs/quant.yaml")   # or a preset name: "quant", "configs/quant.yaml"
    for trial in cfg.trials():                            # hooks x parameter combos x world_size x seed
        print(trial.describe())

Everything a user can get wrong in a config file is caught here, before Ray starts or MLflow is
touched, and reported as one `ConfigError` line that names the field, the problem and what is
allowed. `load_config` lets nothing else escape (a hypothesis test holds it to that), because the
CLI turns ConfigError into exit status 2 and anything else would be a traceback in a user's face.

The hook names and parameters come from the hooks library (`hooks.available()`,
`hooks.validate()`), and workload names from `service.workloads.check_workload()`, so this module
never keeps a second list of either.

The modules, by what they hold:

    schema.py    the search, SweepConfig and its cross-section checks; SweepConfig.trials()
    workload.py  the workload section (what every trial trains, and how)
    compiled.py  torch.compile's modes, and the settings a compiled trial cannot run (refused)
    sections.py  the plainer sections (resources ... network) and the checks sweep axes share
    trial.py     TrialSpec: one trial of the grid, its run name and its key
    limits.py    the upper bounds no sensible sweep reaches
    loading.py   load_config: path or preset -> hardened YAML -> SweepConfig; the presets
    problems.py  pydantic's validation errors -> (field, problem) lines
    errors.py    ConfigError, FieldProblem and the text their messages are written with
"""

from service.config.errors import MAX_SHOWN_PROBLEMS, ConfigError
from service.config.limits import DDP_BUCKET_CAP_MB
from service.config.loading import PRESETS_DIR, list_presets, load_config, resolve_config_path
from service.config.schema import (CheckpointConfig, Fault, HookEntry, NetworkConfig, ReportConfig,
                                   ResourcesConfig, SearchConfig, SeedRange, StopConfig, SweepConfig,
                                   TrackingConfig)
from service.config.workload import WorkloadConfig
from service.config.trial import Scalar, TrialSpec

__all__ = ["DDP_BUCKET_CAP_MB", "MAX_SHOWN_PROBLEMS", "PRESETS_DIR", "CheckpointConfig", "ConfigError", "Fault", "HookEntry",
           "NetworkConfig", "ReportConfig", "ResourcesConfig", "Scalar", "SearchConfig", "SeedRange", "StopConfig",
           "SweepConfig", "TrackingConfig", "TrialSpec", "WorkloadConfig", "list_presets", "load_config",
           "resolve_config_path"]
