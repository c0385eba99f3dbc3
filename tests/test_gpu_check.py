"""scripts/gpu_check.sh / bench/gpu_check.py without a GPU: its --help, its one-line refusal
without CUDA, its CPU dry run (the same code paths on CPU tensors and real gloo groups at W=1
and W=2), that a wrong hook result is caught and makes it exit 1, and that its vectorised
bounds are the plain loop bounds of tests/hooks_checks.py. No Ray sweep here (the dry run
skips it by default; tests/test_sweep_e2e.py runs the CPU sweep)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import hooks_checks
from tests.dist_utils import run_distributed

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_check = _load_gpu_check()


def run_script(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_help_says_what_it_checks_and_needs():
    proc = run_script("--help", timeout=60)
    assert proc.returncode == 0, proc.stderr
    for word in ("--dry-run", "--sizes", "--sweep", "NCCL", "gloo", "60 %", "use_gpu", "CUDA", "Exit status"):
        assert word in proc.stdout, word


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the refusal cannot happen here")
def test_without_cuda_it_refuses_in_one_line_with_exit_2():
    proc = run_script(timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "torch.cuda.is_available() is False" in lines[0] and "--dry-run" in lines[0]
    assert "Traceback" not in proc.stderr


def test_bad_size_is_one_line_exit_2():
    proc = run_script("--dry-run", "--sizes", "lots", timeout=60)
    assert proc.returncode == 2
    assert "bad size 'lots'" in proc.stderr and "Traceback" not in proc.stderr


def test_dry_run_checks_every_hook_at_both_world_sizes_and_the_kernels(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = run_script("--dry-run", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    data = json.loads(out.read_text())
    assert data["settings"]["dry_run"] is True and data["wrong"] == 0
    rows = data["rows"]
    import hooks

    hook_rows = [r for r in rows if r["check"] == "hook"]
    for w in (1, 2):
        for n in gpu_check.DRY_SIZES:
            seen = {r["case"]: r for r in hook_rows if r["world_size"] == w and r["floats"] == n}
            assert set(seen) == set(hooks.available()), (w, n)
            for name, r in seen.items():
                # gloo on CPU offers every collective: nothing is skipped, every result within its bound
                assert r["result"] == "ok" and r["backend"] == "gloo" and r["device"] == "cpu", r
                assert 0 <= r["max_err_over_bound"] <= 1, r
    kernels = [r for r in rows if r["check"] == "kernel"]
    copy = [r for r in kernels if r["case"] == "copy"]
    assert len(copy) == 1 and copy[0]["pct_of_copy"] == pytest.approx(100)
    timed = [r for r in kernels if r["case"].startswith("quantize + dequantize")]
    assert len(timed) == 2 and all(r["result"] in ("ok", "slow") and r["gb_per_s"] > 0 for r in timed)
    assert all(r["result"] == "ok" for r in kernels if r["case"].startswith("codes vs"))
    sweep = [r for r in rows if r["check"] == "sweep"]
    assert len(sweep) == 1 and sweep[0]["result"] == "skipped" and "dry run" in sweep[0]["detail"]
    assert "0 wrong" in proc.stdout and f"wrote {out}" in proc.stdout


def _halving_allreduce(state, bucket):
    import hooks.basic

    fut = hooks.basic.allreduce(state, bucket)
    return fut.then(lambda f: f.value() * 0.5)


def _check_with_broken_allreduce(rank, w):
    import dataclasses

    import hooks.registry

    # this rank's process only: the registered allreduce spec with a hook that halves the mean
    registered = hooks.registry._SPECS["allreduce"]
    hooks.registry._SPECS["allreduce"] = dataclasses.replace(registered, hook=_halving_allreduce)
    return gpu_check.check_hooks(rank, w, "cpu", [4133])


@pytest.mark.parametrize("w", [1, 2])
def test_a_wrong_hook_result_is_reported_wrong(w):
    rows = run_distributed(_check_with_broken_allreduce, world_size=w)[0]
    by_hook = {r["case"]: r for r in rows}
    assert by_hook["allreduce"]["result"] == "WRONG"
    assert by_hook["allreduce"]["max_err_over_bound"] > 1
    # the plan hook at its defaults runs allreduce in every bucket, diloco's exchange runs it on
    # the pseudo-gradient: both are caught too
    assert by_hook["plan"]["result"] == "WRONG" and by_hook["diloco"]["result"] == "WRONG"
    assert all(r["result"] == "ok" for name, r in by_hook.items() if name not in ("allreduce", "plan", "diloco"))


def test_a_wrong_row_makes_it_exit_1(tmp_path, monkeypatch, capsys):
    broken = {"check": "hook", "case": "allreduce", "world_size": 1, "backend": "gloo", "device": "cpu",
              "floats": 4133, "result": "WRONG", "detail": "max |result - exact mean| / bound = 2"}
    monkeypatch.setattr(gpu_check, "run_hook_checks", lambda w, *a, **k: [broken] if w == 1 else [])
    assert gpu_check.main(["--dry-run", "--kernel-floats", "64K", "--out", str(tmp_path / "g.json")]) == 1
    assert "1 wrong" in capsys.readouterr().out
    assert json.loads((tmp_path / "g.json").read_text())["wrong"] == 1


@pytest.mark.parametrize("w", [1, 2, 3])
def test_vectorised_bounds_equal_the_plain_loop_bounds(w):
    import hooks

    n = 5037  # not a multiple of 512 nor 64
    inputs = torch.stack([hooks_checks.layered(seed=10 + r) for r in range(w)])
    for chunk in (64, 512, n):
        torch.testing.assert_close(gpu_check.quant_bound(inputs, chunk), hooks_checks.quant_bound(inputs, chunk))
    torch.testing.assert_close(gpu_check.qar_bound(inputs, 64), hooks_checks.qar_bound(inputs, 64))
    for name in ("topk", "randomk", "signsgd", "qsgd"):
        for overrides in ({}, {"majority_vote": True}) if name == "signsgd" else ({},):
            params = hooks.validate(name, **overrides)
            torch.testing.assert_close(gpu_check.bound(name, inputs, params),
                                       hooks_checks.compressor_bound(name, inputs, params), msg=name)


def test_the_sweep_config_is_one_valid_trial_with_and_without_gpu(tmp_path):
    from service.config import load_config

    for use_gpu in (True, False):
        path = tmp_path / f"gpu{use_gpu}.yaml"
        path.write_text(gpu_check.sweep_yaml(str(tmp_path / "ray"), use_gpu))
        cfg, _ = load_config(path)
        assert len(cfg.trials()) == 1 and cfg.resources.use_gpu is use_gpu
