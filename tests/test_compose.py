"""docker/compose.yaml for real: the air-gapped image build, the whole stack, a sweep through it.

Root and a real Docker engine (tests/docker_engine.py; CI: scripts/setup.sh --test). Marked
``docker``: the inner loop skips it (``-m "not ray and not cluster and not docker"``).

* ``scripts/offline_images.sh build`` builds commhooks-sweep:offline from docker/Dockerfile with
  no registry and no index (a debootstrap base, the wheelhouse of this host; both cached in
  ~/.cache/commhooks-docker and in the engine) and commhooks-postgres:15;
* ``docker-compose -f docker/compose.yaml -f docker/compose.offline.yaml up`` starts Postgres,
  the MLflow server on it, a Ray head and two workers with token authentication, and the
  one-shot ``submit`` (here running tests/one_trial_sweep.yaml instead of the quant preset);
* the sweep's runs are read back from the stack's MLflow server (FINISHED, the loss of every
  step, report.html an artifact of the sweep's run) and they live in Postgres;
* ``submit``'s exit status is the job's (0), a bad config's is 2; Ray refuses a request without
  the token; ``docker-compose down -v`` leaves no container, network or volume of the project.

The build and start-up times and the image size are printed (docs/cluster.md records them).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.docker_engine import compose_cli, docker_engine

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "commhooks-sweep:offline"
pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800),
              pytest.mark.skipif(os.geteuid() != 0, reason="a Docker engine of its own needs root (CI runs as root)")]

SUBMIT = ('["sh", "-c", "python docker/wait_for_workers.py && exec python -m service.submit '
          'tests/one_trial_sweep.yaml --address http://ray-head:8265 --storage-path /data/ray-storage"]')


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


class Stack:
    def __init__(self, tmp: Path):
        self.project = f"commhooks-test-{os.getpid()}"
        override = tmp / "compose.test.yaml"
        override.write_text(f"services:\n  submit:\n    command: {SUBMIT}\n")
        self.files = [ROOT / "docker" / "compose.yaml", ROOT / "docker" / "compose.offline.yaml", override]
        self.env = {**os.environ, "IMAGE_TAG": "offline", "RAY_AUTH_TOKEN": secrets.token_hex(32),
                    "POSTGRES_PASSWORD": secrets.token_hex(16), "RAY_WORKERS": "2"}
        self.times: dict[str, float] = {}

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [*compose_cli(), "-p", self.project, *[a for f in self.files for a in ("-f", str(f))], *args]
        proc = subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check:
            assert proc.returncode == 0, f"{' '.join(args)}: {proc.stdout}{proc.stderr}"
        return proc

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.split()[0]

    def health(self) -> str:
        """Each of the stack's containers with its state and its health checks' last outputs: what
        `up` cannot say when it gives up on an "unhealthy" container."""
        label = f"label=com.docker.compose.project={self.project}"
        ids = _docker("container", "ls", "-a", "-q", "--filter", label).stdout.split()
        fmt = "{{.Name}} {{.State.Status}} {{json .State.Health}}"
        return "\n".join(_docker("inspect", "--format", fmt, i).stdout.strip()[:2000] for i in ids)

    def leftovers(self) -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        return [line for kind in ("container", "network", "volume")
                for line in _docker(kind, "ls", *(["-a"] if kind == "container" else []), "-q",
                                    "--filter", label).stdout.split()]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with docker_engine():
        t0 = time.monotonic()
        build = subprocess.run([str(ROOT / "scripts" / "offline_images.sh"), "build"], cwd=ROOT,
                               capture_output=True, text=True, timeout=1500)
        assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
        s = Stack(tmp_path_factory.mktemp("compose"))
        s.times["build (cached steps skipped)"] = time.monotonic() - t0
        t0 = time.monotonic()
        try:
            up = s.compose("up", "-d", "--no-build", "--scale", "ray-worker=2", timeout=900, check=False)
            assert up.returncode == 0, f"up: {up.stdout}{up.stderr}\n{s.health()}"
            s.times["up -d (postgres, mlflow, ray-head healthy; workers, submit started)"] = time.monotonic() - t0
            submit = s.container("submit")
            s.exit_code = int(_docker("wait", submit, timeout=1200).stdout.strip())
            s.times["submit: job done"] = time.monotonic() - t0
            s.submit_log = _docker("logs", submit).stdout + _docker("logs", submit).stderr
            yield s
        finally:
            s.compose("down", "-v", "--remove-orphans", "--timeout", "20", check=False)
            size = json.loads(_docker("image", "inspect", IMAGE).stdout or "[{}]")[0].get("Size", 0)
            print(f"\ncompose stack: image {IMAGE} {size / 1e9:.2f} GB; "
                  + "; ".join(f"{k} {v:.0f} s" for k, v in s.times.items()))


def test_submit_exits_with_the_jobs_success(stack):
    assert stack.exit_code == 0, stack.submit_log[-4000:]
    assert "SUCCEEDED" in stack.submit_log


def test_the_runs_are_read_back_from_the_stacks_mlflow_server(stack):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri="http://127.0.0.1:5000")
    exp = client.get_experiment_by_name("one_trial")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and [c.info.run_name for c in children] == ["allreduce-w2-s0"]
    assert children[0].info.status == "FINISHED" and children[0].data.tags["status"] == "ok"
    steps = sorted(m.step for m in client.get_metric_history(children[0].info.run_id, "loss"))
    assert steps == list(range(1, 31))  # every step of tests/one_trial_sweep.yaml
    artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert "report.html" in artifacts, artifacts
    path = client.download_artifacts(parents[0].info.run_id, "report.html")
    assert "<html" in Path(path).read_text().lower()


def test_the_runs_live_in_postgres(stack):
    sql = "select count(*) from runs r join experiments e using (experiment_id) where e.name = 'one_trial'"
    out = stack.compose("exec", "-T", "postgres", "psql", "-U", "mlflow", "-d", "mlflow", "-At", "-c", sql)
    assert int(out.stdout.strip()) == 2  # the sweep's run and its trial's


def test_three_ray_nodes_that_refuse_a_request_without_the_token(stack):
    code = "import ray; ray.init(address='auto'); print(sum(n['Alive'] for n in ray.nodes()))"
    out = stack.compose("exec", "-T", "ray-head", "python", "-c", code, timeout=180)
    assert out.stdout.strip().splitlines()[-1] == "3"  # the head and two workers
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen("http://127.0.0.1:8265/api/jobs/", timeout=10)
    assert err.value.code in (401, 403)
    req = urllib.request.Request("http://127.0.0.1:8265/api/jobs/",
                                 headers={"Authorization": f"Bearer {stack.env['RAY_AUTH_TOKEN']}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def test_a_bad_config_through_submit_exits_2_with_no_job(stack):
    out = stack.compose("run", "--rm", "--no-deps", "submit", "python", "-m", "service.submit",
                        "tests/no_such_config.yaml", "--address", "http://ray-head:8265", check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no_such_config" in out.stdout + out.stderr


def test_zz_compose_down_leaves_nothing(stack):
    # last in the module: the fixture's own `down` afterwards finds nothing left to remove
    assert stack.leftovers()  # the stack's containers, network and volumes, while it is up
    stack.compose("down", "-v", "--remove-orphans", "--timeout", "20")
    assert stack.leftovers() == []
