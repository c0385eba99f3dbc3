"""A sweep with a network: section: the links measured before Ray starts, each trial's
emulated hosts (service/network/netem.py) created and removed, and what the trial's link really did."""

from __future__ import annotations

import logging
import os
from typing import TextIO

from service.config import SweepConfig, TrialSpec
from service.sweep.errors import SweepError
from service.sweep.signals import signals_raise_keyboard_interrupt
from service.text import one_line

log = logging.getLogger("service.sweep")


def prepare_network(cfg: SweepConfig, trials: list[TrialSpec], out: TextIO):
    """{link_gbps: LinkMeasurement} for a config with network: (None without): leftovers of
    killed sweeps removed, the machine checked and each link measured (service/network/link_measure.py);
    with network.host_cpus, the hosts' share checked to fit and cgroups to be writable."""
    if cfg.network is None:
        return None
    from service.network import host_cpu, link_measure, netem

    # Ctrl-C/SIGTERM during the measurement: KeyboardInterrupt (even where the shell started us
    # with SIGINT ignored), and the measurement's hosts are removed on the way out
    with signals_raise_keyboard_interrupt():
        try:
            if cfg.network.host_cpus is not None:  # before the links' measurement: a refusal in a second
                share = host_cpu.preflight(cfg.network.host_cpus, max(cfg.search.world_size))
                print(f"network: each emulated host owns {share:g} cores (network.host_cpus: "
                      f"{cfg.network.host_cpus})", file=out, flush=True)
            return link_measure.prepare(cfg.network, [t.link_gbps for t in trials if t.link_gbps is not None],
                                        out=out)  # a split sweep's quality runs: loopback
        except (netem.NetemError, host_cpu.HostCpuError) as exc:
            raise SweepError(str(exc)) from None
        except KeyboardInterrupt:
            netem.remove_owned(os.getpid())
            raise


def remove_networks() -> None:
    from service.network import netem

    removed = netem.remove_owned(os.getpid())
    if removed:
        log.info("removed the emulated hosts of stopped trials: %s", " ".join(removed))


def host_share(cfg: SweepConfig) -> float | None:
    """Cores per emulated host (network.host_cpus, ``auto`` resolved on this machine for the
    sweep's largest world size); None: the ranks share the machine's cores."""
    cpus = cfg.network.host_cpus if cfg.network else None
    if cpus != "auto":
        return cpus
    from service.network import host_cpu

    return host_cpu.auto_share(max(cfg.search.world_size), host_cpu.machine_cores(host_cpu.hierarchy()))


def trial_network(cfg: SweepConfig, trial: TrialSpec, network: dict | None):
    """The trial's emulated hosts (one per rank), created; None without network:."""
    if network is None or trial.link_gbps is None:
        return None
    from service.network import netem

    return netem.Network(trial.world_size, trial.link_gbps, cfg.network.latency_ms,
                         owner_pid=network["owner_pid"], host_cpus=host_share(cfg)).create()


def log_link(trial_runs, run_id: str, net, measured) -> None:
    """The link the trial ran on, measured, the bytes its hosts really sent and each host's
    CPU share (``host_cpus``, cores; with network.host_cpus); then the hosts are removed."""
    import ray

    try:
        metrics = {"link_measured_gbps": measured.measured_gbps,
                   "link_measured_latency_ms": measured.measured_latency_ms}
        if net.host_cpus:
            metrics["host_cpus"] = float(net.host_cpus)
        try:
            metrics["link_tx_bytes"] = float(sum(net.tx_bytes()))  # whole frames, every host, whole trial
        except Exception as exc:  # noqa: BLE001 - a missing counter must not fail the trial
            log.warning("could not read the links' byte counters: %s", one_line(exc))
        ray.get(trial_runs.log_metrics.remote(run_id, metrics))
    finally:
        net.remove()
