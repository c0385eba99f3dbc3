"""Writing runs: the sweep's parent run, each trial's child run (params, identity tags), tags,
run ends, and the queries --resume asks (the runs to continue, the steps already logged)."""

from __future__ import annotations

import math

import importlib.metadata
import os
import re
import subprocess
from typing import Any, Iterable

from mlflow.entities import Param, RunStatus, RunTag

from service.tracking.identity import identity_tags
from service.tracking.store import (END_STATUSES, MAX_PARAM_VALUE, MAX_PARAMS_TAGS_PER_BATCH, MAX_TAG_VALUE,
                                    PARENT_TAG, TRANSPORT_FAILED_TAG, client, get_or_create_experiment,
                                    resolve_tracking_uri, search_all_runs)


def git_commit(path: str | None = None) -> str | None:
    """The commit of the git checkout holding ``path`` (default: this project), or None."""
    where = path or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.isdir(where):
        where = os.path.dirname(where)
    try:
        out = subprocess.run(
            ["git", "-C", where, "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def start_parent_run(cfg, config_path: str | None, tracking_uri: str | None = None) -> str:
    """Create the sweep's parent run in experiment ``cfg.name``; returns its run id.

    Tags: ``config_path`` and ``git_commit`` (when the project is a git checkout),
    ``seeds_min`` / ``seeds_max`` with adaptive seeds; the config file itself is logged as an
    artifact.
    """
    uri = tracking_uri or resolve_tracking_uri()
    c = client(uri)
    experiment_id = get_or_create_experiment(cfg.name, uri)
    tags = {"role": "sweep", "status": "running", "sweep_fingerprint": cfg.fingerprint(),
            "target_tolerance": repr(cfg.report.target_tolerance)}
    if cfg.search.adaptive is not None:  # the report judges the gaps by the rule these set
        tags.update(seeds_min=str(cfg.search.adaptive.min), seeds_max=str(cfg.search.adaptive.max))
    if config_path:
        tags["config_path"] = os.path.abspath(str(config_path))
    commit = git_commit()
    if commit:
        tags["git_commit"] = commit
        tags["mlflow.source.git.commit"] = commit
    run = c.create_run(experiment_id, tags=tags, run_name=cfg.name)
    if config_path and os.path.isfile(str(config_path)):
        c.log_artifact(run.info.run_id, str(config_path))
    return run.info.run_id


def trial_params(trial, run_cfg) -> dict[str, Any]:
    """The params of a trial's run: the hook, every hook parameter by its own name, the
    grid coordinates, the workload settings, the backend and the library versions.
    ``run_cfg``: the config the trial trains with (``SweepConfig.run_config(trial)``: a timing
    run's steps are its own), built once by the trial's caller."""
    wl = run_cfg.workload
    use_gpu = run_cfg.resources.use_gpu
    params: dict[str, Any] = {"hook": trial.hook}
    params.update(dict(trial.hook_params or {}))
    params.update({
        "world_size": trial.world_size,
        "seed": trial.seed,
        "workload": wl.name,
        "global_batch_size": wl.global_batch_size,
        "steps": wl.steps,
        "lr": wl.lr,
        "optimizer": wl.optimizer,
        "grad_accumulation": wl.grad_accumulation,
        **trial.knobs(),  # DDP's: bucket_cap_mb, gradient_as_bucket_view, static_graph; and compile
        "parallelism": trial.parallelism,  # ddp | fsdp (search.parallelism)
        "find_unused_parameters": wl.find_unused_parameters,
        "broadcast_buffers": wl.broadcast_buffers,
        "backend": "nccl" if use_gpu else "gloo",
        "torch_version": _version("torch"),
        "ray_version": _version("ray"),
    })
    if trial.compile:  # torch.compile's mode (workload.compile)
        params["compile_mode"] = wl.compile_mode
    if trial.link_gbps is not None:  # an emulated link (config network:)
        params.update(link_gbps=trial.link_gbps, latency_ms=run_cfg.network.latency_ms)
    if trial.kind != "full":  # a split network sweep's quality or timing run (also the tag trial_kind)
        params["run_kind"] = trial.kind
    return params


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def log_trial_params(run_id: str, trial, run_cfg, tracking_uri: str | None = None) -> None:
    """Log :func:`trial_params` into ``run_id`` (one batch)."""
    params = [Param(k, str(v)[:MAX_PARAM_VALUE]) for k, v in trial_params(trial, run_cfg).items()]
    c = client(tracking_uri)
    for i in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
        c.log_batch(run_id, params=params[i:i + MAX_PARAMS_TAGS_PER_BATCH])


def start_child_run(parent_run_id: str, trial, run_cfg, tracking_uri: str | None = None) -> str:
    """Create a trial's run, nested under the sweep's parent run (same experiment), named
    ``trial.run_name``, with its identity tags (:func:`identity_tags`) and params (``run_cfg``:
    the config the trial trains with, :func:`trial_params`); returns its run id."""
    c = client(tracking_uri)
    parent = c.get_run(parent_run_id)
    run = c.create_run(
        parent.info.experiment_id,
        tags={PARENT_TAG: parent_run_id, "role": "trial", "status": "running", **identity_tags(trial)},
        run_name=trial.run_name,
    )
    log_trial_params(run.info.run_id, trial, run_cfg, tracking_uri)
    return run.info.run_id


def child_runs(parent_run_id: str, tracking_uri: str | None = None) -> list:
    """The trial runs nested under ``parent_run_id`` (mlflow ``Run`` objects, oldest first)."""
    c = client(tracking_uri)
    parent = c.get_run(parent_run_id)
    return search_all_runs(c, parent.info.experiment_id, f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
                           order_by=["attributes.start_time ASC"])


def end_run(run_id: str, status: str, error: str | None = None,
            tracking_uri: str | None = None) -> None:
    """End ``run_id`` as FINISHED, FAILED or KILLED.

    FAILED sets tag ``status`` = failed and ``error`` = the error text (truncated to
    MLflow's tag limit); KILLED sets ``status`` = killed. FINISHED keeps the ``status``
    tag the worker wrote (ok | nan), or sets ok if there is none.
    """
    status = status.upper()
    if status not in END_STATUSES:
        raise ValueError(f"end_run status must be one of {', '.join(END_STATUSES)}, got {status!r}")
    c = client(tracking_uri)
    tags: dict[str, str] = {}
    if status == "FAILED":
        tags["status"] = "failed"
        if error:
            tags["error"] = _tail(str(error), MAX_TAG_VALUE)
    elif status == "KILLED":
        tags["status"] = "killed"
    elif c.get_run(run_id).data.tags.get("status", "running") == "running":
        tags["status"] = "ok"
    if tags:
        c.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    c.set_terminated(run_id, status=RunStatus.to_string(RunStatus.from_string(status)))


def _tail(text: str, limit: int) -> str:
    """The end of ``text`` (a traceback's last lines say what went wrong)."""
    return text if len(text) <= limit else "..." + text[-(limit - 3):]


def run_tags(run_id: str, tracking_uri: str | None = None) -> dict[str, str]:
    return dict(client(tracking_uri).get_run(run_id).data.tags)


def run_outcome(run_id: str, tracking_uri: str | None = None) -> tuple[str, float]:
    """A trial run's ``status`` tag (ok when unset) and ``final_eval_loss`` (NaN when not
    logged), in one read."""
    data = client(tracking_uri).get_run(run_id).data
    return data.tags.get("status", "ok"), float(data.metrics.get("final_eval_loss", math.nan))


def log_teardown(run_id: str, fit_returned_at: float, tracking_uri: str | None = None) -> None:
    """``phase_teardown_s``: from the end of the trial's own work (its ``phase_ended_at``, logged
    by rank 0) until ``fit_returned_at``; nothing when rank 0 logged no end (a failed trial)."""
    c = client(tracking_uri)
    ended = c.get_run(run_id).data.metrics.get("phase_ended_at")
    if ended is not None:
        c.log_metric(run_id, "phase_teardown_s", max(0.0, fit_returned_at - ended))


def set_tags(run_id: str, tracking_uri: str | None = None, **tags: Any) -> None:
    """Set tags on ``run_id`` right away (one request)."""
    items = [RunTag(k, _tail(str(v), MAX_TAG_VALUE)) for k, v in tags.items()]
    c = client(tracking_uri)
    for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
        c.log_batch(run_id, tags=items[i:i + MAX_PARAMS_TAGS_PER_BATCH])


def last_logged_steps(run_id: str, keys: Iterable[str],
                      tracking_uri: str | None = None) -> dict[str, int]:
    """For each metric key, the highest step already in ``run_id`` (-1 if none).

    A restarted trial uses this to log each step exactly once: points a crashed attempt
    already flushed are not logged again.
    """
    c = client(tracking_uri)
    out = {}
    for key in keys:
        history = c.get_metric_history(run_id, key)
        out[key] = max((m.step for m in history), default=-1)
    return out


def latest_sweep_runs(experiment_name: str, tracking_uri: str | None = None, *,
                      fingerprint: str | None = None, max_results: int = 1) -> list:
    """The most recent parent runs (tag ``role`` = sweep) of ``experiment_name``, newest
    first; only those of config ``fingerprint`` (``SweepConfig.fingerprint``) when given."""
    c = client(tracking_uri)
    exp = c.get_experiment_by_name(experiment_name)
    if exp is None:
        return []
    where = "tags.role = 'sweep'"
    if fingerprint:
        where += f" and tags.sweep_fingerprint = '{fingerprint}'"
    return list(c.search_runs([exp.experiment_id], filter_string=where, max_results=max_results,
                              order_by=["attributes.start_time DESC"]))


def reopen_run(run_id: str, tracking_uri: str | None = None) -> None:
    """Mark an ended run RUNNING again (tag ``status`` = running): a resumed sweep continues
    its parent run and the runs of its unfinished trials instead of creating new ones."""
    c = client(tracking_uri)
    c.log_batch(run_id, tags=[RunTag("status", "running")])
    c.update_run(run_id, status="RUNNING")


def log_transport(parent_run_id: str, tracking_uri: str, data: dict) -> None:
    """The sweep's measured transport (service/step_model/transport.py) as ``transport.json`` on its
    parent run; the reason an earlier attempt failed (a resumed sweep's) no longer holds: dropped."""
    from service.step_model.transport import ARTIFACT

    c = client(tracking_uri)
    c.log_dict(parent_run_id, data, ARTIFACT)
    if TRANSPORT_FAILED_TAG in c.get_run(parent_run_id).data.tags:
        c.delete_tag(parent_run_id, TRANSPORT_FAILED_TAG)


def log_cluster_transport(parent_run_id: str, tracking_uri: str, cluster) -> None:
    """``report.cluster.transport``'s file copied onto the parent run as ``cluster_transport.json``
    when the sweep starts: its reports are built from the copy (a rebuild needs nothing but
    MLflow, and a file changed or moved later changes nothing; ``--resume`` keeps the first copy).
    Nothing without one."""
    import json

    from service.step_model.transport import CLUSTER_ARTIFACT

    if cluster is None or not cluster.transport:
        return
    c = client(tracking_uri)
    if any(a.path == CLUSTER_ARTIFACT for a in c.list_artifacts(parent_run_id)):
        return  # a resumed sweep keeps the copy it started with
    with open(cluster.transport) as f:
        data = json.load(f)
    c.log_dict(parent_run_id, {**data, "copied_from": os.path.abspath(cluster.transport)},
                                  CLUSTER_ARTIFACT)


def log_transport_failure(parent_run_id: str, tracking_uri: str, reason: str) -> None:
    """Why the sweep's transport was not measured (one line), on its parent run for the report."""
    set_tags(parent_run_id, tracking_uri, **{TRANSPORT_FAILED_TAG: reason})


def open_sweep_run(cfg, config_path: str | None, tracking_uri: str, parent_run_id: str | None = None) -> str:
    """The sweep's record opened: a new parent run, or (``--resume``) ``parent_run_id`` reopened."""
    if parent_run_id is None:
        return start_parent_run(cfg, config_path, tracking_uri=tracking_uri)
    reopen_run(parent_run_id, tracking_uri)
    return parent_run_id


def close_sweep_run(parent_run_id: str, tracking_uri: str, status: str, interrupted_at_ms: int | None = None) -> None:
    """The sweep's record closed: no child run left RUNNING, then the parent ends ``status``.

    An interrupted or failed sweep's running trials end KILLED; after a FINISHED one, a trial
    whose process died before it could close its run ends FAILED. ``interrupted_at_ms``: when
    the signal came. A trial whose TorchTrainer was torn down by the interruption may get to
    close its own run FAILED first (a race with ``ray.shutdown``); a run that ended FAILED after
    the signal is such a trial, and becomes KILLED, so that ``--resume`` runs it again instead
    of taking it for a finished failure.
    """
    killed = status != "FINISHED"
    for run in child_runs(parent_run_id, tracking_uri):
        if (interrupted_at_ms is not None and run.info.status == "FAILED"
                and (run.info.end_time or 0) >= interrupted_at_ms):
            end_run(run.info.run_id, "KILLED", tracking_uri=tracking_uri)
        elif run.info.status == "RUNNING":
            if killed:
                end_run(run.info.run_id, "KILLED", tracking_uri=tracking_uri)
            else:
                end_run(run.info.run_id, "FAILED", tracking_uri=tracking_uri,
                        error="the trial's process ended without closing its run (see the Ray logs of the sweep)")
    end_run(parent_run_id, status, tracking_uri=tracking_uri)


# A trial's restarts, in its run's tags (they survive a crash before the first checkpoint): the
# attempt's number and the configured faults that already fired, written and read only here.
_ATTEMPTS_TAG = "attempts"
_FAULT_FIRED = re.compile(r"fault\.(\d+)\.fired")


def record_attempt(run_id: str, tracking_uri: str, attempt: int, **tags: Any) -> None:
    """Tag the run with this attempt's number (1: the first), and ``tags``."""
    set_tags(run_id, tracking_uri, **{_ATTEMPTS_TAG: attempt}, **tags)


def record_fault_fired(run_id: str, tracking_uri: str, index: int, fault) -> None:
    """Configured fault ``index`` fired (before it takes effect): a restart skips it."""
    set_tags(run_id, tracking_uri, **{f"fault.{index}.fired": f"{fault.kind}@step{fault.step}"})


def restart_state(run_id: str, tracking_uri: str) -> tuple[int, frozenset[int]]:
    """(this attempt's number, indices of the faults that already fired), from the run's tags."""
    tags = run_tags(run_id, tracking_uri)
    fired = frozenset(int(m.group(1)) for m in map(_FAULT_FIRED.fullmatch, tags) if m)
    return int(tags.get(_ATTEMPTS_TAG, "0")) + 1, fired
