"""Cluster submission on a real two-node Ray cluster on loopback, plus the rules behind it.

The cluster tests start real processes, as a person would on two machines:
  - `ray start --head` (no CPUs: it only runs the job's driver, like a production head) and a
    second `ray start --address ...` node with the CPUs and its own custom resource, both on
    127.0.0.2 (Ray rewrites 127.0.0.1 to the machine's outside address; any other loopback
    address is kept), each with its own --temp-dir and ports, and Ray's token authentication
    with a token of their own;
  - `mlflow server` on 127.0.0.1 with a SQLite backend store;
then submit a one-trial sweep (tests/one_trial_sweep.yaml) through `ray job submit` (service.submit's
sweep on a cluster: tests/test_cluster_hosts.py) and jobs that fail through `python -m service.submit`,
and read every trial back over MLflow's REST API. Everything
they start is stopped by pid (the process trees under the cluster's own temp dir) whatever the
outcome; `ray stop`, which stops every Ray process on the machine, is only a CI-only last
resort if pids did not suffice.

Ray calls to the cluster (state API, jobs API) run in subprocesses: a Ray auth token is cached
per process, and this pytest process may have used Ray with another token before.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from service.sweep import cluster as cl
from service.sweep import submit

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RAY_CLI = BIN / "ray" if (BIN / "ray").exists() else (shutil.which("ray") and Path(shutil.which("ray")))
NODE_IP = "127.0.0.2"

needs_ray_cli = pytest.mark.skipif(RAY_CLI is None, reason="Ray's CLI (`ray`) is not installed")


# ----------------------------------------------------------------------------------------------
# Unit tests of the rules (no cluster): what is refused, and that the reason is one line.

HEAD = {"NodeID": "a" * 56, "NodeManagerAddress": "10.0.0.1", "Alive": True}
SAME_HOST = {"NodeID": "b" * 56, "NodeManagerAddress": "10.0.0.1", "Alive": True}
OTHER_HOST = {"NodeID": "c" * 56, "NodeManagerAddress": "10.0.0.2", "Alive": True}
DEAD_OTHER = {"NodeID": "d" * 56, "NodeManagerAddress": "10.0.0.3", "Alive": False}


def test_hosts_count_distinct_alive_addresses():
    assert cl.cluster_hosts([HEAD, SAME_HOST, DEAD_OTHER]) == ["10.0.0.1"]
    assert cl.cluster_hosts([HEAD, OTHER_HOST]) == ["10.0.0.1", "10.0.0.2"]


@pytest.mark.parametrize(
    "uri", [None, "", "sqlite:///mlflow.db", "sqlite:////shared/mlflow.db", "./mlruns", "file:///x",
            "http://127.0.0.1:5000", "http://localhost:5000", "https://[::1]:5000"]
)
def test_tracking_uri_that_other_hosts_cannot_reach_is_refused_across_hosts(uri):
    cl.check_tracking_uri_for_cluster(uri, [HEAD, SAME_HOST])  # one host: anything goes
    with pytest.raises(cl.ClusterConfigError) as err:
        cl.check_tracking_uri_for_cluster(uri, [HEAD, OTHER_HOST])
    msg = str(err.value)
    assert "\n" not in msg and "2 hosts" in msg and "10.0.0.2" in msg


@pytest.mark.parametrize("uri", ["http://mlflow:5000", "https://mlflow.example.org",
                                 "postgresql://u@db/mlflow", "databricks"])
def test_tracking_uri_reachable_from_everywhere_is_accepted(uri):
    cl.check_tracking_uri_for_cluster(uri, [HEAD, OTHER_HOST])


def test_node_local_storage_refused_with_the_hosts_that_cannot_see_it(tmp_path):
    probed = []

    def probe(directory, nodes):
        probed.append((directory, [n["NodeManagerAddress"] for n in nodes]))
        return ["10.0.0.2"]

    with pytest.raises(cl.ClusterConfigError) as err:
        cl.check_storage_for_cluster(str(tmp_path), [HEAD, OTHER_HOST, DEAD_OTHER], probe=probe)
    msg = str(err.value)
    assert "\n" not in msg and "node-local" in msg and "10.0.0.2 cannot see it" in msg
    assert probed == [(tmp_path.resolve(), ["10.0.0.1", "10.0.0.2"])]  # dead nodes are not probed


def test_storage_is_not_probed_when_it_cannot_be_node_local(tmp_path):
    def probe(directory, nodes):
        raise AssertionError("no probe needed")

    cl.check_storage_for_cluster("s3://bucket/sweeps", [HEAD, OTHER_HOST], probe=probe)
    cl.check_storage_for_cluster(str(tmp_path), [HEAD, SAME_HOST], probe=probe)
    # a shared path that every host sees passes
    cl.check_storage_for_cluster(f"file://{tmp_path}", [HEAD, OTHER_HOST], probe=lambda d, n: [])


def test_submit_builds_a_job_that_ships_the_project_without_local_state():
    job = submit.build_job("tune_configs/smoke.yaml", {"MLFLOW_TRACKING_URI": "http://m:5000"}, "python")
    assert job["entrypoint"] == "python -m service.sweep tune_configs/smoke.yaml"
    env = job["runtime_env"]
    assert env["working_dir"] == str(ROOT)
    assert env["env_vars"] == {"MLFLOW_TRACKING_URI": "http://m:5000"}
    for local_state in (".venv", ".git", "mlflow.db", "mlruns", "results", "bench/results"):
        assert local_state in env["excludes"]


def test_storage_path_override_ships_a_validated_copy_of_the_config():
    from service.config import load_config

    rel, overlay = submit.config_in_project("smoke", "/mnt/shared/ray")
    try:
        assert rel == overlay.relative_to(ROOT).as_posix() and rel.startswith(".submit/smoke-")
        cfg, _ = load_config(overlay)
        original, _ = load_config("smoke")
        assert cfg.storage_path == "/mnt/shared/ray"
        assert cfg.model_dump(exclude={"storage_path"}) == original.model_dump(exclude={"storage_path"})
    finally:
        submit.remove_overlay(overlay)
    assert not (ROOT / submit.OVERLAY_DIR).exists()
    with pytest.raises(submit.SubmitError, match="relative"):
        submit.config_in_project("smoke", "results")
    rel, overlay = submit.config_in_project("smoke")
    assert (rel, overlay) == ("tune_configs/smoke.yaml", None)


@pytest.mark.parametrize("uri", [None, "sqlite:///mlflow.db", "mlruns", "file:mlruns"])
def test_submit_refuses_tracking_that_dies_with_the_jobs_temporary_directory(uri):
    with pytest.raises(submit.SubmitError):
        submit.check_job_tracking_uri(uri)


@pytest.mark.parametrize("uri", ["http://head:5000", "sqlite:////srv/mlflow.db", "/srv/mlruns"])
def test_submit_accepts_tracking_that_outlives_the_job(uri):
    submit.check_job_tracking_uri(uri)


def test_submit_without_address_or_with_bad_config_is_one_line_exit_2(tmp_path, monkeypatch):
    for var in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    env = {**os.environ, "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}
    no_address = _run([sys.executable, "-m", "service.submit", "smoke"], env=env, timeout=120)
    assert no_address.returncode == 2
    assert _error_lines(no_address.stderr) == [
        "error: no cluster address: pass --address http://HEAD:8265 or set RAY_ADDRESS "
        "(for a local run use python -m service.sweep)"
    ]
    outside = tmp_path / "mine.yaml"
    outside.write_text((ROOT / "tune_configs" / "smoke.yaml").read_text())
    res = _run([sys.executable, "-m", "service.submit", str(outside), "--address", "http://127.0.0.1:9"],
               env=env, timeout=120)
    assert res.returncode == 2
    [line] = _error_lines(res.stderr)
    assert "lies outside the project directory" in line


# ----------------------------------------------------------------------------------------------
# The real two-node cluster.


@dataclass
class LoopbackCluster:
    base: Path
    gcs_address: str
    dashboard_url: str
    tracking_uri: str
    env: dict[str, str]
    head_node_id: str = ""
    worker_node_id: str = ""
    mlflow: subprocess.Popen | None = None
    logs: list[Path] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _run(cmd, *, env, timeout, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _error_lines(stderr: str) -> list[str]:
    """stderr without the config loader's `note:` lines and without Ray's log noise."""
    return [l for l in stderr.splitlines() if l.strip() and not l.startswith("note:")]


def _ray_json(c: LoopbackCluster, code: str, timeout: float = 180):
    """Run `code` (which must print one JSON value last) in a fresh Python with the cluster's env."""
    res = _run([sys.executable, "-c", textwrap.dedent(code)], env=c.env, timeout=timeout)
    assert res.returncode == 0, f"helper failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def _process_trees_under(marker: str) -> set[int]:
    """Pids whose command line names `marker` (our temp dir), with all their descendants.

    Ray's workers rename themselves (ray::IDLE), so they are found as children of our raylets.
    """
    procs: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        procs[int(entry.name)] = (ppid, cmd)
    ours = {pid for pid, (_, cmd) in procs.items() if marker in cmd}
    grew = True
    while grew:
        children = {pid for pid, (ppid, _) in procs.items() if ppid in ours and pid not in ours}
        ours |= children
        grew = bool(children)
    return ours - _ancestors()


def _stop_everything(c: LoopbackCluster) -> set[int]:
    """Stop by pid what the fixture started; returns the pids still alive afterwards."""
    if c.mlflow is not None:  # its own session: the server and its workers are one process group
        for sig in (signal.SIGTERM, signal.SIGKILL):  # KILL too: uvicorn workers may outlive the TERM
            try:
                os.killpg(c.mlflow.pid, sig)
                c.mlflow.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        for pid in _process_trees_under(str(c.base)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _process_trees_under(str(c.base)):
            time.sleep(0.5)
    return _process_trees_under(str(c.base))


def _wait_http_ok(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


def _ray_start(args: list[str], temp_dir: Path, env: dict[str, str], attempts: int = 3) -> None:
    """`ray start ARGS` with its own temp dir and agent port, retried from scratch.

    Ray gives a new node's raylet a fixed 30 s to register with the GCS; on a machine crowded
    enough that this runs out, the attempt's processes are stopped and a new one starts.
    """
    for attempt in range(1, attempts + 1):
        where = temp_dir.with_name(f"{temp_dir.name}{attempt}")
        res = _run([*args, "--temp-dir", str(where), "--dashboard-agent-listen-port", str(_free_port())],
                   env=env, timeout=300)
        if res.returncode == 0:
            return
        for pid in _process_trees_under(str(where)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if attempt == attempts or "timed out during startup" not in res.stderr:
            pytest.fail(f"{' '.join(args[:3])} failed (attempt {attempt}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")


@pytest.fixture(scope="module")
def loopback_cluster():
    # Short path: Ray's unix sockets live under it and must stay below 107 characters.
    base = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    token = base / "ray_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    gcs_port, dash_port, mlflow_port = _free_port(), _free_port(), _free_port()
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # `python` on the nodes = this env
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_USAGE_STATS_ENABLED": "0",
        "OMP_NUM_THREADS": "1",
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",  # no job-runner processes for a test server
    }
    for var in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "MLFLOW_TRACKING_URI", "RAY_AUTH_TOKEN"):
        env.pop(var, None)
    c = LoopbackCluster(
        base=base,
        gcs_address=f"{NODE_IP}:{gcs_port}",
        dashboard_url=f"http://127.0.0.1:{dash_port}",
        tracking_uri=f"http://127.0.0.1:{mlflow_port}",
        env=env,
    )
    try:
        mlflow_log = base / "mlflow-server.log"
        c.logs.append(mlflow_log)
        c.mlflow = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(mlflow_port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{base}/mlflow.db",
             "--artifacts-destination", str(base / "mlartifacts")],
            cwd=base, env=env, stdout=mlflow_log.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        common = ["--node-ip-address", NODE_IP, "--disable-usage-stats",
                  "--object-store-memory", str(200 * 2**20)]
        _ray_start(
            [str(RAY_CLI), "start", "--head", "--port", str(gcs_port),
             "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash_port),
             "--ray-client-server-port", str(_free_port()),
             "--num-cpus", "0", *common],
            base / "head", env,
        )
        _ray_start(
            [str(RAY_CLI), "start", "--address", c.gcs_address, "--num-cpus", "2",
             "--resources", json.dumps({"loopback_worker": 1}), *common],
            base / "worker", env,
        )
        _wait_http_ok(f"{c.tracking_uri}/health", timeout=300, proc=c.mlflow)
        nodes = _ray_json(c, f"""
            import json, time, ray
            ray.init(address="{c.gcs_address}", log_to_driver=False)
            deadline = time.time() + 180  # (a killed start attempt's node may linger a while)
            while time.time() < deadline and len([n for n in ray.nodes() if n["Alive"]]) != 2:
                time.sleep(1)
            print(json.dumps([n for n in ray.nodes() if n["Alive"]]))
        """)
        assert len(nodes) == 2, nodes
        c.head_node_id = next(n["NodeID"] for n in nodes if n["Resources"].get("CPU", 0) == 0)
        c.worker_node_id = next(n["NodeID"] for n in nodes if "loopback_worker" in n["Resources"])
        yield c
    finally:
        left = _stop_everything(c)
        if left and os.environ.get("CI") == "true":
            subprocess.run([str(RAY_CLI), "stop", "--force"], env=env, capture_output=True, timeout=120)
            left = _process_trees_under(str(base))
        shutil.rmtree(base, ignore_errors=True)
        assert not left, f"processes of the test cluster still alive: {sorted(left)}"


def _jobs(c: LoopbackCluster) -> list[dict]:
    return _ray_json(c, f"""
        import json
        from ray.job_submission import JobSubmissionClient
        jobs = JobSubmissionClient("{c.dashboard_url}").list_jobs()
        print(json.dumps([{{"id": j.submission_id, "status": j.status.value,
                            "entrypoint": j.entrypoint, "driver_node_id": j.driver_node_id,
                            "job_id": j.job_id}}
                          for j in jobs]))
    """)


def _parent_runs(c: LoopbackCluster, experiment: str) -> dict[str, object]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=c.tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return {}
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    return {r.info.run_id: r for r in runs if "mlflow.parentRunId" not in r.data.tags}


def _assert_sweep_recorded(c: LoopbackCluster, parent_id: str, config: str) -> None:
    """Every trial of the config is a FINISHED child run with its whole loss history."""
    from mlflow.tracking import MlflowClient

    from service.config import load_config

    cfg, _ = load_config(ROOT / config)
    client = MlflowClient(tracking_uri=c.tracking_uri)
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED"
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'",
        max_results=1000,
    )
    by_name = {r.info.run_name: r for r in children}
    assert sorted(by_name) == sorted(t.run_name for t in cfg.trials())
    for name, run in by_name.items():
        assert run.info.status == "FINISHED", (name, run.info.status, run.data.tags.get("error"))
        history = client.get_metric_history(run.info.run_id, "loss")
        steps = sorted(m.step for m in history)
        assert steps == list(range(1, cfg.workload.steps + 1)), f"{name}: loss logged at steps {steps}"
        assert all(math.isfinite(m.value) for m in history)


def _assert_trials_ran_on_the_worker_node(c: LoopbackCluster, job_id: str) -> None:
    """The head has no CPUs: every training actor of the job ran on the other node."""
    placed = _ray_json(c, f"""
        import json
        from ray.util.state import list_actors
        actors = list_actors(address="{c.dashboard_url}", limit=10000, detail=True)
        print(json.dumps([[a.class_name, a.node_id, a.job_id] for a in actors]))
    """)
    jobs = {j["id"]: j for j in _jobs(c)}
    driver_node = jobs[job_id]["driver_node_id"]
    assert driver_node == c.head_node_id  # the entrypoint runs on the head
    workers = [node for cls, node, _ in placed if "TrainWorker" in cls]
    assert workers, f"no Ray Train worker actors found among {sorted({p[0] for p in placed})}"
    assert set(workers) == {c.worker_node_id}


SMOKE = "tune_configs/smoke.yaml"
# The sweeps that really run on the cluster: one trial at world size 2 (a config inside the
# shipped project, as a job needs). What they prove (the job ships the project, its trials
# train on the worker node and record into the server) needs no more; the smoke preset's 4
# trials, each ~30 s of Ray Train start-up alone, run locally in test_sweep_e2e.
ONE_TRIAL = "tests/one_trial_sweep.yaml"
# One smoke sweep (4 trials) took 12 min here on a machine shared with ~40 runnable processes;
# far less on idle cores. The limit only stops a hung job.
E2E_TIMEOUT_S = 1500


@pytest.mark.cluster
@needs_ray_cli
def test_bad_config_is_refused_locally_and_creates_no_job(loopback_cluster, tmp_path):
    c = loopback_cluster
    before = _jobs(c)
    bad = ROOT / "tune_configs" / "smoke.yaml"
    text = bad.read_text().replace("    - allreduce\n", "    - allreduse\n")
    assert "allreduse" in text
    broken = tmp_path / "broken.yaml"
    broken.write_text(text)
    env = {**c.env, "MLFLOW_TRACKING_URI": c.tracking_uri}
    res = _run([sys.executable, "-m", "service.submit", str(broken), "--address", c.dashboard_url],
               env=env, timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    [line] = _error_lines(res.stderr)
    assert line.startswith("error: ") and "allreduse" in line and "did you mean 'allreduce'" in line
    assert "Traceback" not in res.stdout + res.stderr
    assert _jobs(c) == before


@pytest.mark.cluster
@needs_ray_cli
def test_submit_exit_status_is_the_jobs_outcome(loopback_cluster):
    """A job that fails makes submit exit 1 (followed) or 0 at once (--no-wait): here the sweep
    refuses a tracking server nobody listens on, seconds after it starts on the cluster."""
    c = loopback_cluster
    dead_server = f"http://127.0.0.1:{_free_port()}"
    cmd = [sys.executable, "-m", "service.submit", SMOKE, "--address", c.dashboard_url,
           "--tracking-uri", dead_server]
    followed = _run(cmd, env=c.env, timeout=600)
    assert followed.returncode == 1, followed.stdout + followed.stderr
    job_id = next(l for l in followed.stdout.splitlines() if l.startswith("submitted job ")).split()[2].rstrip(":")
    assert f"job {job_id} FAILED" in followed.stdout
    assert dead_server in followed.stdout  # the sweep's own one-line reason, from the job's log

    started = time.monotonic()
    detached = _run(cmd + ["--no-wait"], env=c.env, timeout=600)
    assert detached.returncode == 0, detached.stdout + detached.stderr
    job_id = next(l for l in detached.stdout.splitlines() if l.startswith("submitted job ")).split()[2].rstrip(":")
    assert f"ray job logs --address {c.dashboard_url} --follow {job_id}" in detached.stdout
    deadline = started + 600
    while (status := {j["id"]: j["status"] for j in _jobs(c)}[job_id]) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert time.monotonic() < deadline, f"job {job_id} still {status}"
        time.sleep(2)
    assert status == "FAILED"


@pytest.mark.cluster
@needs_ray_cli
def test_storage_probe_reaches_both_nodes(loopback_cluster):
    c = loopback_cluster
    shared = c.base / "shared-storage"
    result = _ray_json(c, f"""
        import json, ray
        from pathlib import Path
        from service.sweep import cluster
        ray.init(address="{c.gcs_address}", log_to_driver=False)
        nodes = cluster.alive_nodes(ray.nodes())
        blind = cluster.ray_storage_probe(Path("{shared}"), nodes)
        cluster.check_storage_for_cluster("{shared}", nodes)
        cluster.check_tracking_uri_for_cluster("{c.tracking_uri}", nodes)
        print(json.dumps({{"nodes": len(nodes), "hosts": cluster.cluster_hosts(nodes), "blind": blind,
                          "left": sorted(p.name for p in Path("{shared}").iterdir())}}))
    """)
    assert result == {"nodes": 2, "hosts": [NODE_IP], "blind": [], "left": []}


# `python -m service.submit` running a sweep on a cluster, followed to its end with its
# --storage-path and trials placed on the worker nodes: tests/test_cluster_hosts.py's
# test_submitted_sweep_trains_across_the_shaped_links, on hosts with their own addresses (one
# sweep serves both; here Ray's own `ray job submit` runs the one-trial sweep).


@pytest.mark.cluster
@needs_ray_cli
@pytest.mark.timeout(E2E_TIMEOUT_S + 300)
def test_ray_job_submit_cli_runs_a_sweep(loopback_cluster):
    c = loopback_cluster
    before = set(_parent_runs(c, "one_trial"))
    runtime_env = {"env_vars": {"MLFLOW_TRACKING_URI": c.tracking_uri}}
    res = _run(
        [str(RAY_CLI), "job", "submit", "--address", c.dashboard_url, "--working-dir", ".",
         "--runtime-env-json", json.dumps(runtime_env), "--",
         "python", "-m", "service.sweep", ONE_TRIAL],
        env=c.env, timeout=E2E_TIMEOUT_S,
    )
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-6000:]
    assert "succeeded" in log.lower()
    [parent] = set(_parent_runs(c, "one_trial")) - before
    _assert_sweep_recorded(c, parent, ONE_TRIAL)
    [job_id] = set(re.findall(r"Job '([^']+)' submitted successfully", log))
    _assert_trials_ran_on_the_worker_node(c, job_id)


@pytest.mark.cluster
@needs_ray_cli
def test_probe_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = tmp_path / "transport.json"
    for args, says in ((["--world-size", "2"], "no cluster to probe: give --address"),
                       (["--address", "127.0.0.1:1", "--world-size", "1"], "--world-size 1: a collective needs 2"),
                       (["--address", "127.0.0.1:1", "--world-size", "2", "--link-gbps", "0"],
                        "--link-gbps 0: a link rate is above 0 and at most 400 Gbit/s")):
        res = _run([sys.executable, "-m", "service.probe", *args, "--out", str(out)], env=env, timeout=120)
        assert res.returncode == 2 and res.stderr.strip().startswith(f"error: {says}"), res.stderr
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.cluster
@needs_ray_cli
def test_a_probe_interrupted_mid_run_exits_130_in_one_line_and_writes_nothing(loopback_cluster, tmp_path):
    """Ctrl-C once the probe has started its Train run on the cluster (it says so), well before
    the run can end (its workers' start alone takes seconds). Waiting for the run's storage to
    fill instead raced the run's end: in a full suite (2026-12-05) the SIGINT landed after the
    probe had finished, exit 0. Under load the probe then died of SIGSEGV (exit -11, stop 50's CI;
    2 of 12 interrupts with two busy loops beside it) after its one line: the interpreter's exit
    with the probe's thread still inside Ray; it now exits at once (0 of 24 under the same load)."""
    c = loopback_cluster
    out, storage = tmp_path / "transport.json", tmp_path / "storage"
    proc = subprocess.Popen([sys.executable, "-m", "service.probe", "--address", c.gcs_address, "--world-size", "2",
                             "--storage-path", str(storage), "--out", str(out)],
                            cwd=ROOT, env=c.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # blocks until the probe says it starts, or exits
        assert line.startswith("W = 2: probing"), (line, proc.poll())
        time.sleep(1.0)
        assert proc.poll() is None, "the probe ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert _error_lines(err)[-1] == f"interrupted: nothing written to {out}", err
    assert not out.exists()


def test_gloo_is_bound_to_the_node_interface_only_across_hosts(monkeypatch):
    """Across hosts a trial's gloo binds to the interface of its node's address (a hostname
    resolving to loopback otherwise strands every rank on 127.0.0.1; tests/test_cluster_hosts.py
    trains through it); on one host Ray Train's own TorchConfig is used unchanged."""
    from ray.train.torch import TorchConfig

    assert type(cl.torch_config("gloo", [HEAD, SAME_HOST])) is TorchConfig
    assert type(cl.torch_config("nccl", [HEAD, OTHER_HOST])) is TorchConfig
    across = cl.torch_config("gloo", [HEAD, OTHER_HOST])
    assert isinstance(across, TorchConfig) and across.backend == "gloo"
    assert across.backend_cls.__name__ == "_Backend"
    assert cl.interface_with_address("127.0.0.1") == "lo"
    assert cl.interface_with_address("198.51.100.77") is None  # TEST-NET-2: on no interface here
    import ray

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    assert cl.bind_gloo_to_node_address() == "lo" and os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ens5")  # the user's choice is kept
    assert cl.bind_gloo_to_node_address() == "ens5"
