"""Submit a sweep to an existing Ray cluster as a Ray Job.

    python -m service.submit CONFIG --address http://HEAD:8265

The config is validated here first (same one-line errors as the sweep; nothing is
submitted when it is wrong). The project directory is shipped as the job's working_dir,
minus virtual environments, local MLflow stores and results; the job runs
`python -m service.sweep CONFIG` on the head node with MLFLOW_TRACKING_URI (and any
--env settings) in its runtime environment, so every trial worker sees them too.

Exit status: 0 the job SUCCEEDED (or was submitted, with --no-wait); 1 it FAILED;
3 it was STOPPED; 2 nothing was submitted (bad config, bad option, cluster unreachable).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import sys
import time
import uuid
from pathlib import Path

from service import uris
from service.text import one_line

PROJECT_ROOT = Path(__file__).resolve().parents[2]

# Never shipped to the cluster: environments, local tracking stores, outputs, VCS data.
# (Ray also honours the project's .gitignore; these hold even without one.)
WORKING_DIR_EXCLUDES = [
    ".git",
    ".venv",
    "venv",
    "**/__pycache__",
    "*.egg-info",
    ".pytest_cache",
    ".hypothesis",
    "mlflow.db",
    "mlruns",
    "mlartifacts",
    "results",
    "bench/results",
    "test-artifacts",
]

# Settings read from the submitter's environment and passed on to the job when set.
FORWARDED_ENV = ["MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"]

EXIT_SUCCEEDED, EXIT_FAILED, EXIT_NOT_SUBMITTED, EXIT_STOPPED = 0, 1, 2, 3


class SubmitError(Exception):
    """Nothing was submitted; str() is one line saying why."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m service.submit",
        description=(
            "Validate a sweep config locally, then run `python -m service.sweep CONFIG` on a Ray "
            "cluster as a Ray Job (the project directory becomes the job's working_dir). "
            "Prints the job id and its dashboard URL, follows the job's logs, and exits with "
            "the job's outcome: 0 SUCCEEDED, 1 FAILED, 3 STOPPED, 2 nothing submitted."
        ),
        epilog=(
            "On a cluster whose nodes sit on several hosts, set MLFLOW_TRACKING_URI to an MLflow "
            "server every host reaches (not SQLite, not 127.0.0.1) and put storage_path on a "
            "shared filesystem or s3://; the sweep refuses node-local settings there. "
            "See docs/cluster.md."
        ),
    )
    p.add_argument("config", help="sweep config: a YAML path inside the project, or a preset name")
    p.add_argument(
        "--address",
        default=os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS"),
        help="Ray dashboard address, e.g. http://HEAD:8265 (default: $RAY_API_SERVER_ADDRESS, "
        "then $RAY_ADDRESS)",
    )
    p.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI"),
        help="MLflow tracking URI for the job, as the cluster's nodes reach it "
        "(default: $MLFLOW_TRACKING_URI; required: the job's own directory is temporary)",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment variable for the job and its trials (repeatable), e.g. "
        "AWS_REGION=eu-west-1 for an s3:// storage_path",
    )
    p.add_argument(
        "--python",
        default="python",
        help="Python the job's entrypoint runs with on the head (default: python on its PATH)",
    )
    p.add_argument(
        "--storage-path",
        default=None,
        help="storage_path for this job, overriding the config's: where Ray Tune/Train keep "
        "results and checkpoints, a directory every node mounts (absolute) or s3://BUCKET/PATH "
        "(default: the config's; unset or relative lands in the job's temporary directory)",
    )
    p.add_argument("--submission-id", default=None, help="job id to use (default: Ray picks one)")
    p.add_argument(
        "--no-wait", action="store_true", help="print the job id and return without following it"
    )
    return p.parse_args(argv)


def config_in_project(config_arg: str, storage_path: str | None = None) -> tuple[str, Path | None]:
    """Validate the config here; return how the job names it (relative to the project) and
    the overlay file written for a --storage-path (None without one; delete it once submitted).

    The overlay is the config's own text with `storage_path` set, written inside the project
    so that it travels in the working_dir, and validated like any config before it is shipped.
    Raises SubmitError with the config's own one-line error.
    """
    from service.config import ConfigError, load_config

    if not (PROJECT_ROOT / "pyproject.toml").is_file():
        raise SubmitError(
            f"{PROJECT_ROOT} is not the project directory (no pyproject.toml), so there is nothing "
            f"to ship as the job's working_dir; install the project editable (pip install -e .)"
        )
    try:
        cfg, path = load_config(config_arg)
    except ConfigError as e:
        raise SubmitError(str(e)) from None
    path = Path(path).resolve()
    try:
        rel = path.relative_to(PROJECT_ROOT).as_posix()
    except ValueError:
        raise SubmitError(
            f"config {path} lies outside the project directory {PROJECT_ROOT}, which is what the "
            f"job receives; put it under {PROJECT_ROOT / 'tune_configs'}"
        ) from None
    if storage_path is None:
        if not _lasts(cfg.storage_path):
            print(
                f"note: storage_path is {cfg.storage_path or 'unset'}: Ray Tune/Train results land in "
                f"the job's temporary directory on the head (metrics still go to MLflow); "
                f"--storage-path sets a lasting one",
                file=sys.stderr,
            )
        return rel, None
    if not _lasts(storage_path):
        raise SubmitError(
            f"--storage-path {storage_path} is relative, so it would resolve inside the job's "
            f"temporary working_dir; give an absolute path that every node mounts, or s3://BUCKET/PATH"
        )
    overlay = _write_overlay(path, storage_path)
    try:
        load_config(overlay)
    except ConfigError as e:
        remove_overlay(overlay)
        raise SubmitError(f"--storage-path: {e}") from None
    return overlay.relative_to(PROJECT_ROOT).as_posix(), overlay


def _lasts(storage_path: str | None) -> bool:
    """A storage path that outlives the job: a URI or an absolute directory."""
    return bool(storage_path) and (uris.is_remote(storage_path) or Path(storage_path).is_absolute())


OVERLAY_DIR = ".submit"


def _write_overlay(config: Path, storage_path: str) -> Path:
    text = config.read_text()
    line = f"storage_path: {json.dumps(storage_path)}"  # a JSON string is a YAML string
    if re.search(r"^storage_path\s*:", text, flags=re.M):
        text = re.sub(r"^storage_path\s*:.*$", lambda _: line, text, flags=re.M)
    else:
        text = text.rstrip("\n") + f"\n# set by service.submit --storage-path\n{line}\n"
    directory = PROJECT_ROOT / OVERLAY_DIR
    directory.mkdir(exist_ok=True)
    overlay = directory / f"{config.stem}-{uuid.uuid4().hex[:8]}.yaml"
    overlay.write_text(text)
    return overlay


def remove_overlay(overlay: Path | None) -> None:
    if overlay is None:
        return
    overlay.unlink(missing_ok=True)
    try:
        overlay.parent.rmdir()  # only when no other submission's overlay is in it
    except OSError:
        pass


def check_job_tracking_uri(uri: str | None) -> None:
    """Refuse tracking settings whose runs would vanish with the job.

    The job runs in a temporary copy of the project on the head node that Ray deletes
    afterwards: the sweep's default (./mlflow.db) and any relative SQLite or file path would
    be written into it. A server URI, or an absolute path on a single-host cluster, is kept.
    """
    fix = "set MLFLOW_TRACKING_URI (or --tracking-uri) to an MLflow server the cluster reaches, e.g. http://HEAD:5000"
    if not uri:
        raise SubmitError(
            "no MLflow tracking URI: the sweep's default ./mlflow.db would land in the job's "
            f"temporary working_dir on the head node and be deleted with it; {fix}"
        )
    store = uris.tracking_store(uri)
    if store.local and store.path is not None and not Path(store.path).is_absolute():
        raise SubmitError(
            f"tracking URI {uri} is relative to the job's temporary working_dir, which is "
            f"deleted with the job; {fix}"
        )


def job_env(tracking_uri: str | None, extra: list[str]) -> dict[str, str]:
    env = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    check_job_tracking_uri(env.get("MLFLOW_TRACKING_URI"))
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SubmitError(f"--env {item!r} is not KEY=VALUE")
        env[key] = value
    env["PYTHONUNBUFFERED"] = "1"  # the job's log shows progress as it happens
    return env


def build_job(config_rel: str, env: dict[str, str], python: str) -> dict:
    """The submit_job keyword arguments: entrypoint plus runtime environment."""
    return {
        "entrypoint": f"{python} -m service.sweep {shlex.quote(config_rel)}",
        "runtime_env": {
            "working_dir": str(PROJECT_ROOT),
            "excludes": WORKING_DIR_EXCLUDES,
            "env_vars": env,
        },
    }


def follow(client, job_id: str) -> str:
    """Stream the job's logs to stdout until it ends; return its final status name."""
    from ray.job_submission import JobStatus

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            print(chunk, end="", flush=True)

    try:
        asyncio.run(tail())
    except Exception as e:  # the log stream is a convenience; the status below decides
        print(f"submit: log stream ended early ({one_line(e)}); polling status", file=sys.stderr)
    while True:
        status = client.get_job_status(job_id)
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            return status.value
        time.sleep(2)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overlay = None
    try:
        config_rel, overlay = config_in_project(args.config, args.storage_path)
        if not args.address:
            raise SubmitError(
                "no cluster address: pass --address http://HEAD:8265 or set RAY_ADDRESS "
                "(for a local run use python -m service.sweep)"
            )
        env = job_env(args.tracking_uri, args.env)
    except SubmitError as e:
        remove_overlay(overlay)
        print(f"error: {e}", file=sys.stderr)
        return EXIT_NOT_SUBMITTED

    from ray.job_submission import JobSubmissionClient

    job = build_job(config_rel, env, args.python)
    try:
        client = JobSubmissionClient(args.address)
        job_id = client.submit_job(submission_id=args.submission_id, **job)
    except (ConnectionError, RuntimeError, ValueError) as e:
        print(f"error: could not submit to {args.address}: {one_line(e, with_type=False)}", file=sys.stderr)
        return EXIT_NOT_SUBMITTED
    finally:  # the overlay has been uploaded with the working_dir (or nothing was submitted)
        remove_overlay(overlay)

    dashboard = client.get_address().rstrip("/")
    print(f"submitted job {job_id}: {job['entrypoint']}")
    print(f"dashboard: {dashboard}/#/jobs/{job_id}")
    print(f"tracking:  {env['MLFLOW_TRACKING_URI']}")
    sys.stdout.flush()
    if args.no_wait:
        print(f"not following; logs: ray job logs --address {dashboard} --follow {job_id}")
        return EXIT_SUCCEEDED
    try:
        status = follow(client, job_id)
    except KeyboardInterrupt:
        print(
            f"\nstopped following; job {job_id} keeps running "
            f"(ray job stop --address {dashboard} {job_id} to stop it)",
            file=sys.stderr,
        )
        return 130
    print(f"job {job_id} {status}")
    return {"SUCCEEDED": EXIT_SUCCEEDED, "STOPPED": EXIT_STOPPED}.get(status, EXIT_FAILED)


if __name__ == "__main__":
    sys.exit(main())
