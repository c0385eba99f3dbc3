"""How a sweep's cluster path is priced, one way for every part of it: the projection table
(projection.csv), the decision map, the cluster's star and answer, the plan round and the plan
section all take their collectives' transport and latency from one :class:`Pricing`.

* Transport: ``report.cluster.transport``'s probe of the user's cluster where given, as the sweep
  copied it onto its parent run when it started (``cluster_transport.json``: a rebuild needs
  nothing but MLflow, and a file changed or moved later changes nothing); else the sweep's own
  probe (``transport.json``); else each trial's recorded communication, scaled.
* Latency: ``report.cluster.latency_ms`` where the sweep names a cluster, else
  ``report.project.latency_ms``.
* Compute: each configuration's own trials' step timelines; the hosts they ran on are named from
  those timelines (:func:`compute_hosts`), not from the transport probe's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from hooks.wire import ALLREDUCE
from service.step_model.transport import ProbeHosts, TransportFit


@dataclass(frozen=True)
class Pricing:
    transport: Optional[TransportFit]          # what every projected collective costs (None: trials' own, scaled)
    latency_ms: float                          # every projected cell's latency
    sweep_transport: Optional[TransportFit]    # the sweep's own probe (the report's transport table)
    cluster_file: str = ""                     # the path report.cluster.transport was copied from ("": not given)
    latency_from: str = "report.project.latency_ms"   # the setting latency_ms comes from

    @property
    def from_cluster(self) -> bool:
        return bool(self.cluster_file)

    def transport_source(self) -> str:
        """Where the transport was measured, in one phrase."""
        if self.from_cluster:
            return f"transport: your cluster's probe ({self.cluster_file}), probed {self.transport.where()}"
        if self.transport is None:
            return "transport: each trial's own recorded communication, scaled (no probe)"
        return f"transport: this sweep's own probe, probed {self.transport.where()}"

    def hidden_above_gbps(self) -> Optional[float]:
        """The link rate above which these hosts' own cost of moving bytes (the transport probe's
        per byte cost of an allreduce, CPU work on both ends) exceeds the wire's: a faster link
        saves nothing there. None without a probe."""
        if self.transport is None:
            return None
        per_byte = [f.per_byte_ms for f in self.transport.kinds.get(ALLREDUCE, ()) if f.per_byte_ms > 0]
        if not per_byte:
            return None
        return 8.0 / (min(per_byte) * 1e6)   # bits per ns = Gbit/s: one byte every per_byte_ms


def pricing(reader, parent_run_id: str, report_cfg) -> Pricing:
    """The sweep's one pricing (the module doc), read from its parent run."""
    sweeps = reader.transport(parent_run_id)
    cluster = report_cfg.cluster
    if cluster is None:
        return Pricing(sweeps, report_cfg.project.latency_ms, sweeps)
    latency, latency_from = cluster.latency_ms, "report.cluster.latency_ms"
    if not cluster.transport:
        return Pricing(sweeps, latency, sweeps, "", latency_from)
    copied = reader.cluster_transport(parent_run_id)
    if copied is None:  # a sweep from before the copy was made: the file as configured
        from service.answer.data import ReportError
        from service.step_model.transport import read_file

        try:
            return Pricing(read_file(cluster.transport), latency, sweeps, cluster.transport, latency_from)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ReportError(f"report.cluster.transport {cluster.transport}: cannot be read ({exc}), and this sweep "
                              "has no copy of it on its parent run: put the file back to rebuild the report") from None
    fit, path = copied
    return Pricing(fit, latency, sweeps, path or cluster.transport, latency_from)


def compute_hosts(timelines: Iterable) -> list[ProbeHosts]:
    """The hosts the projected compute was measured on, each once, from the trials' timelines
    (those from before the hosts were recorded name none)."""
    return list(dict.fromkeys(t.hosts for t in timelines if t.hosts is not None))


def hosts_text(hosts: list[ProbeHosts]) -> str:
    """'2 core(s) per host, 2 rank(s) per host on loopback (Intel Xeon ...)', each host kind once."""
    if not hosts:
        return "hosts not recorded"
    kinds = dict.fromkeys(f"{h.cores:g} core(s) per host, {h.ranks_per_host} rank(s) per host "
                          f"{'on loopback' if h.loopback else 'across emulated links'} ({h.cpu_model})" for h in hosts)
    return "; ".join(kinds)
