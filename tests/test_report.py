"""service.report: plots, tables and report.html rebuilt from MLflow alone.

The unit tests build a REAL MLflow SQLite store (MlflowClient, no mocks) holding runs shaped
like issue 3's contract: a parent run with the config attached, nested child runs with params,
step metrics, summary metrics and status tags, including a NaN trial, a FAILED trial, two seeds
per configuration, and a second, interrupted sweep. The data the plots are drawn from must
equal what was logged; every file must be produced; report.html must load every image in a
real headless Chromium. The same on a small real sweep: tests/test_sweep_e2e.py (it shares that
file's smoke sweep).
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

mlflow = pytest.importorskip("mlflow")  # part of the service extra: always installed by setup
from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Metric, Param, RunTag  # noqa: E402

from service import report, tracking  # noqa: E402

from service.report import plots
from service.config import TrialSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
STEPS, EVAL_EVERY, N_PARAMS = 30, 10, 10_000
CONFIG_YAML = """name: report_test
workload: {name: mlp_digits, steps: 30, eval_every: 10}
search:
  hooks: [allreduce, quantization_pertensor, {name: quantization_perchannel, chunk_size: [128, 512]}]
  world_size: [1, 2]
  seed: [0, 1]
"""

# (hook, chunk_size, accuracy per seed, wire bytes/step at W=2 as a fraction of allreduce's)
CONFIGS = [
    ("allreduce", None, (0.955, 0.965), 1.0),
    ("quantization_perchannel", 128, (0.952, 0.958), 0.28),
    ("quantization_perchannel", 512, (0.948, 0.958), 0.26),
]


def _loss_curve(seed: int, scale: float, steps: int) -> np.ndarray:
    rng = np.random.default_rng(seed * 1000 + int(scale * 100))
    t = np.arange(steps)
    return 2.3 * np.exp(-t / 8.0) * scale + 0.05 + rng.uniform(0, 0.02, steps)


def _hook_params(hook, chunk):
    """Every hook param, defaults included, as the sweep's TrialSpec holds them."""
    params = {"chunk_size": chunk} if chunk else {}
    if hook.startswith("quantization"):
        params["error_feedback"] = False
    return params


def _trial_tags(hook, chunk, world_size, seed):
    """The identity tags the sweep writes when it creates a trial's run (service.tracking)."""
    spec = TrialSpec(hook=hook, hook_params=_hook_params(hook, chunk), world_size=world_size, seed=seed)
    return tracking.identity_tags(spec)


def _log_trial(client, exp_id, parent_id, hook, chunk, world_size, seed, loss, accuracy,
               bytes_per_step, samples_per_s, state="ok", first_nan_step=None, error=None):
    """One child run, shaped like the sweep's contract (service/tracking/). Returns what was logged."""
    name = f"{hook}{f'-c{chunk}' if chunk else ''}-w{world_size}-s{seed}"
    run = client.create_run(exp_id, run_name=name,
                            tags={**_trial_tags(hook, chunk, world_size, seed), "mlflow.parentRunId": parent_id})
    params = {"hook": hook, "world_size": world_size, "seed": seed, "workload": "mlp_digits",
              "global_batch_size": 256, "steps": STEPS, "lr": 0.05, "optimizer": "sgd",
              "grad_accumulation": 1, "backend": "gloo", "torch_version": "2.13.0",
              "ray_version": "2.60.0"}
    params.update(_hook_params(hook, chunk))  # the sweep logs every hook param, defaults included
    now = int(time.time() * 1000)
    metrics = [Metric("loss", float(v), now + i, i) for i, v in enumerate(loss)]
    metrics += [Metric("step_time_ms", 5.0 + 0.1 * i, now + i, i) for i in range(len(loss))]
    evals = {}
    for step in range(EVAL_EVERY - 1, len(loss), EVAL_EVERY):
        if math.isfinite(loss[step]):
            evals[step] = accuracy - 0.2 * math.exp(-step / 10)
            metrics.append(Metric("eval_accuracy", evals[step], now + step, step))
            metrics.append(Metric("eval_loss", 1.1 * float(loss[step]), now + step, step))
    summary = {}
    if state in ("ok", "nan"):
        summary = {"samples_per_s": samples_per_s, "step_time_ms_median": 5.0,
                   "comm_bytes_per_step": bytes_per_step,
                   "compression_ratio": 4 * N_PARAMS / max(bytes_per_step, 1) if chunk else 1.0,
                   "hook_time_ms": 0.5, "final_loss": float(loss[-1]),
                   "final_eval_accuracy": accuracy if state == "ok" else math.nan,
                   "final_eval_loss": 1.1 * float(loss[-1]) if state == "ok" else math.nan,
                   "nan_detected": 1.0 if state == "nan" else 0.0}
        if first_nan_step is not None:
            summary["first_nan_step"] = float(first_nan_step)
        metrics += [Metric(k, v, now, 0) for k, v in summary.items()]
    tags = [RunTag("status", state)] + ([RunTag("error", error)] if error else [])
    if state == "nan":
        tags.append(RunTag("nan_source", "gradient after hook (bucket 0)"))
    client.log_batch(run.info.run_id, metrics=metrics,
                     params=[Param(k, str(v)) for k, v in params.items()], tags=tags)
    client.set_terminated(run.info.run_id, "FAILED" if state == "failed" else "FINISHED")
    return {"run_id": run.info.run_id, "name": name, "hook": hook, "chunk": chunk,
            "world_size": world_size, "seed": seed, "loss": np.asarray(loss, float),
            "evals": evals, "state": state, "summary": summary}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real SQLite MLflow store with one complete sweep (incl. a NaN and a FAILED trial) and,
    started after it, one interrupted sweep (a RUNNING and a KILLED trial)."""
    tmp = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{tmp}/mlflow.db"
    client = MlflowClient(uri)
    exp_id = client.create_experiment("report_test", artifact_location=(tmp / "artifacts").as_uri())
    parent = client.create_run(exp_id, run_name="sweep-report_test")
    parent_id = parent.info.run_id
    (tmp / "config.yaml").write_text(CONFIG_YAML)
    client.log_artifact(parent_id, str(tmp / "config.yaml"))
    trials = []
    for world_size in (1, 2):
        for hook, chunk, accs, fraction in CONFIGS:
            for seed, acc in zip((0, 1), accs):
                scale = 1.0 + 0.05 * (chunk or 0) / 128
                full = 2 * (world_size - 1) / world_size * 4 * N_PARAMS
                trials.append(_log_trial(
                    client, exp_id, parent_id, hook, chunk, world_size, seed,
                    _loss_curve(seed, scale, STEPS), acc, full * fraction,
                    samples_per_s=4000.0 / world_size ** 0.3 * (1 - 0.1 * (chunk is not None)) + seed))
    # quantization_pertensor at W=2: seed 0 goes NaN at step 12, seed 1 fails at step 5.
    nan_loss = _loss_curve(0, 1.0, 13)
    nan_loss[12] = math.nan
    trials.append(_log_trial(client, exp_id, parent_id, "quantization_pertensor", None, 2, 0,
                             nan_loss, 0.9, 0.25 * 4 * N_PARAMS, 3000.0, state="nan",
                             first_nan_step=12))
    trials.append(_log_trial(client, exp_id, parent_id, "quantization_pertensor", None, 2, 1,
                             _loss_curve(1, 1.0, 6), 0.0, 0, 0, state="failed",
                             error="Traceback (most recent call last):\nRuntimeError: gloo died"))
    client.set_terminated(parent_id, "FINISHED")

    time.sleep(0.01)
    running_parent = client.create_run(exp_id, run_name="sweep-report_test-interrupted")
    running = [
        _log_trial(client, exp_id, running_parent.info.run_id, "allreduce", None, 2, 0,
                   _loss_curve(0, 1.0, STEPS), 0.95, 40000.0, 3500.0),
    ]
    unfinished = client.create_run(exp_id, run_name="quantization_pertensor-w2-s0",
                                   tags={**_trial_tags("quantization_pertensor", None, 2, 0),
                                         "mlflow.parentRunId": running_parent.info.run_id})
    # Restarted from a checkpoint at step 4 in the same run: steps 4-6 are logged again.
    client.log_batch(unfinished.info.run_id,
                     metrics=[Metric("loss", 2.0 - 0.1 * i, 0, i) for i in range(7)]
                     + [Metric("loss", 1.0 - 0.1 * i, 10, i) for i in range(4, 7)],
                     params=[Param("hook", "quantization_pertensor"), Param("world_size", "2"),
                             Param("seed", "0")])
    killed = client.create_run(exp_id, run_name="quantization_perchannel-c128-w2-s0",
                               tags={**_trial_tags("quantization_perchannel", 128, 2, 0),
                                     "mlflow.parentRunId": running_parent.info.run_id})
    client.log_batch(killed.info.run_id,
                     metrics=[Metric("loss", 2.0 - 0.1 * i, 0, i) for i in range(4)],
                     params=[Param("hook", "quantization_perchannel"), Param("chunk_size", "128"),
                             Param("world_size", "2"), Param("seed", "0")])
    client.set_terminated(killed.info.run_id, "KILLED")
    return {"uri": uri, "client": client, "parent_id": parent_id, "trials": trials,
            "running_parent_id": running_parent.info.run_id, "tmp": tmp}


@pytest.fixture(scope="module")
def sweep(store):
    return report.load_sweep(report.open_store(store["uri"]), store["parent_id"])


def _label(t):
    return t["hook"] + (f"-c{t['chunk']}" if t["chunk"] else "")


def _group(trials):
    groups = {}
    for t in trials:
        groups.setdefault((t["world_size"], _label(t)), []).append(t)
    return groups


def test_load_sweep_reads_every_trial_with_its_state(store, sweep):
    assert sweep.experiment == "report_test"
    assert sweep.config_text == CONFIG_YAML and sweep.config_name == "config.yaml"
    by_id = {t.run_id: t for t in sweep.trials}
    assert set(by_id) == {t["run_id"] for t in store["trials"]}
    for logged in store["trials"]:
        trial = by_id[logged["run_id"]]
        assert trial.state == logged["state"]
        assert trial.config == _label(logged)
        assert (trial.world_size, trial.seed) == (logged["world_size"], logged["seed"])
        np.testing.assert_array_equal(trial.loss[1], logged["loss"])
    failed = next(t for t in sweep.trials if t.state == "failed")
    assert "gloo died" in failed.error


def test_loss_curve_data_equals_logged_loss(store, sweep):
    """Each curve is the per-step mean (±std) over seeds of exactly the logged finite losses."""
    curves = report.loss_curve_data(sweep)
    assert sorted(curves) == [1, 2]
    drawn = {(w, c.config): c for w, cs in curves.items() for c in cs}
    groups = _group(store["trials"])
    assert set(drawn) == set(groups)
    for key, logged in groups.items():
        curve = drawn[key]
        by_step = {}
        for t in logged:
            for step, value in enumerate(t["loss"]):
                if math.isfinite(value):
                    by_step.setdefault(step, []).append(value)
        steps = sorted(by_step)
        np.testing.assert_array_equal(curve.steps, steps)
        np.testing.assert_allclose(curve.mean, [np.mean(by_step[s]) for s in steps], rtol=1e-12)
        np.testing.assert_allclose(
            curve.std, [np.std(by_step[s], ddof=1) if len(by_step[s]) > 1 else 0 for s in steps],
            rtol=1e-12, atol=1e-15)
        assert list(curve.count) == [len(by_step[s]) for s in steps]
    # The NaN trial is marked at its first NaN step, at its last finite loss; the failed one too.
    stops = {kind: (step, value) for _, step, value, kind in
             drawn[(2, "quantization_pertensor")].stops}
    nan_trial = next(t for t in store["trials"] if t["state"] == "nan")
    failed_trial = next(t for t in store["trials"] if t["state"] == "failed")
    assert stops["nan"] == (12, nan_trial["loss"][11])
    assert stops["failed"] == (5, failed_trial["loss"][5])


def test_loss_plot_draws_exactly_the_curve_data(store, sweep, tmp_path, monkeypatch):
    """What lands on the axes is the data above: one line per configuration per panel."""
    figures = []
    real_save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (figures.append(fig),
                                                            real_save(fig, path))[1])
    curves = report.loss_curve_data(sweep)
    plots.plot_loss_curves(curves, tmp_path / "loss.png")
    axes = [ax for ax in figures[0].axes if ax.get_title().startswith("world size")]
    assert [ax.get_title() for ax in axes] == ["world size 1", "world size 2"]
    for ax, (world_size, cs) in zip(axes, curves.items()):
        lines = [l for l in ax.lines if len(l.get_xdata()) > 1 or l.get_marker() in ("None", "")]
        assert len(lines) == len(cs)
        for line, curve in zip(lines, cs):
            np.testing.assert_array_equal(line.get_xdata(), curve.steps)
            np.testing.assert_array_equal(line.get_ydata(), curve.mean)
            assert line.get_color() == plots.hook_colour(curve.hook) or \
                tuple(line.get_color()) == tuple(plots.hook_colour(curve.hook))
        markers = [l for l in ax.lines if l.get_marker() in ("X", "P")]
        assert len(markers) == (2 if world_size == 2 else 0)


def test_summary_throughput_and_tradeoff_equal_logged_metrics(store, sweep):
    groups = _group(store["trials"])
    rows = {(r.world_size, r.config): r for r in report.summary_rows(sweep)}
    assert set(rows) == set(groups)
    baseline = {(t["world_size"], t["seed"]): t["summary"]["final_loss"]
                for t in store["trials"] if t["hook"] == "allreduce"}
    for key, logged in groups.items():
        ok = [t for t in logged if t["state"] == "ok"]
        row = rows[key]
        assert row.states == {s: sum(t["state"] == s for t in logged)
                              for s in {t["state"] for t in logged}}
        for metric in ("samples_per_s", "comm_bytes_per_step", "final_eval_accuracy", "final_loss"):
            values = [t["summary"][metric] for t in ok]
            mean, std, n = row.stats[metric]
            assert n == len(values)
            if values:
                assert mean == pytest.approx(np.mean(values))
                assert std == pytest.approx(np.std(values, ddof=1) if len(values) > 1 else 0)
        gaps = [t["summary"]["final_loss"] - baseline[(t["world_size"], t["seed"])] for t in ok]
        if gaps:
            assert row.mean("loss_gap") == pytest.approx(np.mean(gaps))
    assert rows[(2, "allreduce")].mean("loss_gap") == 0
    assert rows[(2, "quantization_pertensor")].states == {"nan": 1, "failed": 1}

    lines = {l.config: l for l in report.throughput_data(sweep)}
    assert set(lines) == {"allreduce", "quantization_perchannel-c128", "quantization_perchannel-c512"}
    for config, line in lines.items():
        assert line.world_sizes == [1, 2]
        assert line.mean == pytest.approx([np.mean([t["summary"]["samples_per_s"]
                                                    for t in groups[(w, config)]]) for w in (1, 2)])

    metric, points = report.tradeoff_data(sweep)
    assert metric == "final_eval_accuracy"
    assert list(points) == [2]  # world size 1 sends nothing: left out
    by_config = {p.config: p for p in points[2]}
    for config, p in by_config.items():
        logged = groups[(2, config)]
        assert p.bytes_per_step == pytest.approx(np.mean([t["summary"]["comm_bytes_per_step"]
                                                          for t in logged]))
        assert p.quality == pytest.approx(np.mean([t["summary"]["final_eval_accuracy"]
                                                   for t in logged]))
    # allreduce: most bytes, best accuracy; c128 beats c512 on accuracy, c512 is cheapest.
    assert {c for c, p in by_config.items() if p.on_front} == set(by_config)
    assert "quantization_pertensor" not in by_config  # no trial ended ok


def test_recommendation_ranks_by_time_to_target_at_matching_quality(store, sweep):
    """The fixture's quantizers end 6-10% above allreduce's eval loss in the mean of two seeds
    (their curves are scaled up), but the two seeds scatter so much that the 95% interval holds
    the 1% tolerance: undecided, so open (never avoid), and not recommended; keep allreduce."""
    recs = {r.world_size: r for r in report.recommendations(sweep)}
    assert recs[1].choice.config == "allreduce" and recs[2].choice.config == "allreduce"
    assert recs[2].baseline.config == "allreduce" and recs[2].link == "loopback"
    avoid = dict(recs[2].avoid)
    assert avoid["quantization_pertensor"] == "1 failed, 1 nan of 2 trial(s)"
    assert set(avoid) == {"quantization_pertensor"}
    open_ = dict(recs[2].open)
    for config in ("quantization_perchannel-c128", "quantization_perchannel-c512"):
        assert "(2 seeds) vs allreduce holds +1%" in open_[config] and "at this scatter would decide it" in open_[config]
    verdicts = {c.config: c.verdict.value for c in recs[2].candidates}
    assert verdicts == {"allreduce": "baseline", "quantization_pertensor": "nan",
                        "quantization_perchannel-c128": "undecided", "quantization_perchannel-c512": "undecided"}
    # every ok trial's time to target is measured against its own seed's allreduce
    by_run = {t.run_id: t for t in sweep.trials}
    for logged in store["trials"]:
        trial = by_run[logged["run_id"]]
        if trial.state != "ok":
            assert trial.time_to_target is None
            continue
        target = 1.1 * next(t for t in store["trials"] if t["hook"] == "allreduce"
                            and (t["world_size"], t["seed"]) == (trial.world_size, trial.seed))["loss"][-1] * 1.01
        eval_steps = sorted(logged["evals"])
        reached = [s for s in eval_steps if 1.1 * logged["loss"][s] <= target]
        assert (trial.time_to_target.seconds is None) == (not reached), trial.run_name
    from service.answer.decision import sweep_answer

    here = report.headline(sweep_answer(list(recs.values())))[0]
    assert here.startswith("Here: keep allreduce at W = 2 on loopback"), here
    assert "W = 1" not in here  # one rank communicates nothing: no answer needed there
    assert here.count("allreduce") == 1  # said once, not "use allreduce: keep allreduce"


def test_build_report_writes_and_attaches_every_file(store, tmp_path):
    out = tmp_path / "report"
    html_path = report.build_report(store["parent_id"], tracking_uri=store["uri"], out_dir=out)
    assert html_path == out / "report.html"
    # logged by hand: no trial recorded a step timeline, so nothing is projected (tests/test_projection.py is)
    always = [name for name in report.REPORT_FILES if name not in report.PROJECTED_FILES]
    for name in always:
        assert (out / name).stat().st_size > 0, name
    assert not any((out / name).exists() for name in report.PROJECTED_FILES)
    for name in ("loss_curves.png", "throughput.png", "tradeoff.png"):
        image = plots.plt.imread(out / name)
        assert image.shape[0] > 200 and image.shape[1] > 300
    attached = {a.path for a in store["client"].list_artifacts(store["parent_id"])}
    assert set(always) <= attached
    assert "No trial recorded a step timeline" in html_path.read_text()

    with open(out / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 7  # 3 configurations x 2 world sizes + pertensor at W=2
    pertensor = next(r for r in rows if r["configuration"] == "quantization_pertensor")
    assert (pertensor["nan"], pertensor["failed"], pertensor["samples_per_s_mean"]) == ("1", "1", "")
    assert pertensor["verdict"] == "nan" and pertensor["seeds"] == "0 1"
    assert {(r["configuration"], r["world_size"]): r["verdict"] for r in rows if r["world_size"] == "2"} == {
        ("allreduce", "2"): "baseline", ("quantization_pertensor", "2"): "nan",
        ("quantization_perchannel-c128", "2"): "undecided", ("quantization_perchannel-c512", "2"): "undecided"}
    c512 = next(r for r in rows if r["configuration"] == "quantization_perchannel-c512"
                and r["world_size"] == "2")
    assert float(c512["final_eval_accuracy_mean"]) == pytest.approx(0.953)
    assert float(c512["final_eval_accuracy_std"]) == pytest.approx(np.std([0.948, 0.958], ddof=1))

    md = (out / "summary.md").read_text()
    assert "| quantization_perchannel-c512 | 2 | loopback | 2 | 2 ok | undecided |" in md  # seeds: how many
    assert "0.953 ± 0.007" in md
    page = html_path.read_text()
    assert "Which configuration to use" in page
    assert "Here: keep allreduce at W = 2 on loopback" in page
    assert "speed-up vs allreduce" in page and "eval-loss gap vs allreduce (CI)" in page
    # undecided is open, never avoid: the open column names both quantizers with what would decide
    avoid_cell, open_cell = page.split("<td class='left'>quantization_pertensor: 1 failed, 1 nan")[1] \
        .split("</tr>")[0].split("</td>", 1)
    assert "quantization_perchannel" not in avoid_cell
    assert "quantization_perchannel-c128: final eval loss" in open_cell and "would decide it" in open_cell
    parent = store["client"].get_run(store["parent_id"])
    assert parent.data.tags["recommended.w2.loopback"] == "allreduce"  # the answer, in MLflow
    assert parent.data.tags["verdict.w2.loopback.quantization_perchannel-c512"] == "undecided"
    assert parent.data.tags["verdict.w2.loopback.quantization_pertensor"] == "nan"
    allreduce_w2 = next(t for t in store["trials"] if t["hook"] == "allreduce" and t["world_size"] == 2)
    assert "time_to_target_s" in store["client"].get_run(allreduce_w2["run_id"]).data.metrics
    assert page.count("data:image/png;base64,") == 3
    assert "src=\"http" not in page and "<link" not in page  # self-contained
    assert "chunk_size: [128, 512]" in page  # the sweep's config
    assert "not complete" not in page


def test_report_of_interrupted_sweep_by_experiment_name(store, tmp_path):
    """The experiment name resolves to its latest sweep; running/killed trials still report."""
    html_path = report.build_report("report_test", tracking_uri=store["uri"],
                                    out_dir=tmp_path / "r", attach=False)
    page = html_path.read_text()
    assert store["running_parent_id"] in page
    assert "not complete" in page
    sweep = report.load_sweep(report.open_store(store["uri"]), store["running_parent_id"])
    assert sorted(t.state for t in sweep.trials) == ["killed", "ok", "running"]
    restarted = next(t for t in sweep.trials if t.state == "running")
    assert list(restarted.loss[0]) == list(range(7))  # a step logged twice: the latest value
    assert list(restarted.loss[1]) == pytest.approx([2.0, 1.9, 1.8, 1.7, 0.6, 0.5, 0.4])
    for name in report.REPORT_FILES:  # no trial here recorded a step timeline: nothing projected
        assert (tmp_path / "r" / name).exists() == (name not in report.PROJECTED_FILES), name
    assert not store["client"].list_artifacts(store["running_parent_id"])  # --no-attach


def _cli(*args, env_uri=None):
    env = {**os.environ, "MPLBACKEND": "Agg"}
    if env_uri:
        env["MLFLOW_TRACKING_URI"] = env_uri
    return subprocess.run([sys.executable, "-m", "service.report", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_unknown_id_is_one_line_error(store, capsys):
    result = _cli("no_such_experiment", "--no-attach", env_uri=store["uri"])
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("service.report: error: no MLflow experiment or run "
                               "'no_such_experiment'")
    assert "report_test" in lines[0]  # names what does exist
    # An id-shaped reference that is no run: same one line (in-process: a second start is slow).
    assert report.main(["0123456789abcdef0123456789abcdef", "--no-attach",
                        "--tracking-uri", store["uri"]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "0123456789abcdef0123456789abcdef" in err[0], err
    # A mistyped store path: one line, and no empty store left behind.
    missing = store["tmp"] / "typo" / "mlflow.db"
    assert report.main(["smoke", "--tracking-uri", f"sqlite:///{missing}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"service.report: error: no MLflow store at {missing} (set MLFLOW_TRACKING_URI "
                   "or --tracking-uri, or run from the directory of the sweep's mlflow.db)"]
    assert not missing.parent.exists()


def test_cli_help_and_run(store, tmp_path):
    help_text = _cli("--help").stdout
    for word in ("EXPERIMENT_OR_PARENT_RUN_ID", "--out", "--no-attach", "MLFLOW_TRACKING_URI"):
        assert word in help_text
    result = _cli(store["parent_id"], "--out", str(tmp_path / "cli"), "--no-attach",
                  env_uri=store["uri"])
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "cli" / "report.html").exists()
    assert str(tmp_path / "cli" / "report.html") in result.stdout


# --------------------------------------------------------------------------------------------
# report.html in a real headless Chromium
# --------------------------------------------------------------------------------------------

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars"]
PROBE = """<script>
window.addEventListener('load', () => {
  const images = Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete,
                                                        width: i.naturalWidth}));
  const tables = Array.from(document.querySelectorAll('table')).map(
    t => Math.ceil(t.getBoundingClientRect().right));
  const probe = document.createElement('pre');
  probe.id = 'image-probe';
  probe.textContent = JSON.stringify({images: images, tables: tables,
                                      page: document.documentElement.scrollWidth});
  document.body.appendChild(probe);
});
</script></body>"""


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "headless Chromium is missing: run scripts/setup.sh --test (apt-get install chromium)"
    return path


def run_chromium(args, tmp_path, timeout=300):
    profile = tmp_path / "chromium-profile"
    return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_report_html_renders_in_headless_chromium(store, tmp_path):
    out = tmp_path / "report"
    html_path = report.build_report(store["parent_id"], tracking_uri=store["uri"], out_dir=out,
                                    attach=False)
    # A copy with a probe script appended: the page itself carries no test code.
    probed = out / "probed.html"
    probed.write_text(html_path.read_text().replace("</body>", PROBE))
    dom = run_chromium(["--window-size=1400,3000", "--virtual-time-budget=10000", "--dump-dom",
                        probed.as_uri()], tmp_path)
    assert "image-probe" in dom.stdout, dom.stderr[-2000:]
    probe = json.loads(dom.stdout.split('<pre id="image-probe">', 1)[1].split("</pre>", 1)[0]
                       .replace("&quot;", '"'))
    images = probe["images"]
    # a 1400-px-wide page: no table runs off its right edge, nothing scrolls sideways
    assert probe["page"] <= 1400 and max(probe["tables"]) <= 1400, probe
    assert [i["alt"] for i in images] == ["loss_curves", "throughput", "tradeoff"]
    assert all(i["complete"] and i["width"] > 300 for i in images), images

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report_html.png"
    shot.unlink(missing_ok=True)
    run_chromium(["--window-size=1280,4200", f"--screenshot={shot}", html_path.as_uri()], tmp_path)
    assert shot.stat().st_size > 20_000


def test_report_html_escapes_what_mlflow_holds():
    """report.html is rendered from its Jinja2 template with autoescape: names and texts read from
    MLflow (an experiment name, the attached config) are text on the page, never markup."""
    from service.report.render import render_html

    sweep = report.Sweep(experiment="<b>exp</b>", parent_run_id="p" * 32, parent_name="n",
                         parent_status="FINISHED", started="2026-01-01 00:00 UTC",
                         tracking_uri="sqlite:///x.db", config_name="c.yaml",
                         config_text="name: <script>alert(1)</script>")
    from service.report.projected import Projected

    page = render_html(sweep, [], [], {}, "final_loss", Projected([]))
    assert "<script>" not in page and "<b>exp</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "Sweep report: &lt;b&gt;exp&lt;/b&gt;" in page
    assert "No trial has finished yet" in page and "No trial recorded a step timeline" in page


def _hand_trial(hook: str, world_size: int, seed: int, accuracy: float, bytes_per_step: float):
    """A report Trial built by hand (no store): an ok run with its summary metrics."""
    from service.answer.data import Trial
    from service.tracking.identity import TrialRecord

    metrics = {"final_eval_accuracy": accuracy, "comm_bytes_per_step": bytes_per_step, "final_loss": 1.0}
    return Trial(TrialRecord(run_id=f"{hook}-{world_size}-{seed}", run_name=f"{hook}-w{world_size}-s{seed}",
                             key=f"{hook}-w{world_size}-s{seed}", config=hook, hook=hook, hook_params={},
                             world_size=world_size, seed=seed, link_gbps=None, kind="full", status="FINISHED",
                             start_time=0, end_time=1, metrics=metrics, params={}, tags={"status": "ok"}))


def test_the_tradeoff_plot_sets_each_configuration_against_allreduce_on_the_seeds_both_ran():
    """Adaptive seeds gave allreduce a third seed (bf16_compress was decided at two); that seed's
    accuracy is 0.15 lower. Over its own three seeds allreduce would plot at 0.903 and
    bf16_compress, 0.001 from it at each shared seed, would look 5 points better: on the seeds
    both ran (as the tables' paired gaps compare) the two points sit 0.001 apart."""
    trials = [_hand_trial("allreduce", 2, s, a, 4e6) for s, a in ((0, 0.95), (1, 0.96), (2, 0.80))]
    trials += [_hand_trial("bf16_compress", 2, s, a, 2e6) for s, a in ((0, 0.951), (1, 0.961))]
    sweep = report.Sweep("e", "p", "p", "FINISHED", "", "", None, None, trials=trials)
    metric, points = report.tradeoff_data(sweep)
    assert metric == "final_eval_accuracy"
    by_config = {p.config: p for p in points[2]}
    assert by_config["allreduce"].quality == pytest.approx(0.955)
    assert by_config["bf16_compress"].quality == pytest.approx(0.956)
    assert by_config["allreduce"].quality_std == pytest.approx(np.std([0.95, 0.96], ddof=1))
    assert by_config["allreduce"].seeds == (0, 1) and by_config["bf16_compress"].seeds == (0, 1)
