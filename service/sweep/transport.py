"""Transport measured once per sweep, before its trials: on Ray Train workers of each world size
the sweep runs (above 1), the probe (service/train/transport_probe.py) times every collective
kind the hooks use (hooks/wire.py's KINDS; FSDP's SHARDED_KINDS too at a world size the sweep
runs fsdp trials at, and only there: :func:`kinds_to_probe`); the fit
(service/step_model/transport.py) goes on the parent run as ``transport.json`` (through
service/tracking/), and the report prices every trial's collectives from it. A probe that fails leaves the trials alone: its one-line reason goes on the parent run
instead, and the report says it. Where the sweep's emulated hosts own their CPU (network.host_cpus), on
such hosts, their link unshaped (:func:`hosts_for_probe`); else on loopback.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict
from typing import Optional, TextIO

from hooks.wire import KINDS, SHARDED_KINDS
from service.config.trial import FSDP
from service.step_model.transport import ProbeHosts, Sample, TransportFit, fit
from service.text import one_line

SAMPLES = "transport_samples.json"   # in the probe's checkpoint


def _probe_loop(config: dict) -> None:
    """The TorchTrainer's loop: every rank probes ``config["kinds"]`` (on its emulated host where
    the sweep's hosts own their CPU: ``config["network"]``, as a trial's ranks train); rank 0
    reports the samples and the wall time in a checkpoint (Train V2's ``Result.metrics`` is the
    last checkpoint's report: None without one)."""
    import tempfile

    import ray.train

    from service.train.ray_entry import host_group, on_host_cpu
    from service.train.transport_probe import probe

    rank = ray.train.get_context().get_world_rank()
    hosts = (config.get("network") or {}).get("hosts")
    started = time.perf_counter()
    with on_host_cpu(config, rank):
        samples, hosts_seen = probe(kinds=tuple(config.get("kinds") or KINDS), group=host_group(config, rank)[0],
                                    host=hosts[rank]["namespace"] if hosts else None)
    seconds = time.perf_counter() - started
    if rank != 0:
        ray.train.report({"probe_s": seconds})
        return
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/{SAMPLES}", "w") as f:
            json.dump({"samples": [asdict(s) for s in samples], "probe_s": seconds, "hosts": asdict(hosts_seen)}, f)
        ray.train.report({"probe_s": seconds}, checkpoint=ray.train.Checkpoint.from_directory(tmp))


def probe_on_ray(world_size: int, storage: str, cpus_per_worker: float,
                 network: Optional[dict] = None, autoscaling_requests: bool = True,
                 kinds: tuple[str, ...] = KINDS) -> tuple[list[Sample], float, ProbeHosts]:
    """The probe on ``world_size`` Ray Train workers of the Ray instance this process is
    connected to (a local one, or a cluster's): its samples, wall seconds and hosts. ``network``:
    {"hosts": [...]}, one emulated host per rank (:func:`hosts_for_probe`), as a trial's;
    ``autoscaling_requests``: False on an instance of fixed size (service/sweep/lean_trainer.py);
    ``kinds``: the collective kinds to time (hooks/wire.py's names)."""
    import ray
    import ray.train

    from service.sweep.cluster import torch_config
    from service.sweep.lean_trainer import LeanTorchTrainer

    trainer = LeanTorchTrainer(
        # across hosts gloo must not bind to a loopback hostname, as the trials' (service/sweep/cluster.py)
        _probe_loop, train_loop_config={"network": network, "kinds": list(kinds)},
        torch_config=torch_config("gloo", ray.nodes()),
        scaling_config=ray.train.ScalingConfig(num_workers=world_size, resources_per_worker={"CPU": cpus_per_worker}),
        autoscaling_requests=autoscaling_requests,
        run_config=ray.train.RunConfig(name=f"transport-probe-w{world_size}-{time.strftime('%Y%m%d-%H%M%S')}",
                                       storage_path=storage))
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"the W={world_size} probe reported no samples")
    with result.checkpoint.as_directory() as path:
        with open(f"{path}/{SAMPLES}") as f:
            data = json.load(f)
    return [Sample(**s) for s in data["samples"]], float(data["probe_s"]), ProbeHosts(**data["hosts"])


@contextmanager
def hosts_for_probe(cfg, world_size: int):
    """Where the sweep's hosts own their CPU (network.host_cpus), ``world_size`` emulated hosts of
    that share, their link unshaped (the probe times the hosts' own work; the model adds each
    link's wire time), removed afterwards: {"hosts": [...]} for :func:`probe_on_ray`. None (the
    machine's loopback) otherwise: ranks that share its cores probe where they train."""
    from service.sweep.network import host_share

    share = host_share(cfg)
    if share is None:
        yield None
        return
    from service.network import netem

    net = netem.Network(world_size, None, owner_pid=os.getpid(), host_cpus=share).create()
    try:
        yield {"hosts": [vars(h) for h in net.hosts]}
    finally:
        net.remove()


_left_inside_ray: list[threading.Thread] = []  # probe threads a Ctrl-C left running


def probe_interrupted() -> bool:
    """Whether a Ctrl-C (or SIGTERM) came while a probe's thread was inside Ray. Then this process
    must not call ray.shutdown() nor end by the interpreter's exit: either, with that thread inside
    Ray's core worker, crashed the process under load (SIGSEGV, exit -11 in place of 130: tests/
    test_cluster.py's interrupted probe). It disconnects nothing and leaves by ``os._exit``
    (service/sweep/cli.py; service/sweep/probe_cli.py does the same). Decided at the signal, not
    later: the thread may end any moment after it, or not."""
    return bool(_left_inside_ray)


def off_the_main_thread(fn, *args):
    """``fn(*args)`` on a daemon thread, waited for here. Ray Train's fit() installs its own
    SIGINT handler when called on the main thread (as Tune's trials never do), which aborted the
    probe quietly or exited the sweep with 1 on a Ctrl-C (tests/test_resume.py); off it, the
    caller's handler stays, a Ctrl-C raises KeyboardInterrupt here and the sweep (or
    ``python -m service.probe``) stops as from a trial, its Ray instance (or, on a cluster, this
    driver's exit) ending the probe's actors."""
    done: dict = {}

    def run():
        try:
            done["value"] = fn(*args)
        except BaseException as exc:  # handed to the waiting thread, which raises it
            done["error"] = exc

    thread = threading.Thread(target=run, name="transport-probe", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.5)
    except BaseException:  # Ctrl-C: the thread goes on inside Ray (see probe_interrupted)
        _left_inside_ray.append(thread)
        raise
    if "error" in done:
        raise done["error"]
    return done["value"]


def kinds_to_probe(trials: list, world_size: int) -> tuple[str, ...]:
    """The collective kinds the probe times at ``world_size``: the hooks' (KINDS) always; FSDP's
    reduce-scatter and all-gather (SHARDED_KINDS) only where a trial runs fsdp at that W, so a
    sweep without fsdp trials probes no longer than before them."""
    fsdp = any(t.parallelism == FSDP and t.world_size == world_size for t in trials)
    return KINDS + SHARDED_KINDS if fsdp else KINDS


def measure_transport(cfg, trials: list, parent_run_id: str, tracking_uri: str, storage: str,
                      out: TextIO, autoscaling_requests: bool = True) -> Optional[TransportFit]:
    """transport.json for the sweep's parent run (kept when a resumed sweep has one already);
    None where the sweep runs no world size above 1, or on GPUs (NCCL's transport is not gloo's).
    ``autoscaling_requests``: as :func:`probe_on_ray`'s."""
    from service import tracking

    sizes = sorted({t.world_size for t in trials if t.world_size > 1})
    if not sizes or cfg.resources.use_gpu:
        return None
    if not cfg.tracking.transport_probe:  # the report says so, in place of the transport table
        tracking.log_transport_failure(parent_run_id, tracking_uri, "tracking.transport_probe is false")
        return None
    reader = tracking.SweepReader(tracking_uri)
    kept = reader.transport(parent_run_id)
    if kept is not None:
        return kept
    samples, cost, hosts = [], {}, []
    try:
        for w in sizes:
            started = time.monotonic()  # the trainer's start included: what the sweep pays
            with hosts_for_probe(cfg, w) as network:
                measured, _, where = off_the_main_thread(probe_on_ray, w, storage, cfg.resources.cpus_per_worker,
                                                         network, autoscaling_requests,
                                                         kinds_to_probe(trials, w))
            samples, hosts = samples + measured, hosts + [where]
            cost[w] = round(time.monotonic() - started, 1)
    except Exception as exc:  # the trials do not need it: the report then scales each trial's own comm
        reason = one_line(exc)
        tracking.log_transport_failure(parent_run_id, tracking_uri, f"its probe failed ({reason})")  # the report says why
        print(f"transport not measured ({reason}); the report scales each trial's "
              "recorded communication instead", file=out, flush=True)
        return None
    result = fit(samples, cost, tuple(hosts))
    tracking.log_transport(parent_run_id, tracking_uri, result.to_json())
    print(f"transport measured at W = {', '.join(map(str, sizes))} in "
          f"{', '.join(f'{s:g} s' for s in cost.values())} (transport.json on the parent run)", file=out, flush=True)
    return result
