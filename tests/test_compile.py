"""torch.compile of a trial's DDP model (workload.compile, search.compile): the config's axis, its
names and keys, what it refuses; the report's like-with-like cells; and every registered hook
compiled beside eager on a real two-rank gloo group (tests/compile_checks.py), its compilation
shared by all of them. One real sweep of both arms: tests/test_compile_sweep.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import hooks
from service.config import ConfigError, SweepConfig, TrialSpec, load_config
from service.config.limits import DEFAULT_TARGET_TOLERANCE
from service.answer import recommend
from tests.compile_checks import POISONED, STEPS, check_every_hook_compiled_beside_eager
from tests.dist_utils import run_distributed
from tests.test_recommend import candidate

BASE = {"name": "compiled", "workload": {"name": "tests.tiny_workload:tiny_digits", "steps": 6, "global_batch_size": 32,
                                         "lr": 0.05, "eval_every": 6, "warmup_steps": 1},
        "search": {"hooks": ["allreduce", "fp16_compress"], "world_size": [2]}}


def _cfg(search=None, workload=None) -> SweepConfig:
    return SweepConfig.model_validate({**BASE, "search": {**BASE["search"], **(search or {})},
                                       "workload": {**BASE["workload"], **(workload or {})}})


def test_both_arms_are_named_compiled_where_the_sweep_lists_both_and_eager_keys_stay_as_they_were():
    eager, both = _cfg().trials(), _cfg({"compile": [False, True]}).trials()
    assert [t.run_name for t in both] == ["allreduce-w2-s0", "allreduce-compiled-w2-s0",
                                          "fp16_compress-w2-s0", "fp16_compress-compiled-w2-s0"]
    assert [t.key for t in both[::2]] == [t.key for t in eager] == ["allreduce[]-w2-s0",
                                                                   "fp16_compress[error_feedback=False]-w2-s0"]
    assert both[1].key == "allreduce[]-compiled-w2-s0" and "compile=True" in both[1].describe()
    assert _cfg({"compile": False}).fingerprint() == _cfg().fingerprint()  # a sweep from before resumes
    # a trial passed as a dict from before the field (Ray, --resume) is eager, its key unchanged
    old = {k: v for k, v in eager[0].to_dict().items() if k != "compile"}
    assert TrialSpec.from_dict(old) == eager[0]
    # other DDP knobs keep their key part: the compile suffix comes after it
    capped = _cfg({"compile": [False, True], "bucket_cap_mb": [1, 25]}).trials()[1]
    assert capped.key == ("allreduce[]-ddp[bucket_cap_mb=1.0,gradient_as_bucket_view=False,static_graph=False]"
                          "-compiled-w2-s0") and capped.run_name == "allreduce-b1-compiled-w2-s0"


def test_workload_compile_sets_the_mode_and_without_search_compile_compiles_every_trial():
    every = _cfg(workload={"compile": "max-autotune-no-cudagraphs"})
    assert every.search.compile == [True] and every.workload.compile_mode == "max-autotune-no-cudagraphs"
    trials = every.trials()
    assert all(t.compile for t in trials) and [t.config_label for t in trials] == ["allreduce", "fp16_compress"]
    assert _cfg(workload={"compile": True}).workload.compile_mode == "default"
    assert _cfg({"compile": [False, True]}).workload.compile_mode == "default"  # workload.compile: false
    assert every.fingerprint() != _cfg().fingerprint()


@pytest.mark.parametrize("search, workload, fragment", [
    ({"compile": True, "static_graph": True}, {}, "search.static_graph: true with compile: DDP's static_graph"),
    ({"compile": [False, True], "bucket_cap_mb": [0.5, 25]}, {}, "search.bucket_cap_mb: 0.5 with compile: "
                                                                  "torch.compile's DDPOptimizer"),
    ({}, {"compile": "fast"}, "workload.compile: 'fast' is not allowed; allowed: false, true or a torch.compile mode"),
    # CUDA graphs, both modes that use them: a graph would capture what DDP's hooks launch
    ({}, {"compile": "reduce-overhead"}, "workload.compile: 'reduce-overhead' is not allowed: its CUDA graphs would "
                                         "capture what DDP's comm hooks launch"),
    ({}, {"compile": "max-autotune"}, "workload.compile: 'max-autotune' is not allowed: its CUDA graphs would capture"),
    ({"compile": [True, True]}, {}, "search.compile: [True, True] lists a value twice"),
])
def test_what_compile_cannot_run_is_one_config_line(tmp_path, search, workload, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**BASE, "search": {**BASE["search"], **search},
                                    "workload": {**BASE["workload"], **workload}}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "\n" not in str(info.value) and fragment in str(info.value), str(info.value)


def test_a_refused_compile_exits_2_before_any_trial_starts(tmp_path):
    from tests.test_cli import assert_one_line_error, nothing_started, sweep

    path = tmp_path / "static.yaml"
    path.write_text(yaml.safe_dump({**BASE, "search": {**BASE["search"], "compile": [False, True],
                                                       "static_graph": True}}))
    proc = sweep(str(path), cwd=tmp_path, env={"PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "search.static_graph: true with compile" in assert_one_line_error(proc)
    nothing_started(tmp_path)


def test_a_compiled_cell_is_judged_against_compiled_allreduce():
    rec = recommend.recommend(2, "loopback", [candidate("allreduce-compiled", [10, 10], [1.0, 1.0], hook="allreduce"),
                                              candidate("signsgd-compiled", [8, 8], [1.05, 1.05], hook="signsgd")],
                              compiled=True)
    assert rec.baseline.config == "allreduce-compiled" and rec.key == "recommended.w2.loopback.compiled"
    [(config, why)] = rec.avoid
    assert config == "signsgd-compiled" and "vs allreduce-compiled, beyond the 1% tolerance" in why, why
    assert recommend.recommend(2, "loopback", [candidate("allreduce", [1], [1.0])]).key == "recommended.w2.loopback"


# ----------------------------------------------------------------------------- every hook, compiled


@pytest.fixture(scope="module")
def compiled():
    """Rank 0's and rank 1's runs of every hook, eager and compiled, in both DDP settings."""
    return run_distributed(check_every_hook_compiled_beside_eager, 2)


def test_ddps_own_module_compile_runs_no_compiled_graph_so_the_service_compiles_its_module(compiled):
    assert compiled[0]["module_compile_graphs"] == 0  # service/train/compiled.py's module doc


@pytest.mark.parametrize("name", list(hooks.available()))
def test_every_hook_compiled_runs_its_buckets_once_per_step_as_eager_does(compiled, name):
    for ddp in ("rebuilt", "same_buckets"):
        eager, run = compiled[0][name, ddp]["eager"], compiled[0][name, ddp]["compiled"]
        assert all(g >= 2 for g in run["graphs"]) and not any(eager["graphs"]), (ddp, run["graphs"])  # split, compiled
        assert run["calls"] == eager["calls"], (ddp, run["calls"])
        assert all(sorted(step) == list(range(len(step))) for step in run["calls"]), run["calls"]  # once per bucket
        assert len(run["calls"][-1]) >= 2  # the model spans two buckets


@pytest.mark.parametrize("name", list(hooks.available()))
def test_every_hook_compiled_puts_eagers_bytes_on_the_wire_and_trains_within_the_tolerance(compiled, name):
    same, rebuilt = compiled[0][name, "same_buckets"], compiled[0][name, "rebuilt"]
    assert same["compiled"]["wire"] == same["eager"]["wire"]  # the same buckets: every step's bytes
    assert rebuilt["compiled"]["wire"][0] == rebuilt["eager"]["wire"][0]  # before DDP's rebuild
    for run in (same, rebuilt):
        assert len(run["compiled"]["loss"]) == len(run["eager"]["loss"]) == STEPS
        gaps = [abs(c - e) / e for c, e in zip(run["compiled"]["loss"], run["eager"]["loss"])]
        assert max(gaps) <= DEFAULT_TARGET_TOLERANCE, gaps


def test_powersgd_compiled_on_eagers_buckets_follows_eager_to_float_rounding(compiled):
    """PowerSGD keeps its error, P and Q per bucket index and draws each bucket's first Q from one
    generator: on the same buckets (no rebuild) its compiled run is eager's, so a gap on rebuilt
    buckets is other random projections, not its state (bench/powersgd_compile.py measures both)."""
    for rank in (0, 1):
        same = compiled[rank]["powersgd", "same_buckets"]
        assert same["compiled"]["calls"] == same["eager"]["calls"]
        assert same["compiled"]["loss"] == pytest.approx(same["eager"]["loss"], rel=1e-5)


@pytest.mark.parametrize("name", list(hooks.available()))
def test_every_hook_compiled_names_the_nan_where_it_began(compiled, name):
    for rank in (0, 1):
        same, rebuilt = compiled[rank][name, "same_buckets"], compiled[rank][name, "rebuilt"]
        assert same["compiled"]["nan"] == same["eager"]["nan"]
        step, source, nan_rank, bucket, names = rebuilt["compiled"]["nan"]
        assert (step, source, nan_rank) == (STEPS + 1, "model_grad", POISONED) == rebuilt["eager"]["nan"][:3]
        assert "0.weight" in names and names == rebuilt["compiled"]["layout"][bucket]  # its own bucket's
