"""The emulated network: hosts as Linux network namespaces, joined by shaped links.

A :class:`Network` of W hosts is, for real (iproute2's ``ip`` and ``tc``, the kernel's
namespaces; nothing simulated):

* W network namespaces ``chs-{owner pid}-{token}-h{i}``, each with its own loopback and one
  interface ``eth0`` at 198.18.0.{i+1}/24 (the benchmarking range, RFC 2544: never routed);
* a veth pair per host, its outer end ``chs{token}v{i}`` enslaved to a bridge ``chs{token}b``
  in the root namespace (one L2 segment per network, so networks never see each other and
  may all use the same addresses);
* each host's egress (``eth0`` inside its namespace) shaped by ``tc``: a token bucket (tbf)
  at ``link_gbps``, and a netem delay of ``latency_ms`` when one is asked for. A host's
  link is full duplex: what it sends is limited by its own egress, what it receives by the
  senders';
* where the host's firewall sees bridged frames (br_netfilter on: Docker turns it on, and sets
  iptables' FORWARD policy to DROP), an iptables FORWARD rule that accepts the frames between
  the bridge's own ports, commented with the owner, removed with the network.
* with ``host_cpus``, a CPU cgroup per host, named as its namespace, whose quota is the host's
  share of the machine's cores (service/network/host_cpu.py; its ranks join it themselves).

Names carry a per-network token and the pid of the process that owns them (in the namespace
and cgroup names, as the links' ``ifalias``, as the rule's comment: service/network/names.py):
:func:`remove_leftovers` removes what belongs to a process that no longer lives (a sweep killed
with SIGKILL), :func:`remove_owned` what belongs to a given live process (the sweep driver
cleaning up after its trials on an interrupt).

A process joins a host with :func:`entered` (setns(2) on the calling thread only; the thread
goes back to its own namespace on exit), and :func:`process_group_on_host` creates a gloo
process group whose sockets live in the host's namespace: sockets keep the namespace they were
created in, so everything else in the process (Ray, the default group's TCPStore, MLflow)
stays on the ordinary network. Needs CAP_NET_ADMIN and CAP_SYS_ADMIN (root):
:func:`preflight` says so in one line before anything is created.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass
from typing import Iterator

from service.network import firewall, host_cpu, names
from service.network.firewall import BRIDGE_NF, list_rules  # noqa: F401 - netem's interface
from service.network.names import ALIAS_RE, HOST_RE, PREFIX, pid_alive

IFNAME = "eth0"  # a host's interface, inside its namespace
SUBNET = "198.18.0"  # 198.18.0.0/15 is reserved for network benchmarks (RFC 2544)
MAX_HOSTS = 250  # one /24 per network
# Standard Ethernet frames: what a 1-25 GbE cluster without jumbo frames carries, and the
# header overhead (Ethernet + IP + TCP with timestamps: 66 of every 1514 bytes) that tbf,
# which counts whole frames, charges to every message.
MTU = 1500

CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
CLONE_NEWNET = 0x40000000


class NetemError(Exception):
    """The emulated network cannot be built here; str() is one line saying what and how to fix it."""


@dataclass(frozen=True)
class Host:
    namespace: str
    ifname: str
    address: str
    cgroup: str = ""  # its CPU cgroup's directory (service/network/host_cpu.py); "" without network.host_cpus


# ----------------------------------------------------------------------------- commands


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True)
    if check and proc.returncode != 0:
        err = " ".join((proc.stderr or proc.stdout).split()) or f"exit status {proc.returncode}"
        raise NetemError(f"`{' '.join(args)}` failed: {err}")
    return proc


def _capabilities() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


# ----------------------------------------------------------------------------- preflight


def preflight(link_gbps: float = 1.0, latency_ms: float = 0.0) -> None:
    """Can this process build shaped networks? Raises NetemError (one line) if not.

    Checks the tools and capabilities first (cheap, and the usual reason), then builds and
    removes a one-host network with the shaping asked for, so a kernel without tbf or netem
    is caught here too. Leaves nothing behind either way.
    """
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise NetemError(f"network: emulated links need iproute2's `ip` and `tc`, and this machine lacks "
                         f"{' and '.join(missing)}: install iproute2 (apt-get install iproute2; "
                         f"scripts/setup.sh does it as root), or remove the config's network: section")
    caps = _capabilities()
    lacking = [name for name, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN), ("CAP_SYS_ADMIN", CAP_SYS_ADMIN))
               if not caps >> bit & 1]
    if lacking:
        raise NetemError(f"network: emulated links need {' and '.join(lacking)} (network namespaces, veth "
                         f"links and tc qdiscs), which this process lacks: run the sweep as root (in a "
                         f"container: --cap-add NET_ADMIN --cap-add SYS_ADMIN), or remove the config's "
                         f"network: section")
    try:
        with Network(1, link_gbps, latency_ms):
            pass
    except NetemError as exc:
        text = str(exc)
        if latency_ms and "qdisc kind is unknown" in text and "netem" in text:
            raise NetemError(f"network.latency_ms {latency_ms:g} needs the kernel's netem qdisc (sch_netem), "
                             f"which this kernel lacks: set network.latency_ms: 0 (no added delay; the "
                             f"veth path's own latency is measured and logged), or load sch_netem "
                             f"(modprobe sch_netem)") from None
        raise NetemError(f"network: this machine cannot build an emulated link: {text}") from None


# ----------------------------------------------------------------------------- a network


class Network:
    """W emulated hosts on one bridge, each host's egress shaped (see the module docstring).

    ``with Network(4, link_gbps=1.0) as net: net.hosts[r].namespace ...``: created on entry
    (or by :meth:`create`), removed on exit (or by :meth:`remove`), also when creation fails
    half way. ``owner_pid`` (default: this process) is the process whose death makes the
    network a leftover for :func:`remove_leftovers`. ``host_cpus``: each host also gets a CPU
    cgroup of that many cores, named as its namespace (service/network/host_cpu.py).
    """

    def __init__(self, hosts: int, link_gbps: float | None, latency_ms: float = 0.0,
                 owner_pid: int | None = None, host_cpus: float | None = None):
        if not 1 <= hosts <= MAX_HOSTS:
            raise NetemError(f"a network has 1 to {MAX_HOSTS} hosts, not {hosts}")
        self.n_hosts, self.link_gbps, self.latency_ms = hosts, link_gbps, float(latency_ms or 0.0)
        self.owner_pid = owner_pid or os.getpid()
        self.host_cpus = host_cpus
        self.token = ""
        self.hosts: list[Host] = []
        self._created: list[tuple[str, str]] = []  # ("netns" | "link", name), in creation order

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.token}b"

    def __enter__(self) -> "Network":
        self.create()
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def create(self) -> "Network":
        existing = set(list_namespaces())
        while True:  # a token no network of this machine uses
            self.token = secrets.token_hex(3)
            if not any(f"-{self.token}-" in ns for ns in existing):
                break
        alias = names.alias(self.owner_pid)
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            self._created.append(("link", self.bridge))
            _run("ip", "link", "set", self.bridge, "alias", alias)
            _run("ip", "link", "set", self.bridge, "up")
            if firewall.sees_bridges():
                rule = firewall.accept_rule(self.bridge, alias)
                _run("iptables", "-w", "-I", "FORWARD", "1", *rule)
                self._created.append(("rule", shlex.join(rule)))
            for i in range(self.n_hosts):
                self.hosts.append(self._add_host(i, alias))
        except BaseException:
            self.remove()
            raise
        return self

    def _add_host(self, i: int, alias: str) -> Host:
        ns = names.host_name(self.owner_pid, self.token, i)
        outer = f"{PREFIX}{self.token}v{i}"
        _run("ip", "netns", "add", ns)
        self._created.append(("netns", ns))
        _run("ip", "link", "add", outer, "mtu", str(MTU), "type", "veth",
             "peer", "name", IFNAME, "mtu", str(MTU), "netns", ns)
        self._created.append(("link", outer))
        _run("ip", "link", "set", outer, "alias", alias)
        _run("ip", "link", "set", outer, "master", self.bridge)
        _run("ip", "link", "set", outer, "up")
        address = f"{SUBNET}.{i + 1}"
        _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", IFNAME)
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", ns, "link", "set", IFNAME, "up")
        self._shape(ns)
        cgroup = host_cpu.create(ns, self.host_cpus) if self.host_cpus else ""
        if cgroup:  # and its comm cgroup, made by its rank's process (host_cpu.gloo_threads_apart)
            self._created += [("cgroup", cgroup), ("cgroup", host_cpu.comm_cgroup(cgroup))]
        return Host(ns, IFNAME, address, cgroup)

    def reshape(self, link_gbps: float | None, latency_ms: float | None = None) -> None:
        """Change every host's shaping in place (None: unshaped); connections stay up."""
        self.link_gbps = link_gbps
        if latency_ms is not None:
            self.latency_ms = float(latency_ms)
        for host in self.hosts:
            _run("ip", "netns", "exec", host.namespace, "tc", "qdisc", "del", "dev", host.ifname, "root", check=False)
            self._shape(host.namespace)

    def _shape(self, ns: str) -> None:
        tc = ("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", IFNAME)
        if self.link_gbps:
            rate_bps = self.link_gbps * 1e9
            # burst: 2 ms at the rate (the kernel refills the bucket at timer ticks; a burst
            # under rate/HZ cannot reach the rate), at least a few frames; queue: 100 ms at
            # the rate, so TCP is paced by the bucket, not by drops
            burst = max(int(rate_bps / 8 * 0.002), 8 * MTU)
            limit = max(int(rate_bps / 8 * 0.1), 4 * burst)
            _run(*tc, "root", "handle", "1:", "tbf", "rate", f"{int(rate_bps)}bit",
                 "burst", str(burst), "limit", str(limit))
            if self.latency_ms:
                _run(*tc, "parent", "1:1", "handle", "10:", "netem", "delay", f"{self.latency_ms}ms",
                     "limit", "100000")
        elif self.latency_ms:
            _run(*tc, "root", "handle", "10:", "netem", "delay", f"{self.latency_ms}ms", "limit", "100000")

    def check_connected(self, timeout_s: float = 5.0) -> None:
        """Raise NetemError (one line, with the likely reason) unless host 0 opens a TCP
        connection to host 1 across the bridge within ``timeout_s``."""
        if len(self.hosts) < 2:
            return
        a, b = self.hosts[0], self.hosts[1]
        with entered(b.namespace):
            server = socket.create_server((b.address, 0))
        with entered(a.namespace):
            client = socket.socket()
        client.settimeout(timeout_s)
        try:
            client.connect((b.address, server.getsockname()[1]))  # the listen backlog answers
        except OSError as exc:
            raise NetemError(f"network: two emulated hosts cannot reach each other ({a.address} -> {b.address} "
                             f"on bridge {self.bridge}: {exc or 'timed out'} within {timeout_s:g} s): "
                             f"{firewall.why_blocked()}") from None
        finally:
            client.close()
            server.close()

    def tx_bytes(self) -> list[int]:
        """Bytes each host has sent through its shaping qdisc (whole frames), from ``tc -s``."""
        out = []
        for host in self.hosts:
            proc = _run("ip", "netns", "exec", host.namespace, "tc", "-s", "-j", "qdisc", "show", "dev", host.ifname)
            qdiscs = json.loads(proc.stdout or "[]")
            roots = [q for q in qdiscs if q.get("root")] or qdiscs
            out.append(int(roots[0].get("bytes", 0)) if roots else 0)
        return out

    def remove(self) -> None:
        """Delete everything this network created (namespaces first: their veths go with them)."""
        for kind, name in sorted(self._created, key=lambda c: c[0] != "netns"):
            if kind == "netns":
                _run("ip", "netns", "del", name, check=False)
            elif kind == "cgroup":
                host_cpu.remove(name)
            elif kind == "rule":
                _run("iptables", "-w", "-D", "FORWARD", *shlex.split(name), check=False)
            else:
                _run("ip", "link", "del", name, check=False)  # already gone with its namespace: fine
        self._created.clear()
        self.hosts = []


# ----------------------------------------------------------------------------- leftovers


def list_namespaces() -> list[str]:
    """Our namespaces on this machine (any owner)."""
    if shutil.which("ip") is None:
        return []
    proc = _run("ip", "netns", "list", check=False)
    names = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    return [n for n in names if HOST_RE.match(n)]


def list_links() -> list[tuple[str, int]]:
    """Our links in the root namespace: (name, owner pid)."""
    if shutil.which("ip") is None:
        return []
    proc = _run("ip", "-j", "link", "show", check=False)
    out = []
    for link in json.loads(proc.stdout or "[]"):
        match = ALIAS_RE.match(link.get("ifalias", "") or "")
        if match and link.get("ifname", "").startswith(PREFIX):
            out.append((link["ifname"], int(match.group(1))))
    return out


def _remove_where(owned) -> list[str]:
    removed = []
    for ns in list_namespaces():
        if owned(int(HOST_RE.match(ns).group(1))):
            _run("ip", "netns", "del", ns, check=False)
            removed.append(ns)
    for name, pid in list_links():
        if owned(pid):
            _run("ip", "link", "del", name, check=False)
            removed.append(name)
    for rule, pid in list_rules():
        if owned(pid):
            _run("iptables", "-w", "-D", "FORWARD", *rule, check=False)
            removed.append(f"iptables FORWARD {shlex.join(rule)}")
    return removed + host_cpu.remove_where(owned)


def remove_leftovers() -> list[str]:
    """Remove the namespaces, links, rules and CPU cgroups of owners no longer alive; returns their names."""
    return _remove_where(lambda pid: not pid_alive(pid))


def remove_owned(pid: int | None = None) -> list[str]:
    """Remove every namespace, link, rule and CPU cgroup owned by ``pid`` (default: this process)."""
    pid = pid or os.getpid()
    return _remove_where(lambda owner: owner == pid)


# ----------------------------------------------------------------------------- joining a host


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NetemError(f"setns into a network namespace failed: {os.strerror(err)}")


@contextlib.contextmanager
def entered(namespace: str) -> Iterator[None]:
    """The calling thread runs in ``namespace`` inside the block (other threads do not move).

    Sockets created inside stay in that namespace for their whole life; sockets created
    before (or after, outside the block) keep the ordinary network.
    """
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)


_env_lock = threading.Lock()


def process_group_on_host(host: Host | dict):
    """A new gloo process group (every rank of the default group calls this, collectively)
    whose connections run between the hosts' interfaces, i.e. over the shaped links.

    The default group's store (already connected over the ordinary network) does the
    rendezvous; gloo reads GLOO_SOCKET_IFNAME when it creates its device, inside the host.
    """
    import torch.distributed as dist

    if isinstance(host, dict):
        host = Host(**host)
    with _env_lock, entered(host.namespace):
        before = os.environ.get("GLOO_SOCKET_IFNAME")
        os.environ["GLOO_SOCKET_IFNAME"] = host.ifname
        try:
            return dist.new_group(backend="gloo")
        finally:
            if before is None:
                os.environ.pop("GLOO_SOCKET_IFNAME", None)
            else:
                os.environ["GLOO_SOCKET_IFNAME"] = before
