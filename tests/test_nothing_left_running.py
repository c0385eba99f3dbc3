"""A sweep leaves nothing running, however it ends: three short sweeps back to back through
`python -m service.sweep` (a local Ray, a SQLite MLflow store) under tests/reaper.py, a child
subreaper, so any process a sweep's Ray instance leaves behind (a Train controller reparented
when its raylet went) is found as the reaper's descendant afterwards rather than hiding under
init. One sweep ends ok (a W = 2 user model with a parameter unused in training, the case that
once left a `ray::TrainController` behind), one with its trial refused (exit 1), one by Ctrl-C
(exit 130)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
SWEEP = """
name: {name}
workload:
  name: {workload}
  steps: {steps}
  eval_every: 5
  warmup_steps: 1
  find_unused_parameters: {unused}
search:
  hooks: [allreduce]
  world_size: [{world_size}]
  seed: [0]
resources:
  cpus_per_worker: 1
  max_concurrent_trials: 1
tracking:
  transport_probe: false
"""


def _config(tmp: Path, name: str, workload: str, steps: int, world_size: int, unused: str = "auto") -> str:
    path = tmp / f"{name}.yaml"
    path.write_text(SWEEP.format(name=name, workload=workload, steps=steps, world_size=world_size, unused=unused))
    return str(path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a child subreaper is a Linux prctl")
def test_back_to_back_sweeps_leave_no_process_of_their_ray_instances(tmp_path):
    import subprocess

    sweep = [sys.executable, "-m", "service.sweep"]
    ok = _config(tmp_path, "left_ok", "tests.user_models:eval_only_head", 10, 2)
    refused = _config(tmp_path, "left_refused", "tests.user_models:eval_only_head", 10, 2, unused="false")
    interrupted = _config(tmp_path, "left_interrupted", "tests.tiny_workload:tiny_digits", 20000, 1)
    commands = [sweep + [ok], sweep + [refused], ["SIGINT@30"] + sweep + [interrupted]]
    out = tmp_path / "left.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    argv = [sys.executable, str(ROOT / "tests" / "reaper.py"), str(out), "--"]
    for i, command in enumerate(commands):
        argv += (["---"] if i else []) + command
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["exit_codes"] == [0, 1, 130], done.stderr[-3000:]
    assert result["left"] == {}, result["left"]
    assert "could not stop" not in done.stdout
