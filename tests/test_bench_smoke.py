"""Each bench script runs in its --quick mode and writes its JSON with the keys
docs/performance.md quotes. Behaviour only: no timing is asserted (speed is measured by the
bench scripts themselves, side by side, never by tests).

The overhead and concurrency benches start a real local Ray instance and run real sweeps
(Tune -> Train -> MLflow on SQLite): slow by nature, marked ``ray``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_bench(script: str, out: Path, timeout: float, extra: list[str] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--quick", "--out", str(out), *(extra or [])],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"wrote {out}" in proc.stdout
    data = json.loads(out.read_text())
    for key in ("bench", "finished_utc", "machine", "load_average_before", "load_average_after", "settings"):
        assert key in data, key
    assert len(data["load_average_before"]) == 3
    data["_stdout"] = proc.stdout  # no bench writes this key: what it printed, for the checks that read it
    return data


def positive(x) -> bool:
    return isinstance(x, (int, float)) and x > 0


def test_instrumentation_quick_writes_paired_step_times(tmp_path):
    data = run_bench("instrumentation.py", tmp_path / "instrumentation.json", 600, ["--timeline"])
    assert data["bench"] == "instrumentation"
    assert {r["mode"] for r in data["runs"]} == {"on", "no_timeline", "off"}
    for run in data["runs"]:
        assert run["steps_measured"] == data["settings"]["steps"] - data["settings"]["warmup"] - 1
        assert positive(run["step_ms_mean"]) and positive(run["step_ms_median"]) and positive(run["cpu_ms_per_step"])
    on, off = data["summary"]["on"], data["summary"]["off"]
    assert data["overhead_fraction_mean"] == pytest.approx(on["vs_off_mean"])
    # one round: the paired ratio is exactly the two runs' ratio
    assert on["vs_off_mean"] == pytest.approx(on["step_ms_mean"] / off["step_ms_mean"] - 1)
    assert "flush_s" in data["runs"][0]
    assert data["overhead_fraction_cpu"] == pytest.approx(on["cpu_ms_per_step"] / off["cpu_ms_per_step"] - 1)
    # --timeline: "on" against itself without the step timeline, same pairing
    bare = data["summary"]["no_timeline"]
    assert data["timeline_overhead"]["step_ms_median"] == pytest.approx(on["step_ms_median"] / bare["step_ms_median"] - 1)
    runs = {r["mode"]: r for r in data["runs"]}
    assert data["timeline_overhead"]["extra_s_per_trial"] == pytest.approx(
        runs["on"]["run_training_s"] - runs["no_timeline"]["run_training_s"])


def test_error_feedback_quick_pairs_each_seed_off_and_on_with_the_reference(tmp_path):
    data = run_bench("error_feedback.py", tmp_path / "error_feedback.json", timeout=600)
    assert data["bench"] == "error_feedback"
    runs = {(r["hook"], r["params"].get("error_feedback"), r["seed"]) for r in data["rows"]}
    hook = data["settings"]["hook"]
    assert {(hook, False, 0), (hook, True, 0)} <= runs
    assert any(h == "allreduce" for h, _, _ in runs)
    assert all(positive(r["final_eval_loss"]) for r in data["rows"])


def test_paired_order_quick_reports_each_arms_ratio_by_window_order(tmp_path):
    data = run_bench("paired_order.py", tmp_path / "paired_order.json", timeout=600)
    assert data["bench"] == "paired_order"
    assert set(data["summary"]) == {"aa", "fp16_compress", "quantization_pertensor"}
    for arm in data["summary"].values():
        assert positive(arm["paired_ratio_before"]) and positive(arm["paired_ratio_after"])
        assert arm["paired_order_effect"] == pytest.approx(arm["paired_ratio_after"] / arm["paired_ratio_before"])
        assert positive(arm["step_ratio_vs_baseline"]) and arm["paired_windows"] == 6  # steps 3 to 8
    assert "order effect of the A/A arm" in data["_stdout"]


@pytest.mark.ray
@pytest.mark.timeout(1300)
@pytest.mark.ray
def test_overhead_quick_measures_bare_service_and_ray_floor(tmp_path):
    data = run_bench("overhead.py", tmp_path / "overhead.json", timeout=1200)
    assert data["bench"] == "overhead"
    assert positive(data["ray_init_s"])
    imports = data["import_cpu_s"]
    assert {"torch", "ray.train", "mlflow", "python (nothing)"} <= set(imports)
    assert all(positive(v) for v in imports.values())
    summary = data["summary"]["1"]
    for key in ("bare_wall_s", "service_wall_s", "bare_overhead_s", "service_overhead_s", "in_loop_s",
                "overhead_ratio", "train_noop_wall_s", "actor_start_s", "tune_train_noop_wall_s",
                "tune_train_noop_cpu_s", "tune_train_noop_ratio"):
        assert positive(summary[key]), key
    assert summary["overhead_ratio"] == pytest.approx(summary["service_overhead_s"] / summary["bare_overhead_s"])
    # the mandated architecture's floor (Tune trial + empty TorchTrainer), against the same bare launch
    assert summary["tune_train_noop_ratio"] == pytest.approx(summary["tune_train_noop_wall_s"] / summary["bare_overhead_s"])
    assert summary["service_over_tune_train_noop_s"] == pytest.approx(
        summary["service_overhead_s"] - summary["tune_train_noop_wall_s"])
    phases = summary["service_phases_s"]
    assert set(phases) == {"sweep_start_to_trial_start", "trainer_start", "worker_setup", "in_loop",
                           "final_report", "trainer_shutdown", "trial_end_to_sweep_end"}
    # the phases are consecutive timestamps of one trial: they add up to its wall time
    service = data["samples"]["1"]["service"][0]
    assert sum(service["phases_s"].values()) == pytest.approx(service["wall_s"], rel=0.02)
    bare = data["samples"]["1"]["bare"][0]
    assert bare["wall_s"] > bare["in_loop_s"] > 0
    # one profile of Ray settings by default (the service's), its figures also under its name
    assert data["settings"]["profiles"] == {"ours": {}}
    assert data["summary_by_profile"]["ours"]["1"]["overhead_ratio"] == pytest.approx(summary["overhead_ratio"])


@pytest.mark.ray
@pytest.mark.timeout(1300)
def test_concurrency_quick_runs_both_sweeps_and_reports_distortion(tmp_path):
    data = run_bench("concurrency.py", tmp_path / "concurrency.json", timeout=1200)
    assert data["bench"] == "concurrency"
    runs = data["runs"]
    assert set(runs) == {"1", "2"}
    for c in ("1", "2"):
        assert runs[c]["trials"] == 2
        assert len(runs[c]["samples_per_s"]) == 2 and all(positive(v) for v in runs[c]["samples_per_s"].values())
    assert data["wall_ratio_c1_over_c2"] == pytest.approx(runs["1"]["wall_s"] / runs["2"]["wall_s"])
    assert positive(data["throughput_ratio_shared_over_alone"])
    assert set(data["throughput_ratio_per_config"]) == set(runs["1"]["samples_per_s"])


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="emulated hosts need root (CI runs as root)")
def test_projection_quick_prices_the_basis_at_every_cell_and_writes_the_band(tmp_path):
    band_out = tmp_path / "band.json"
    # --quiet-cores 100: every repeat counts however busy the machine is (a behaviour check, not a timing)
    data = run_bench("projection.py", tmp_path / "projection.json", timeout=900,
                     extra=["--band-out", str(band_out), "--quiet-cores", "100"])
    rows, printed = data["rows"], data["_stdout"]
    for heading in ("projected ms", "measured ms", "error %", "median |error| %", "load average at start"):
        assert heading in printed, heading
    assert {r["hook"] for r in rows} == {"allreduce", "fp16_compress", "quantized_allreduce"}
    assert {r["link_gbps"] for r in rows} == {"loopback", 1.0} and {r["world_size"] for r in rows} == {2}
    for r in rows:
        assert positive(r["measured_ms"]) and positive(r["projected_ms"]), r
        assert r["error_pct"] == pytest.approx(100 * (r["projected_ms"] - r["measured_ms"]) / r["measured_ms"])
        assert r["counted"] == (r["why_not"] is None)
    shaped = [r for r in rows if r["link_gbps"] == 1.0]
    assert all(positive(r["link_measured_gbps"]) for r in shaped)
    band = json.loads(band_out.read_text())
    assert band["format"] == 2 and band["source"] == "bench/projection.py" and band["basis"] == "loopback, W=2"
    assert {(b["hook"], b["world_size"]) for b in band["bands"]} == {(r["hook"], 2) for r in rows}
    assert {b["hook"]: b["error_feedback"] for b in band["bands"]} == {
        "allreduce": None, "fp16_compress": True, "quantized_allreduce": True}  # the bench runs it on
    for b in band["bands"]:
        assert b["counted"] + b["excluded"] == 1, b  # one held-out cell per hook in --quick
        if b["counted"]:
            assert b["low_pct"] <= b["high_pct"] and b["median_abs_pct"] >= 0
    assert set(band["overall"]) == {"low_pct", "high_pct", "median_abs_pct"} and len(band["load_average"]) == 2
    assert set(data["time_to_target"]["hooks"]) == {r["hook"] for r in rows}
    # the committed cells beside the band re-derive it
    cells = band_out.with_name(band["raw"])
    again = tmp_path / "again.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "projection.py"), "--summarise", str(cells),
                           "--band-out", str(again)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert {k: v for k, v in json.loads(again.read_text()).items() if k != "measured"} == {
        k: v for k, v in band.items() if k != "measured"}


@pytest.mark.skipif(os.geteuid() != 0, reason="emulated hosts need root (CI runs as root)")
def test_probe_cpu_quick_splits_each_collective_into_cpu_and_waiting(tmp_path):
    from service.network import host_cpu
    from service.network.names import owner_of, pid_alive

    before = set(host_cpu.list_cgroups())
    data = run_bench("probe_cpu.py", tmp_path / "probe_cpu.json", timeout=600)
    rows, printed = data["rows"], data["_stdout"]
    assert "fixed cost per collective (4 KiB)" in printed and "waiting ms (wall - CPU / q)" in printed
    assert "W x CPU / cores ms" in printed
    # both arms, alternated: every thread in the host's quota, and gloo's threads apart from it
    assert {(r["arm"], r["world_size"], r["kind"]) for r in rows} == {
        (a, 2, k) for a in ("quota", "apart") for k in ("allreduce", "allgather", "all_to_all")}
    # the hosts' cgroups and the comm threads' are gone: none made since is left by an owner that
    # has exited (the bench's; a test running beside this one may hold hosts of its own meanwhile)
    owners = {p: owner_of(os.path.basename(p)) for p in set(host_cpu.list_cgroups()) - before}
    left = [p for p, owner in owners.items() if owner is None or not pid_alive(owner)]
    assert left == []
    for r in rows:
        assert positive(r["wall_ms"]) and positive(r["cpu_ms"]), r
        assert r["cpu_at_share_ms"] == pytest.approx(r["cpu_ms"] / data["settings"]["q"], abs=0.01)  # each rounded to 1 µs
        assert r["waiting_ms"] == pytest.approx(r["wall_ms"] - r["cpu_at_share_ms"], abs=0.01)
    for hosts in data["hosts"]:  # each arm's probe ran on two hosts of q cores, one rank each, not on loopback
        assert (hosts["hosts"], hosts["ranks_per_host"], hosts["loopback"]) == (2, 1, False)
    # read before the threads moved: the main thread stays in the host's quota in both arms
    assert [h["cores"] for h in data["hosts"]] == pytest.approx([data["settings"]["q"]] * 2)


def test_projection_summarise_adds_the_hooks_committed_cells_lack_from_a_later_run(tmp_path):
    """--summarise COMMITTED NEW --band-out: the hooks (and settings) the committed cells lack come
    from the later run's cells, with their provenance; the hooks both have keep the committed rows."""
    from service.step_model.bands import error_bands

    def cell(hook, w, error):
        return {"hook": hook, "error_feedback": None, "world_size": w, "link_gbps": 1.0, "link_measured_gbps": 1.0,
                "latency_ms": 0.05, "projected_ms": 100 + error, "measured_ms": 100.0, "error_pct": error,
                "quiet_repeats": 3, "repeats": 3, "counted": True, "why_not": None}

    def cells_file(path, measured, rows):
        path.write_text(json.dumps({"format": 2, "source": "bench/projection.py", "measured": measured,
                                    "workload": "char_lm", "basis": "hosts", "cells": "W=2 x 1", "cell_rows": rows,
                                    "load_average": [1.0, 1.0], "error_feedback": [True, False]}))
        return path

    committed = cells_file(tmp_path / "projection_cells_cluster.json", "2026-12-01T00:00:00Z",
                           [cell("allreduce", 2, -3.0), cell("allreduce", 2, -2.0)])
    later = cells_file(tmp_path / "later_cells.json", "2026-12-05T00:00:00Z",
                       [cell("allreduce", 2, 9.0), cell("diloco", 2, -5.0), cell("diloco", 2, 4.0)])
    out = tmp_path / "projection_error_cluster.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "projection.py"), "--summarise", str(committed),
                           str(later), "--band-out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    bands = error_bands(out)
    ar, dl = bands.for_cell("allreduce", None, 2), bands.for_cell("diloco", None, 2)
    assert (ar.low_pct, ar.high_pct, dl.low_pct, dl.high_pct) == (-3.0, -2.0, -5.0, 4.0)
    merged = json.loads(committed.read_text())
    assert len(merged["cell_rows"]) == 4 and merged["added"][0]["hooks"] == ["diloco"]
    assert (tmp_path / "projection_pairs_cluster.json").exists()


def test_projection_summarise_keeps_a_later_runs_fsdp_rows_apart_from_the_same_hooks_ddp_ones(tmp_path):
    """--summarise COMMITTED NEW --band-out with NEW an fsdp run (bench/projection.py --parallelism
    fsdp): its rows are added beside the committed ddp rows of the same hooks, each all-gather
    format kept apart; the bands, cells and pairs carry parallelism and all_gather, the ddp ones
    stay as they were (no field: ddp), and the report takes each trial's own."""
    from service.step_model.bands import error_bands
    from service.step_model.pairs import Configured, pair_bands

    def cell(hook, ef, w, link, error, sharding=None):
        return {"hook": hook, "error_feedback": ef, **(sharding or {}), "world_size": w, "link_gbps": link,
                "link_measured_gbps": link, "latency_ms": 0.05, "projected_ms": 100 + error, "measured_ms": 100.0,
                "error_pct": error, "quiet_repeats": 3, "repeats": 3, "counted": True, "why_not": None}

    def cells_file(path, measured, rows):
        path.write_text(json.dumps({"format": 2, "source": "bench/projection.py", "measured": measured,
                                    "workload": "char_lm", "basis": "hosts", "cells": "W=4 x 0.5,1", "cell_rows": rows,
                                    "load_average": [1.0, 1.0], "error_feedback": [True, False]}))
        return path

    fsdp, uint8 = {"parallelism": "fsdp", "all_gather": "fp32"}, {"parallelism": "fsdp", "all_gather": "uint8"}
    committed_rows = [cell(h, ef, 4, link, e) for h, ef, e in (("allreduce", None, -2.0), ("quantized_allreduce", False, 1.0))
                      for link in (0.5, 1.0)]
    committed = cells_file(tmp_path / "projection_cells_cluster.json", "2026-12-01T00:00:00Z", committed_rows)
    later_rows = [cell("allreduce", None, 4, link, -6.0 - link, fsdp) for link in (0.5, 1.0)]
    later_rows += [cell("quantized_allreduce", False, 4, link, 3.0 * link, fsdp) for link in (0.5, 1.0)]
    later_rows += [cell("quantized_allreduce", False, 4, link, 9.0 * link, uint8) for link in (0.5, 1.0)]
    later = cells_file(tmp_path / "fsdp_cells.json", "2026-12-06T00:00:00Z", later_rows)
    out = tmp_path / "projection_error_cluster.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "projection.py"), "--summarise", str(committed),
                           str(later), "--band-out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "fsdp W=4: -7.0 .. 9.0 %" in proc.stdout and "ddp W=4: -2.0 .. 1.0 %" in proc.stdout
    written = json.loads(out.read_text())["bands"]
    assert [b.get("parallelism", "ddp") for b in written] == ["ddp", "ddp", "fsdp", "fsdp", "fsdp"]
    assert "parallelism" not in written[0] and written[4]["all_gather"] == "uint8"
    bands = error_bands(out)
    band = {(h, p, g): bands.for_cell(h, ef, 4, p, g) for h, ef, p, g in (
        ("allreduce", None, "ddp", None), ("allreduce", None, "fsdp", None),
        ("quantized_allreduce", False, "ddp", None), ("quantized_allreduce", False, "fsdp", "fp32"),
        ("quantized_allreduce", False, "fsdp", "uint8"))}
    assert [(b.low_pct, b.high_pct) for b in band.values()] == [
        (-2.0, -2.0), (-7.0, -6.5), (1.0, 1.0), (1.5, 3.0), (4.5, 9.0)]
    merged = json.loads(committed.read_text())
    assert len(merged["cell_rows"]) == 10 and merged["added"][0]["hooks"] == [
        "allreduce under fsdp, fp32 all-gather", "quantized_allreduce under fsdp, fp32 all-gather",
        "quantized_allreduce under fsdp, uint8 all-gather"]
    pairs = pair_bands(tmp_path / "projection_pairs_cluster.json")
    ddp_pair = pairs.for_pair(Configured("quantized_allreduce", False), Configured("allreduce", None), 4)
    fsdp_pair = pairs.for_pair(Configured("quantized_allreduce", False, "fsdp", "uint8"),
                               Configured("allreduce", None, "fsdp"), 4)
    assert ddp_pair.measured and fsdp_pair.measured and ddp_pair.source != fsdp_pair.source
    assert fsdp_pair.source == ("measured for quantized_allreduce with error feedback off under fsdp, uint8 all-gather "
                                "against allreduce under fsdp, fp32 all-gather")


def test_projection_summarise_re_derives_the_bands_from_the_committed_cells(tmp_path):
    """bench/projection.py --summarise on a projection_cells.json: the bands per hook, error
    feedback and W again, in the format the report reads."""
    from service.step_model.bands import error_bands

    def cell(hook, w, link, error, counted=True):
        return {"hook": hook, "world_size": w, "link_gbps": link, "link_measured_gbps": link, "latency_ms": 0.05,
                "projected_ms": 100 + error, "measured_ms": 100.0, "error_pct": error, "quiet_repeats": 3,
                "repeats": 3, "counted": counted, "why_not": None if counted else "not carried"}

    cells = [cell("allreduce", 2, 1.0, -3.0), cell("allreduce", 2, 0.5, 2.0), cell("allreduce", 4, 0.5, -9.0),
             cell("topk", 2, 1.0, 5.0), cell("topk", 4, 1.0, 40.0, counted=False)]
    saved = tmp_path / "projection_cells.json"
    saved.write_text(json.dumps({"format": 2, "source": "bench/projection.py", "measured": "2026-12-02T10:00:00Z",
                                 "workload": "char_lm", "basis": "loopback, W=2", "cells": "W=2,4 x 0.5,1",
                                 "cell_rows": cells,
                                 "load_average": [1.0, 1.0], "error_feedback": True}))
    out = tmp_path / "projection_error.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "projection.py"), "--summarise", str(saved),
                           "--band-out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    bands = error_bands(out)
    ar2, ar4 = bands.for_cell("allreduce", None, 2), bands.for_cell("allreduce", None, 4)
    assert (ar2.low_pct, ar2.high_pct, ar4.low_pct, ar4.high_pct) == (-3.0, 2.0, -9.0, -9.0)
    topk = bands.for_cell("topk", True, 4)   # W = 4 not counted for topk: its W = 2 band, beyond it
    assert (topk.low_pct, topk.high_pct, topk.where()) == (5.0, 5.0, "checked at W = 2, used beyond it")


@pytest.mark.slow
def test_trees_alternates_a_bench_between_two_checkouts_and_pairs_them(tmp_path):
    """bench/trees.py with this checkout as both arms: each repeat runs both, the first arm
    alternates, and the ratio is read from the script's own JSON (through a list, by index). The
    other arm runs with --other-python (here a wrapper of this interpreter that logs each call).
    The bench it alternates is the quickest one's --quick (four runs of it)."""
    out, calls = tmp_path / "trees.json", tmp_path / "other_python_calls"
    other_python = tmp_path / "other-python"
    other_python.write_text(f'#!/bin/sh\necho "$2" >> {calls}\nexec {sys.executable} "$@"\n')
    other_python.chmod(0o755)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "trees.py"), str(ROOT), "--repeat", "2",
                           "--other-python", str(other_python),
                           "--key", "summary.0.allreduce", "--out", str(out), "--", "error_feedback.py", "--quick"],
                          cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in proc.stdout
    data = json.loads(out.read_text())
    assert [row[1] for row in data["rows"]] == ["this", "other"]          # who went first
    for _, _, this, other, ratio in data["rows"]:
        assert positive(this) and positive(other) and ratio == pytest.approx(this / other - 1)
    assert "median of 2 paired repeats" in proc.stdout
    assert calls.read_text().split() == ["--quick", "--quick"]  # the other arm's two runs, and only those
    assert data["pythons"] == {"this": sys.executable, "other": str(other_python)}


def test_cluster_check_refuses_a_machine_with_fewer_than_16_cores_in_one_line(tmp_path):
    res = subprocess.run(["bash", str(ROOT / "scripts/cluster_check.sh")], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{_fake_nproc(tmp_path, 2)}:{os.environ['PATH']}"})
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        "cluster_check: needs at least 16 cores (a core per emulated host at W = 16); this machine has 2"]


def test_cluster_check_runs_the_held_out_cells_at_w_8_and_16_with_every_hook_through_the_bench(tmp_path, monkeypatch):
    # on 16 cores the script hands bench/projection.py its arguments: they parse there (a
    # renamed flag fails here, not on the borrowed machine)
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import projection as bench_projection

    seen = tmp_path / "argv"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nshift\nprintf '%s\\n' \"$@\" > {seen}\n")
    python.chmod(0o755)
    res = subprocess.run(["bash", str(ROOT / "scripts/cluster_check.sh")], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHON": str(python),
                              "PATH": f"{_fake_nproc(tmp_path, 16)}:{os.environ['PATH']}"})
    assert res.returncode == 0, res.stderr
    args = bench_projection.parse(seen.read_text().split())
    assert args.world_sizes == [2, 8, 16] and args.links == [0.5, 1.0] and args.hooks is None  # every hook
    assert args.error_feedback == ["on", "off"] and args.comm_apart and args.host_cpus * 16 <= 16 - 0.4


def _fake_nproc(folder: Path, cores: int) -> Path:
    """A folder whose nproc says ``cores``: the script's core count, as another machine would give it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "nproc").write_text(f"#!/bin/sh\necho {cores}\n")
    (folder / "nproc").chmod(0o755)
    return folder
