"""Checks that a sweep's storage and tracking settings reach every host of a Ray cluster.

Trial workers run on any node of the cluster and write two things: Ray Train/Tune results
and checkpoints under `storage_path`, and metrics into MLflow (rank 0 of each trial). Both
must therefore name a place that every *host* reaches. Several Ray nodes on one machine
(a laptop, or the loopback test cluster) share that machine's disk and loopback address,
so everything local is fine there; the checks below only bite once nodes sit on more than
one host, and then they refuse with the reason instead of letting trials write where the
driver never looks.

Call both after connecting to Ray and before starting Tune:

    nodes = ray.nodes()
    check_tracking_uri_for_cluster(tracking_uri, nodes)
    check_storage_for_cluster(storage_path, nodes)

`nodes` is what `ray.nodes()` returns (dicts with NodeID, NodeManagerAddress, Alive).

And one thing the trials need across hosts: `torch_config(backend, nodes)`, Ray Train's
TorchConfig whose workers bind gloo to their node's interface (see the section below).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from service import uris

Node = Mapping[str, object]
# (local directory, alive multi-host nodes) -> addresses of the hosts that cannot read it
StorageProbe = Callable[[Path, Sequence[Node]], list[str]]


class ClusterConfigError(ValueError):
    """A setting that cannot work on this cluster; str() is one line with the reason."""


def alive_nodes(nodes: Iterable[Node]) -> list[Node]:
    return [n for n in nodes if n.get("Alive", True)]


def cluster_hosts(nodes: Iterable[Node]) -> list[str]:
    """Distinct host addresses of the alive nodes (several nodes may share one host)."""
    return sorted({str(n["NodeManagerAddress"]) for n in alive_nodes(nodes)})


def check_tracking_uri_for_cluster(uri: str | None, nodes: Iterable[Node]) -> None:
    """Refuse a tracking URI that workers on other hosts cannot write to.

    On one host anything goes. Across hosts, a SQLite database or a local file store is a
    file on the driver's host (and SQLite's locking is not safe over network filesystems),
    and a loopback server address means "this machine" on every worker: both would lose
    the workers' metrics. `None`/empty means MLflow's default local store and is refused too.
    """
    hosts = cluster_hosts(nodes)
    if len(hosts) <= 1:
        return
    where = f"this Ray cluster spans {len(hosts)} hosts ({', '.join(hosts)})"
    fix = "run an MLflow tracking server every host can reach and set MLFLOW_TRACKING_URI=http://HOST:PORT"
    store = uris.tracking_store(uri)
    if store.kind == "file":
        raise ClusterConfigError(
            f"tracking URI {uri or '(unset: MLflow default local store)'} is a local file store but {where}: "
            f"workers on other hosts would log into their own disk; {fix}"
        )
    if store.kind == "sqlite":
        raise ClusterConfigError(
            f"tracking URI {uri} is a SQLite file on the driver's host but {where}: "
            f"workers on other hosts cannot write to it; {fix}"
        )
    if store.loopback:
        raise ClusterConfigError(
            f"tracking URI {uri} is a loopback address but {where}: on each worker it names "
            f"that worker's own machine; use an address of the server that other hosts reach"
        )


def check_storage_for_cluster(
    storage_path: str, nodes: Iterable[Node], probe: StorageProbe | None = None
) -> None:
    """Refuse a local storage_path that some host of the cluster does not share.

    Remote URIs (s3://, gs://, ...) are reachable from everywhere by definition; on one host
    a local directory is shared by every node. Across hosts a local path is only fine when it
    is the same shared filesystem everywhere (NFS, a volume mounted into every container):
    the probe writes a random token under the path on this host and a zero-CPU Ray task
    pinned to each node reads it back (`ray_storage_probe`, one task per node, ~1 s).
    """
    nodes = alive_nodes(nodes)
    hosts = cluster_hosts(nodes)
    directory = uris.local_dir(storage_path)
    if directory is None or len(hosts) <= 1:
        return
    blind = (probe or ray_storage_probe)(directory.resolve(), nodes)
    if blind:
        raise ClusterConfigError(
            f"storage_path {storage_path} is node-local: this Ray cluster spans {len(hosts)} hosts "
            f"and {', '.join(sorted(set(blind)))} cannot see it, so their trials' results and "
            f"checkpoints would be lost; use a filesystem mounted on every node or s3://BUCKET/PATH"
        )


def ray_storage_probe(directory: Path, nodes: Sequence[Node]) -> list[str]:
    """Hosts among `nodes` that cannot read a token file written here under `directory`.

    Needs a connected Ray driver (`ray.init`); runs one zero-CPU task pinned to each node.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    token = uuid.uuid4().hex
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / f".storage-probe-{token}"
    marker.write_text(token)

    @ray.remote(num_cpus=0, max_retries=0)
    def reads_token(path: str, expected: str) -> bool:
        try:
            return Path(path).read_text() == expected
        except OSError:
            return False

    try:
        refs = [
            reads_token.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(str(n["NodeID"]), soft=False)
            ).remote(str(marker), token)
            for n in nodes
        ]
        seen = ray.get(refs, timeout=120)
    finally:
        marker.unlink(missing_ok=True)
    return [str(n["NodeManagerAddress"]) for n, ok in zip(nodes, seen) if not ok]


# ----------------------------------------------------------------------------- gloo across hosts
# Gloo picks the address its process group listens on from the machine's hostname and falls
# back to loopback; where the hostname resolves to 127.0.x.x (Debian/Ubuntu's default
# /etc/hosts, most containers without a DNS name) every rank then advertises a loopback
# address, and ranks on different hosts never connect: init_process_group waits out its
# timeout (30 min by default) with "Gloo connectFullMesh failed ... Connection refused,
# remote=[127.0.0.1]". Seen on the emulated multi-host cluster (tests/test_cluster_hosts.py).
# On a multi-host cluster each trial worker therefore binds gloo to the interface that holds
# its Ray node's address, unless GLOO_SOCKET_IFNAME is already set.

SIOCGIFADDR = 0x8915


def interface_with_address(address: str) -> str | None:
    """The name of this host's network interface whose IPv4 address is ``address`` (None: none)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    return None


def bind_gloo_to_node_address() -> str | None:
    """In a trial worker, before its process group exists: GLOO_SOCKET_IFNAME := the interface
    of this Ray node's address (kept when already set); returns the interface used."""
    import os

    import ray

    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return os.environ["GLOO_SOCKET_IFNAME"]
    name = interface_with_address(ray.util.get_node_ip_address())
    if name is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = name
    return name


def torch_config(backend: str, nodes: Iterable[Node]):
    """Ray Train's TorchConfig for a trial: on a cluster spanning several hosts with gloo, one
    whose workers bind gloo to their node's address first (see above); else the plain one."""
    from ray.train.torch import TorchConfig

    if backend != "gloo" or len(cluster_hosts(nodes)) <= 1:
        return TorchConfig(backend=backend)
    return _gloo_on_node_address_cls()(backend=backend)


def _gloo_on_node_address_cls():
    """Built on first use: importing ray.train costs seconds, and the rules above need none of it.
    (cloudpickle ships the class by value to the Train controller.)"""
    from ray.train.torch.config import TorchConfig, _TorchBackend

    class _Backend(_TorchBackend):
        def on_start(self, worker_group, backend_config):
            worker_group.execute(bind_gloo_to_node_address)
            super().on_start(worker_group, backend_config)

    class GlooOnNodeAddress(TorchConfig):
        @property
        def backend_cls(self):
            return _Backend

    return GlooOnNodeAddress
