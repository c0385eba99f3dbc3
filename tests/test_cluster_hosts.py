"""The cluster path across real hosts: a Ray cluster whose nodes sit on different emulated hosts.

One module-wide cluster (each Ray start costs 30 s+), built from real parts as a person would
on three machines, each machine an emulated host of service/network/netem.py (its own network
namespace, its own 198.18.0.x address on eth0, a veth into one bridge, its egress shaped by
tc tbf to LINK_GBPS):

  - host h0 (198.18.0.1): `ray start --head` (no CPUs: it runs the job's driver only);
  - host h1 (198.18.0.2): a worker node with 1 CPU, started inside its host's CPU cgroup of
    HOST_CPUS cores (service/network/host_cpu.py, as network.host_cpus makes one): its raylet and
    every worker it starts own that share, not the machine's 2 cores (issue 39);
  - host h2 (198.18.0.3): the same, and started in its own mount namespace with a tmpfs over
    HIDDEN: a directory every other host sees and this one does not (a node-local disk);
  - `mlflow server` in the root namespace on the bridge's own address (198.18.0.254), which
    every host reaches (the "shared service" of a real cluster).

So Ray sees three nodes on three addresses, and the multi-host rules of service/sweep/cluster.py
meet a real cluster: the SQLite store and the node-local storage_path are refused by a real
sweep submitted with `python -m service.submit`, the loopback tracking URI by the rules run
against the cluster's own `ray.nodes()`; and a sweep whose two ranks must sit on h1 and h2
(ranks of 0.6 CPU, nodes of 1) trains with its gradients crossing the shaped links: the bytes
the hosts' qdiscs sent, and the step time against the wire time at the shaped rate, show it.
`python -m service.probe` run there names what it probed: two hosts of HOST_CPUS cores.

Everything started is stopped by pid, the hosts are removed, and the module checks that no
namespace or link of ours is left, whatever the outcome.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from hooks.wire import ALL_KINDS
from tests.stores import store_uri

from service.network import netem

from service.sweep import submit
from tests.test_cluster import (BIN, RAY_CLI, ROOT, _assert_sweep_recorded, _error_lines, _free_port,
                                _jobs, _parent_runs, _process_trees_under, _ray_json, _ray_start, _run,
                                _stop_everything, _wait_http_ok)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)"),
    pytest.mark.skipif(RAY_CLI is None, reason="Ray's CLI (`ray`) is not installed"),
]

LINK_GBPS = 1.0
HOST_CPUS = 0.8  # cores of each worker node's host: 1.6 of the machine's 2, the rest for the head and MLflow
BRIDGE_ADDRESS = f"{netem.SUBNET}.254"  # the root namespace's address on the hosts' segment
CROSS_HOST = "tests/cross_host_sweep.yaml"
ONE_TRIAL = "tests/one_trial_sweep.yaml"
JOB_TIMEOUT_S = 1500  # only stops a hung job; one trial takes ~1-2 min here


@dataclass
class HostCluster:
    base: Path
    net: netem.Network
    gcs_address: str
    dashboard_url: str
    tracking_uri: str
    env: dict[str, str]
    hidden: Path  # h2 cannot see it
    shared: Path  # every host sees it
    nodes: list[dict] = field(default_factory=list)
    mlflow: subprocess.Popen | None = None


def _in_host(host: netem.Host, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", host.namespace, *cmd]


def _on_host_cpu(host: netem.Host, *cmd: str) -> list[str]:
    """``cmd`` on ``host`` and inside its CPU cgroup, as a machine of that many cores: joined
    before ``ip netns exec`` (which mounts a sysfs of its own, without the cgroup hierarchies),
    and the cpu hierarchy mounted again inside, so that what it starts (a raylet, its workers)
    inherits the share and can read it as its cores (service/network/host_cpu.machine_cores)."""
    remount = ('mount -t tmpfs cgroup_root /sys/fs/cgroup && mkdir /sys/fs/cgroup/cpu && '
               'mount -t cgroup -o cpu cgroup /sys/fs/cgroup/cpu && exec "$@"')
    return ["sh", "-c", 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"', "sh", host.cgroup,
            *_in_host(host, "sh", "-c", remount, "sh", *cmd)]


def _ours_left(owner: int) -> tuple[list[str], list[str]]:
    return ([n for n in netem.list_namespaces() if f"-{owner}-" in n],
            [name for name, pid in netem.list_links() if pid == owner])


@pytest.fixture(scope="module")
def host_cluster():
    base = Path(tempfile.mkdtemp(prefix="rh-", dir="/tmp"))  # short: Ray's socket paths live under it
    token = base / "ray_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    hidden, shared = base / "node-local", base / "shared"
    hidden.mkdir()
    shared.mkdir()
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_USAGE_STATS_ENABLED": "0",
        "OMP_NUM_THREADS": "1",
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    for var in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "MLFLOW_TRACKING_URI", "RAY_AUTH_TOKEN",
                "GLOO_SOCKET_IFNAME"):
        env.pop(var, None)
    # the hosts are owned by a process of their own that lives as long as the module: this
    # pytest worker may own other tests' networks, and the final check counts only ours
    owner = subprocess.Popen(["sleep", "infinity"])
    net = netem.Network(3, LINK_GBPS, owner_pid=owner.pid, host_cpus=HOST_CPUS)
    c = None
    try:
        net.create()
        netem._run("ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", net.bridge)
        head, w1, w2 = net.hosts
        gcs_port, dash_port, mlflow_port = _free_port(), _free_port(), _free_port()
        c = HostCluster(base=base, net=net, gcs_address=f"{head.address}:{gcs_port}",
                        dashboard_url=f"http://{head.address}:{dash_port}",
                        tracking_uri=f"http://{BRIDGE_ADDRESS}:{mlflow_port}", env=env,
                        hidden=hidden, shared=shared)
        log = base / "mlflow-server.log"
        c.mlflow = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--host", BRIDGE_ADDRESS, "--port", str(mlflow_port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{base}/mlflow.db",
             "--artifacts-destination", str(base / "mlartifacts"),
             # MLflow admits Host headers of localhost and private ranges only by default;
             # 198.18/15 is not one of them (as a real server's public name would not be)
             "--allowed-hosts", f"{BRIDGE_ADDRESS}:{mlflow_port}"],
            cwd=base, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        common = ["--disable-usage-stats", "--object-store-memory", str(200 * 2**20)]
        _ray_start(_in_host(head, str(RAY_CLI), "start", "--head", "--node-ip-address", head.address,
                            "--port", str(gcs_port), "--dashboard-host", head.address,
                            "--dashboard-port", str(dash_port), "--ray-client-server-port", str(_free_port()),
                            "--num-cpus", "0", *common), base / "head", env)
        _ray_start(_on_host_cpu(w1, str(RAY_CLI), "start", "--address", c.gcs_address,
                            "--node-ip-address", w1.address, "--num-cpus", "1", *common), base / "w1", env)
        # h2's own mount namespace, with a tmpfs over HIDDEN: its raylet and every worker it
        # starts see an empty directory there (ip netns exec makes the mounts slaves of the
        # root's, so nothing propagates back)
        _ray_start(_on_host_cpu(w2, "unshare", "--mount", "--propagation", "private", "sh", "-c",
                            'mount -t tmpfs node-local "$1" && shift && exec "$@"', "sh", str(hidden),
                            str(RAY_CLI), "start", "--address", c.gcs_address, "--node-ip-address",
                            w2.address, "--num-cpus", "1", *common), base / "w2", env)
        _wait_http_ok(f"{c.tracking_uri}/health", timeout=300, proc=c.mlflow)
        c.nodes = _driver_json(c, """
            import json, time, ray
            ray.init(address=GCS, log_to_driver=False)
            deadline = time.time() + 180
            while time.time() < deadline and len([n for n in ray.nodes() if n["Alive"]]) != 3:
                time.sleep(1)
            print(json.dumps([n for n in ray.nodes() if n["Alive"]]))
        """)
        yield c
    finally:
        left = _stop_everything(c) if c is not None else set()
        net.remove()
        owner.kill()
        owner.wait()
        if left and os.environ.get("CI") == "true":
            subprocess.run([str(RAY_CLI), "stop", "--force"], env=env, capture_output=True, timeout=120)
            left = _process_trees_under(str(base))
        shutil.rmtree(base, ignore_errors=True)
        assert not left, f"processes of the test cluster still alive: {sorted(left)}"
        assert _ours_left(owner.pid) == ([], []), "emulated hosts of the test cluster left behind"


def _driver_json(c: HostCluster, code: str, timeout: float = 300):
    """`code` as a Ray driver on the head's host (a driver attaches to a raylet of its own
    host), GCS bound to the cluster's address; it must print one JSON value last."""
    import textwrap

    code = f"GCS = {c.gcs_address!r}\n" + textwrap.dedent(code)
    res = _run(_in_host(c.net.hosts[0], sys.executable, "-c", code), env=c.env, timeout=timeout)
    assert res.returncode == 0, f"driver failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


def _submit(c: HostCluster, config: str, *extra: str, tracking_uri: str | None = None):
    cmd = [sys.executable, "-m", "service.submit", config, "--address", c.dashboard_url,
           "--tracking-uri", tracking_uri or c.tracking_uri, *extra]
    res = _run(cmd, env=c.env, timeout=JOB_TIMEOUT_S)
    job = next((l.split()[2].rstrip(":") for l in res.stdout.splitlines() if l.startswith("submitted job ")), None)
    return res, job


def test_ray_sees_three_hosts_with_their_own_addresses(host_cluster):
    c = host_cluster
    addresses = sorted(n["NodeManagerAddress"] for n in c.nodes)
    assert addresses == [h.address for h in c.net.hosts]
    from service.sweep import cluster

    assert cluster.cluster_hosts(c.nodes) == addresses


@dataclass(frozen=True)
class ClusterProbe:
    res: subprocess.CompletedProcess
    path: Path  # the transport.json it wrote


@pytest.fixture(scope="module")
def cluster_probe(host_cluster) -> ClusterProbe:
    """`python -m service.probe` on this cluster at W = 2 (a driver on the head's host, as a user's
    would be on theirs): one rank per worker node, inside its host's share, across the links."""
    c = host_cluster
    out = c.shared / "transport.json"
    res = _run(_in_host(c.net.hosts[0], sys.executable, "-m", "service.probe", "--address", c.gcs_address,
                        "--world-size", "2", "--link-gbps", str(LINK_GBPS), "--storage-path",
                        str(c.shared / "probe-storage"), "--out", str(out)),
               env=c.env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return ClusterProbe(res, out)


def test_probe_on_hosts_that_own_their_cpu_names_them(cluster_probe):
    """transport.json names two hosts of HOST_CPUS cores, not this machine's loopback, and a
    report.cluster.transport reads it back."""
    from service.config.loading import report_section
    from service.step_model.transport import read_file

    res, out = cluster_probe.res, cluster_probe.path
    fit = read_file(str(out))
    # every kind by default, FSDP's reduce_scatter and all_gather beside the hooks' three
    assert fit.world_sizes == [2] and set(fit.kinds) == set(ALL_KINDS)
    [hosts] = fit.hosts
    assert (hosts.world_size, hosts.hosts, hosts.ranks_per_host, hosts.loopback) == (2, 2, 1, False), hosts
    assert hosts.cores == pytest.approx(HOST_CPUS) and not hosts.time_shared, hosts
    assert f"W = 2: probed {hosts.describe()}" in res.stdout
    assert f"report.cluster.transport: {out}" in res.stdout
    cfg = report_section(f"report:\n  cluster: {{world_size: 8, link_gbps: 10, transport: {out}}}\n")
    assert cfg.cluster.transport == str(out)


def test_sqlite_store_is_refused_by_the_submitted_sweep(host_cluster):
    c = host_cluster
    store = f"sqlite:///{c.base}/driver-only.db"  # absolute: submit itself lets it through
    res, job = _submit(c, ONE_TRIAL, "--storage-path", str(c.shared), tracking_uri=store)
    assert res.returncode == 1, res.stdout[-4000:] + res.stderr[-2000:]
    assert f"job {job} FAILED" in res.stdout
    hosts = ", ".join(h.address for h in c.net.hosts)
    assert f"tracking URI {store} is a SQLite file on the driver's host but this Ray cluster spans " \
           f"3 hosts ({hosts})" in res.stdout
    assert {j["id"]: j["status"] for j in _jobs(c)}[job] == "FAILED"


def test_node_local_storage_is_refused_naming_the_host_that_cannot_see_it(host_cluster):
    c = host_cluster
    before = set(_parent_runs(c, "one_trial"))
    res, job = _submit(c, ONE_TRIAL, "--storage-path", str(c.hidden))
    assert res.returncode == 1, res.stdout[-4000:] + res.stderr[-2000:]
    assert f"job {job} FAILED" in res.stdout
    blind = c.net.hosts[2].address
    assert f"storage_path {c.hidden} is node-local: this Ray cluster spans 3 hosts and {blind} cannot " \
           f"see it" in res.stdout
    assert set(_parent_runs(c, "one_trial")) == before  # refused before its parent run existed
    # the probe's token is not left behind (the sweep's own log lands there: it is the driver's disk)
    assert not list(c.hidden.rglob(".storage-probe-*"))


def test_rules_hold_against_the_real_nodes(host_cluster):
    """The loopback tracking URI (which a submitted sweep cannot reach to be refused: its
    health check, on the head's host, finds no server there first), and the storage probe
    seeing what each host sees, against the cluster's own ray.nodes()."""
    c = host_cluster
    result = _driver_json(c, f"""
        import json, ray
        from pathlib import Path
        from service.sweep import cluster
        ray.init(address=GCS, log_to_driver=False)
        nodes = cluster.alive_nodes(ray.nodes())
        out = {{"blind_hidden": cluster.ray_storage_probe(Path({str(c.hidden)!r}), nodes),
               "blind_shared": cluster.ray_storage_probe(Path({str(c.shared)!r}), nodes)}}
        for name, uri in (("loopback", "http://127.0.0.1:5000"), ("bridge", {c.tracking_uri!r})):
            try:
                cluster.check_tracking_uri_for_cluster(uri, nodes)
                out[name] = "accepted"
            except cluster.ClusterConfigError as exc:
                out[name] = str(exc)
        print(json.dumps(out))
    """)
    assert result["blind_hidden"] == [c.net.hosts[2].address]
    assert result["blind_shared"] == []
    assert result["bridge"] == "accepted"
    assert result["loopback"].startswith("tracking URI http://127.0.0.1:5000 is a loopback address but "
                                         "this Ray cluster spans 3 hosts")
    assert "\n" not in result["loopback"]


@dataclass(frozen=True)
class CrossHostJob:
    res: subprocess.CompletedProcess
    job: str
    cfg: object  # the sweep's Config
    sent: list[int]  # bytes each host's shaped link sent while the job ran
    parent: str  # its sweep's parent run
    metrics: dict[str, dict[str, float]]  # each trial's MLflow metrics, by hook


@pytest.fixture(scope="module")
def cross_host_job(host_cluster) -> CrossHostJob:
    """CROSS_HOST submitted with `python -m service.submit`: two trials at W = 2 whose two ranks
    sit on h1 and h2, so every gradient byte crosses their shaped links (the cell a cluster's
    report prices, measured there)."""
    from mlflow.tracking import MlflowClient

    from service.config import load_config

    c = host_cluster
    cfg, _ = load_config(ROOT / CROSS_HOST)
    before_runs = set(_parent_runs(c, cfg.name))
    sent_before = c.net.tx_bytes()
    res, job = _submit(c, CROSS_HOST, "--storage-path", str(c.shared / "job-storage"))
    sent = [after - b for after, b in zip(c.net.tx_bytes(), sent_before)]
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    [parent] = set(_parent_runs(c, cfg.name)) - before_runs
    client = MlflowClient(tracking_uri=c.tracking_uri)
    runs = client.search_runs([client.get_run(parent).info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    return CrossHostJob(res, job, cfg, sent, parent, {r.data.tags["trial_config"]: r.data.metrics for r in runs})


@pytest.mark.timeout(JOB_TIMEOUT_S + 300)
def test_submitted_sweep_trains_across_the_shaped_links(host_cluster, cross_host_job):
    c, res, job, cfg, sent = host_cluster, cross_host_job.res, cross_host_job.job, cross_host_job.cfg, cross_host_job.sent
    storage = c.shared / "job-storage"
    assert f"dashboard: {c.dashboard_url}/#/jobs/{job}" in res.stdout
    assert f"job {job} SUCCEEDED" in res.stdout
    assert f"Sweep '{cfg.name}'" in res.stdout  # the job's own log was followed
    assert {j["id"]: j for j in _jobs(c)}[job]["status"] == "SUCCEEDED"
    parent = cross_host_job.parent
    _assert_sweep_recorded(c, parent, CROSS_HOST)
    # --storage-path reached the sweep: Tune's and Train's state is there, not in the job's
    # temporary directory; the submitter's overlay config was not left behind.
    assert [p for p in storage.rglob("*") if p.is_file()], f"nothing under the job's storage_path {storage}"
    assert not list((ROOT / submit.OVERLAY_DIR).glob(f"{Path(CROSS_HOST).stem}-*.yaml"))

    # the two ranks ran on the two worker hosts, one each
    [job_info] = [j for j in _jobs(c) if j["id"] == job]
    placed = _ray_json(c, f"""
        import json
        from ray.util.state import list_actors
        actors = list_actors(address="{c.dashboard_url}", limit=10000, detail=True)
        print(json.dumps([a.node_id for a in actors if "TrainWorker" in a.class_name
                          and a.job_id == {job_info["job_id"]!r}]))   # this job's, not another's (the probe test's)
    """)
    by_id = {n["NodeID"]: n["NodeManagerAddress"] for n in c.nodes}
    assert by_id[job_info["driver_node_id"]] == c.net.hosts[0].address
    # three worker groups ran, each one rank per host: the transport probe's at W = 2, then each trial's
    workers = sorted(by_id[node] for node in placed)
    assert workers == sorted([c.net.hosts[1].address, c.net.hosts[2].address] * 3), placed

    # DDP's gradients crossed the links: each worker host's shaped qdisc sent at least the
    # bytes the hook's accounting says a rank sent (tc counts whole frames: more), and the
    # step took at least the wire time of those bytes at the shaped rate
    m = cross_host_job.metrics["allreduce"]
    per_step = m["comm_bytes_per_step"]
    assert per_step >= 30e6  # mlp_digits' 8.5 M fp32 gradients, 2(W-1)/W of them per rank at W=2
    for host_sent in sent[1:]:
        assert host_sent >= cfg.workload.steps * per_step, (sent, per_step)
    assert sent[0] < per_step, sent  # the head only drives: no gradient went through it
    wire_ms = 1000 * per_step / (LINK_GBPS * 1e9 / 8)
    assert m["step_time_ms_median"] >= 0.9 * wire_ms, (m["step_time_ms_median"], wire_ms)
    print(f"cross-host trial: step {m['step_time_ms_median']:.0f} ms median, wire time at "
          f"{LINK_GBPS:g} Gbit/s {wire_ms:.0f} ms; bytes sent per host {sent}")


BASIS_LINK_GBPS = 2.5  # the basis sweep's links: not the cluster's, so the projection re-prices the wire


@pytest.mark.timeout(JOB_TIMEOUT_S + 900)
def test_a_report_priced_with_the_clusters_probe_tracks_the_cells_measured_on_it(
        host_cluster, cluster_probe, cross_host_job, tmp_path):
    """Issue 39 item 3 end to end: a basis sweep run on this machine, on emulated hosts of the
    cluster's share (HOST_CPUS) but links of BASIS_LINK_GBPS, its report.cluster the cluster's
    cell (W = 2 on LINK_GBPS) priced with `python -m service.probe --link-gbps`'s transport.json
    of the cluster by the report's own code, against the steps cross_host_job measured there.

    Behaviour, asserted: the report names the probe, its hosts and its link; the cluster's slower
    link is priced in (the allgather hook's cell above its basis's own link, allreduce's not below);
    the probe's wire is counted once for the allgather hook (below the price with the wire twice;
    allreduce, the slower of transport and wire, the same either way). The projection against the
    step measured on the cluster is printed, not asserted: -1.1 ... -8.4 % (allreduce) and -9.8 ...
    -17.7 % (quantization_pertensor, +9.3 ... +28.6 % with the wire twice) with the module alone,
    but -13.9 ... -18.4 and -23.0 ... -41.4 % inside `make test`, where the basis and the cell ran
    minutes apart under the other test worker's varying load (the cluster's 0.8-core hosts are
    capped, not guaranteed, their share): docs/performance.md."""
    from service.config import load_config
    from service.config.loading import report_section
    from service.answer import projection
    from service.answer.data import load_sweep, open_store, recommendations
    from service.answer.pricing import pricing

    config = tmp_path / "cluster_basis.yaml"
    config.write_text((ROOT / CROSS_HOST).read_text().replace("name: cross_host", "name: cluster_basis").replace(
        "tracking:\n", f"network: {{link_gbps: {BASIS_LINK_GBPS}, host_cpus: {HOST_CPUS}}}\n"
                       f"report:\n  cluster: {{world_size: 2, link_gbps: {LINK_GBPS}, latency_ms: 0, "
                       f"transport: {cluster_probe.path}}}\n"
                       "tracking:\n  transport_probe: false  # the cluster's probe prices the cell\n"))
    cfg, _ = load_config(config)
    assert cfg.workload == cross_host_job.cfg.workload and cfg.trials() and \
        [t.hook for t in cfg.trials()] == [t.hook for t in cross_host_job.cfg.trials()]  # the cells' own trials
    uri = store_uri(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    res = _run([sys.executable, "-m", "service.sweep", str(config)], cwd=tmp_path, timeout=JOB_TIMEOUT_S,
               env={**env, "MLFLOW_TRACKING_URI": uri, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"})
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]

    reader = open_store(uri)
    sweep = load_sweep(reader, reader.resolve_parent("cluster_basis"))
    cluster = report_section(sweep.config_text).cluster
    transport = pricing(reader, sweep.parent_run_id, report_section(sweep.config_text)).transport
    assert transport.link_gbps == LINK_GBPS
    errors = {}
    basis_steps = {t.record.config: t.record.metrics["step_time_ms_median"] for t in sweep.trials}
    for basis in projection.bases(sweep.trials, recommendations(sweep), reader.step_timeline):
        def at(link_gbps: float, fit=transport) -> float:
            return projection.project_cell(basis, cluster.world_size, link_gbps, cluster.latency_ms,
                                           transport=fit).step_ms
        cell, own_link = at(cluster.link_gbps), at(BASIS_LINK_GBPS)
        twice = at(cluster.link_gbps, replace(transport, link_gbps=None))  # as before: the probe's wire twice
        measured = cross_host_job.metrics[basis.config]["step_time_ms_median"]
        errors[basis.config] = cell / measured - 1
        print(f"{basis.config}: W = 2 on {LINK_GBPS:g} Gbit/s projected {cell:.1f} ms/step (its wire counted "
              f"twice: {twice:.1f}; at the basis's {BASIS_LINK_GBPS:g} Gbit/s {own_link:.1f}) from a basis measured "
              f"at {basis_steps[basis.config]:.1f} ms/step; measured on the cluster {measured:.1f} ms/step: error "
              f"{100 * errors[basis.config]:+.1f} % ({100 * (twice / measured - 1):+.1f} % twice)")
        if basis.config == "quantization_pertensor":  # an allgather: transport and wire add up
            assert own_link < cell < twice, (own_link, cell, twice)
        else:  # allreduce: the slower of the probed transport (its 1 Gbit/s wire in it) and the cell's wire
            assert own_link <= cell == twice, (own_link, cell, twice)
        assert cell > 0 and measured > 0  # the comparison itself is measured, not asserted (docstring)
    assert set(errors) == {"allreduce", "quantization_pertensor"}
    # the report says which hosts priced it: the cluster's probe, two hosts of HOST_CPUS cores, its link
    summary = next(iter((tmp_path / "results").rglob("summary.md"))).read_text()
    assert "priced with your cluster's transport probe" in summary.splitlines()[3]
    assert f"your cluster's probe ({cluster_probe.path}), probed W = 2 across 2 hosts" in summary
    assert f"across links of {LINK_GBPS:g} Gbit/s" in summary
    # the sweep copied the probe onto its parent run: with the file gone, a rebuild from MLflow
    # alone gives the same answer.json
    from service.report import build_report

    written = next(iter((tmp_path / "results").rglob("answer.json"))).read_text()
    aside = Path(str(cluster_probe.path) + ".moved")
    os.rename(cluster_probe.path, aside)
    try:
        build_report(sweep.parent_run_id, uri, tmp_path / "rebuilt", attach=False)
    finally:
        os.rename(aside, cluster_probe.path)
    assert (tmp_path / "rebuilt" / "answer.json").read_text() == written
