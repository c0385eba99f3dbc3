"""The command line of the sweep, run the way a user runs it: `python -m service.sweep ...`
as a subprocess, in a scratch working directory (where mlflow.db would appear)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "tune_configs" / "smoke.yaml"


def sweep(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "service.sweep", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    return lines[0]


def nothing_started(cwd: Path) -> None:
    assert not (cwd / "mlflow.db").exists(), "a rejected command must create no MLflow store"
    assert not (cwd / "mlruns").exists()
    assert not (cwd / "results").exists(), "a rejected command must start no Ray Tune run"


@pytest.mark.parametrize("content, expected", [
    ("name: x\nworkload: {name: mlp_digits, steps: 10, global_batch_size: 8, lr: 0.1}\n"
     "search: {hooks: [no_such_hook], world_size: [1]}\n", "no_such_hook"),
    ("name: x\nworkload: {name: mlp_digits, steps: -3, global_batch_size: 8, lr: 0.1}\n"
     "search: {hooks: [allreduce], world_size: [1]}\n", "steps"),
    ("name: [unclosed\n", "YAML"),
])
def test_bad_config_exits_2_with_one_line_and_creates_nothing(tmp_path, content, expected):
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    proc = sweep(str(config), cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    line = assert_one_line_error(proc)
    assert expected.lower() in line.lower()
    assert proc.stdout == ""
    nothing_started(tmp_path)


def test_missing_config_lists_the_presets(tmp_path):
    proc = sweep("no_such_config.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    line = assert_one_line_error(proc)
    for preset in ("smoke", "quant", "fp16", "all_hooks"):
        assert preset in line
    nothing_started(tmp_path)


def test_dry_run_prints_one_line_per_trial_and_the_count(tmp_path):
    proc = sweep(str(SMOKE), "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    # smoke: allreduce and quantization_perchannel(chunk_size=512) x world sizes 1, 2 x seed 0
    assert lines[-1] == "4 trials"
    trial_lines = lines[:-1]
    assert len(trial_lines) == 4
    # world size by world size, the configurations rotated one place each (config.trials)
    assert [ln.split()[0] for ln in trial_lines] == ["allreduce", "quantization_perchannel",
                                                     "quantization_perchannel", "allreduce"]
    assert ["world_size=1" in ln for ln in trial_lines] == [True, True, False, False]
    assert all("seed=0" in ln for ln in trial_lines)
    assert all("chunk_size=512" in ln for ln in trial_lines[1:3])
    nothing_started(tmp_path)


def test_design_card_path_resolves_to_the_preset(tmp_path):
    # The design card writes `python -m service.sweep configs/quant.yaml`: no such file here,
    # so the preset of that name is used, with a one-line note.
    proc = sweep("configs/quant.yaml", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "quant.yaml" in proc.stderr and "preset" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # quant: allreduce, bf16, per-tensor, per-channel c512, quantized_allreduce c512 x W {2, 4} x
    # adaptive seeds 2 to 3
    assert proc.stdout.strip().splitlines()[-1].startswith("20 to 30 trials (adaptive seeds 2 to 3)")


def test_help_explains_every_option(tmp_path):
    proc = sweep("--help", cwd=tmp_path)
    assert proc.returncode == 0
    text = proc.stdout
    from service.sweep.cli import build_parser

    for action in build_parser()._actions:
        names = action.option_strings or [action.metavar or action.dest]
        assert any(n in text for n in names), f"{names} missing from --help"
        assert action.help and len(action.help) > 20, f"{names} has no explanation"
    for word in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "preset", "Exit status"):
        assert word in text


def test_unreachable_tracking_server_fails_fast_naming_it(tmp_path):
    # Nothing listens on port 9 (discard) of 127.0.0.1 here: the sweep must say so at once,
    # before Ray starts, instead of MLflow retrying for minutes.
    uri = "http://127.0.0.1:9"
    proc = sweep(str(SMOKE), cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    line = assert_one_line_error(proc)
    assert uri in line and "does not answer" in line
    assert not (tmp_path / "mlflow.db").exists()


@pytest.fixture
def small_ray_cluster():
    """A real one-CPU Ray instance started here; yields its address for RAY_ADDRESS."""
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.mark.ray
def test_world_size_the_cluster_can_never_place_is_refused_before_any_trial(tmp_path, small_ray_cluster):
    # smoke's largest trial: world size 2 x 0.5 CPU (+ the trial driver) > the 1 CPU of this cluster.
    config = tmp_path / "big.yaml"
    config.write_text(SMOKE.read_text().replace("cpus_per_worker: 0.5", "cpus_per_worker: 1"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = sweep(str(config), cwd=tmp_path, env={"RAY_ADDRESS": small_ray_cluster, "MLFLOW_TRACKING_URI": uri})
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    line = assert_one_line_error(proc)
    assert "world_size 2" in line and "can never place" in line
    from mlflow.tracking import MlflowClient

    assert MlflowClient(tracking_uri=uri).search_experiments(filter_string="name = 'smoke'") == []


def test_sqlite_store_on_a_multi_host_cluster_is_refused_with_the_fix(monkeypatch):
    # Unit test of the driver's wiring (a multi-host cluster cannot be had on one machine):
    # ray.nodes()/cluster_resources() describe two hosts; the sweep must refuse a SQLite store.
    import ray

    from service.config import load_config
    from service.sweep.checks import check_cluster
    from service.sweep.errors import SweepError

    nodes = [{"NodeID": f"n{i}", "NodeManagerAddress": f"10.0.0.{i}", "Alive": True,
              "Resources": {"CPU": 4.0}} for i in (1, 2)]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    cfg, _ = load_config(SMOKE)
    with pytest.raises(SweepError) as err:
        check_cluster(cfg, cfg.trials(), "sqlite:////tmp/x/mlflow.db", "s3://bucket/results")
    message = str(err.value)
    assert "\n" not in message
    assert "sqlite" in message.lower() and "MLFLOW_TRACKING_URI=http" in message


def test_every_problem_of_a_bad_config_is_printed_one_line_each(tmp_path):
    """Issue 13: only the first problem was shown in full; an unknown hook's own message (its
    "did you mean") hid behind "(and 2 more problems: ...)"."""
    config = tmp_path / "bad.yaml"
    config.write_text("name: x\nworkload: {name: mlp_digits, steps: 0, lr: -1.0}\n"
                      "search: {hooks: [fp16_compres], world_size: [1]}\n")
    proc = sweep(str(config), cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 3 and all(ln.startswith("error: ") for ln in lines), proc.stderr
    text = "\n".join(lines)
    assert "search.hooks[0].name: unknown hook 'fp16_compres' (did you mean 'fp16_compress'?)" in text
    assert "workload.steps" in text and "workload.lr" in text
    assert "more problem" not in text  # each is shown in full, so no summary
    nothing_started(tmp_path)


def test_many_problems_are_capped_with_a_count(tmp_path):
    from service.config import MAX_SHOWN_PROBLEMS

    hooks = ", ".join(f"nohook{i}" for i in range(MAX_SHOWN_PROBLEMS + 3))
    config = tmp_path / "bad.yaml"
    config.write_text(f"name: x\nworkload: {{name: mlp_digits, steps: 20}}\n"
                      f"search: {{hooks: [{hooks}], world_size: [1]}}\n")
    proc = sweep(str(config), cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == MAX_SHOWN_PROBLEMS + 1, proc.stderr
    assert lines[-1] == "error: ... and 3 more problems"
