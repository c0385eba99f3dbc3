"""Emulated hosts for real (service/network/netem.py, service/network/link_measure.py, the sweep's network:).

Real network namespaces, veth links, a bridge and tc qdiscs (CI runs as root on this machine),
real gloo groups whose sockets live in the namespaces, real sweeps (local Ray, SQLite MLflow):

* a network's namespaces, addresses and shaping exist while it does, and nothing after;
* a gloo group made with ``process_group_on_host`` computes the right allreduce and its bytes
  leave through the hosts' shaping qdiscs (tc's counters), not loopback;
* leftovers of a SIGKILLed owner are removed (by ``remove_leftovers`` and by the next sweep);
* without CAP_NET_ADMIN/CAP_SYS_ADMIN (``setpriv`` drops them) or without ``tc``, the sweep
  refuses in one line, exit 2, before MLflow or Ray, leaving nothing behind;
* one real sweep over two links on hosts of their own CPU share (network.host_cpus), interrupted
  while a timing trial trains and resumed: the interrupt removes the trial's hosts and cgroups,
  each timing run logs its link (params, measured rate, bytes sent) and its hosts' share, quality
  trains once and each link is timed;
* the last test: ``ip netns list`` / ``ip link`` / ``iptables -S FORWARD`` show nothing of ours.

Speeds are never asserted (bench/projection.py measures them); the shaping is checked by what tc
counted and by the measured rate never exceeding the asked one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.stores import store_uri

from service.network import link_measure

from service.network import host_cpu, names, netem
from service.sweep.processes import Proc

ROOT = Path(__file__).resolve().parent.parent
NETWORK_SWEEP = ROOT / "tests" / "network_sweep.yaml"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")

# the processes this module started that may own namespaces (the final check's scope), each
# known by pid *and* start time: once one ends, the kernel may give its pid to another test's
# owner (pid_max is 32768 here, and a suite's Ray workers wrap it), whose hosts are not ours
_OWNERS: set[Proc] = {Proc.of(os.getpid())}


def _own(pid: int) -> None:
    _OWNERS.add(Proc.of(pid))


def _mine(pid: int) -> bool:
    """Owned by a process this module started, or by one no longer alive (a leak, whoever's)."""
    now = Proc.of(pid)
    return now is None or now in _OWNERS


def _ours() -> tuple[list[str], list[str]]:
    """(namespaces, links) of this test session's owners, or of owners no longer alive."""
    ns = [n for n in netem.list_namespaces() if _mine(int(n.split("-")[1]))]
    links = [name for name, pid in netem.list_links() if _mine(pid)]
    return ns, links


def _sweep_env(uri: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    return env


# ----------------------------------------------------------------------------- the config


def _config(tmp_path, network: str, extra: str = ""):
    from service.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text(NETWORK_SWEEP.read_text().replace("network:\n  link_gbps: 1\n", network) + extra)
    return load_config(path)[0]


def test_link_gbps_is_a_sweep_axis_in_key_name_and_grid(tmp_path):
    cfg = _config(tmp_path, "network:\n  link_gbps: [1, 2.5]\n")
    trials = cfg.trials()
    assert [t.link_gbps for t in trials] == [1.0, 2.5]
    assert [t.run_name for t in trials] == ["allreduce-w2-s0-1gbps", "allreduce-w2-s0-2.5gbps"]
    assert len({t.key for t in trials}) == 2
    assert cfg.network.latency_ms == 0.0
    plain = _config(tmp_path, "").trials()  # no network: nothing changes
    assert plain[0].link_gbps is None and plain[0].run_name == "allreduce-w2-s0"
    assert plain[0].key == "allreduce[]-w2-s0"


def test_two_links_train_quality_once_and_time_each_link(tmp_path):
    """Issue 24 item 3: with several links a (configuration, world size, seed) trains its steps
    once on loopback (kind quality) and each link gets a timing run of network.timing_steps steps;
    the kind is in the trial's key and run name, and the timing run's config is cut to its steps."""
    longer = "network:\n  link_gbps: [1, 2.5]\n  timing_steps: 4\n"
    cfg = _config(tmp_path, longer)  # 8 steps: 8 + 2 x 4 = 16 steps, not 2 x 8 = 16: no saving
    assert not cfg.splits_links and [t.kind for t in cfg.trials()] == ["full", "full"]
    cfg = _config(tmp_path, longer.replace("4", "3"))  # 8 + 2 x 3 < 16: split
    trials = cfg.trials()
    assert [(t.run_name, t.kind, t.link_gbps) for t in trials] == [
        ("allreduce-w2-s0-quality", "quality", None), ("allreduce-w2-s0-1gbps-timing", "timing", 1.0),
        ("allreduce-w2-s0-2.5gbps-timing", "timing", 2.5)]
    assert [t.key for t in trials] == ["allreduce[]-w2-s0-quality", "allreduce[]-w2-s0-l1-timing",
                                       "allreduce[]-w2-s0-l2.5-timing"]
    assert [cfg.run_config(t).workload.steps for t in trials] == [8, 3, 3]
    assert cfg.run_config(trials[1]).workload.eval_every == 3 and cfg.run_config(trials[0]) is cfg
    single = _config(tmp_path, "network:\n  link_gbps: 1\n")  # one link: as before, whatever timing_steps says
    assert single.fingerprint() == _config(tmp_path, "network:\n  link_gbps: 1\n  timing_steps: 3\n").fingerprint()
    from service.config import ConfigError

    with pytest.raises(ConfigError, match="network.timing_steps: 2 leaves no step after the 2 warm-up steps"):
        _config(tmp_path, longer.replace("4", "2"))


@pytest.mark.parametrize("network, expected", [
    ("network:\n  link_gbps: [1, 0]\n", "network.link_gbps[1]: 0 is not allowed"),
    ("network:\n  link_gbps: [1, 1]\n", "lists a rate twice"),
    ("network:\n  link_gbps: 1\n  latency: 1\n", "network.latency: unknown key (did you mean 'latency_ms'?)"),
    ("network:\n  link_gbps: 1\n  latency_ms: -1\n", "network.latency_ms"),
    ("network:\n  latency_ms: 1\n", "network.link_gbps: missing"),
    ("network:\n  link_gbps: 1\n  host_cpus: 0.05\n", "network.host_cpus: 0.05 is not allowed; a host has 0.1"),
    ("network:\n  link_gbps: 1\n  host_cpus: all\n", "network.host_cpus: 'all' is not allowed; cores per host"),
])
def test_bad_network_section_is_one_line(tmp_path, network, expected):
    from service.config import ConfigError

    with pytest.raises(ConfigError) as err:
        _config(tmp_path, network)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_network_with_gpus_is_refused(tmp_path):
    from service.config import ConfigError, load_config

    path = tmp_path / "gpu.yaml"
    path.write_text(NETWORK_SWEEP.read_text().replace("cpus_per_worker: 0.5", "cpus_per_worker: 0.5\n  use_gpu: true"))
    with pytest.raises(ConfigError, match="NCCL would bypass them"):
        load_config(path)


# ----------------------------------------------------------------------------- the network


def test_network_exists_while_open_and_is_gone_after():
    with netem.Network(3, link_gbps=1.0) as net:
        names = set(netem.list_namespaces())
        assert {h.namespace for h in net.hosts} <= names
        assert [h.address for h in net.hosts] == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
        for host in net.hosts:
            addr = subprocess.run(["ip", "-n", host.namespace, "-4", "addr", "show", "dev", host.ifname],
                                  capture_output=True, text=True, check=True).stdout
            assert f"{host.address}/24" in addr
            qdisc = subprocess.run(["ip", "netns", "exec", host.namespace, "tc", "qdisc", "show", "dev",
                                    host.ifname], capture_output=True, text=True, check=True).stdout
            assert "tbf" in qdisc and "rate 1Gbit" in qdisc
        # host 0 reaches host 2 through the bridge (a TCP connection made inside the namespaces)
        probe = textwrap.dedent(f"""
            import socket, threading
            from service.network import netem
            with netem.entered({net.hosts[2].namespace!r}):
                server = socket.create_server(("{net.hosts[2].address}", 0))
            port = server.getsockname()[1]
            threading.Thread(target=lambda: server.accept()[0].sendall(b"hi"), daemon=True).start()
            with netem.entered({net.hosts[0].namespace!r}):
                client = socket.create_connection(("{net.hosts[2].address}", port), timeout=10)
            print(client.recv(2).decode())
        """)
        got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
        assert got.stdout.strip() == "hi", got.stderr
        bridge = net.bridge
        assert bridge in {name for name, _ in netem.list_links()}
    assert not {h for h in names if h.startswith(f"{netem.PREFIX}-{os.getpid()}-{net.token}")} & set(netem.list_namespaces())
    assert bridge not in {name for name, _ in netem.list_links()}
    out = subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert net.token not in out


def test_entered_moves_only_the_calling_thread_and_comes_back():
    import socket

    def addresses() -> set[str]:
        out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        return {line.split()[3] for line in out.splitlines()}

    home = os.readlink("/proc/thread-self/ns/net")
    with netem.Network(1, link_gbps=1.0) as net:
        with netem.entered(net.hosts[0].namespace):
            inside = os.readlink("/proc/thread-self/ns/net")
            # a socket bound to the host's address works only inside its namespace
            sock = socket.socket()
            sock.bind((net.hosts[0].address, 0))
            sock.close()
        assert inside != home
        assert os.readlink("/proc/thread-self/ns/net") == home
        assert os.readlink(f"/proc/{os.getpid()}/ns/net") == home  # the process never moved
        assert f"{net.hosts[0].address}/24" not in addresses()


def _shaped_allreduce(rank: int, world_size: int, hosts) -> dict:
    import torch
    import torch.distributed as dist

    group = netem.process_group_on_host(hosts[rank])
    t = torch.full((2_000_000,), float(rank + 1))  # 8 MB
    dist.all_reduce(t, group=group)
    return {"min": t.min().item(), "max": t.max().item()}


@pytest.mark.parametrize("world_size", [2, 4])
def test_gloo_group_on_hosts_computes_and_sends_through_the_shaped_links(world_size):
    from tests.dist_utils import run_distributed

    with netem.Network(world_size, link_gbps=2.5) as net:
        before = net.tx_bytes()
        results = run_distributed(_shaped_allreduce, world_size, (net.hosts,))
        sent = [a - b for a, b in zip(net.tx_bytes(), before)]
    expected = world_size * (world_size + 1) / 2
    assert all(r["min"] == r["max"] == expected for r in results)
    # a ring allreduce sends 2(W-1)/W of the 8 MB from every host: all of it left through tbf
    # (the default group's loopback never reaches these counters)
    wire = 2 * (world_size - 1) / world_size * 8_000_000
    assert all(s >= wire for s in sent), (sent, wire)
    assert all(s < 1.2 * wire for s in sent), (sent, wire)  # frames' headers, not another copy


def _train_on_hosts(rank: int, world_size: int, hosts, hook: str) -> dict:
    from service.config import SweepConfig
    from service.train import TrainingContext, run_training
    from tests.tiny_workload import TINY

    cfg = SweepConfig.model_validate({
        "name": "netem-worker", "search": {"hooks": [hook], "world_size": [world_size], "seed": [0]},
        "workload": {"name": TINY, "steps": 6, "global_batch_size": 32, "lr": 0.05, "eval_every": 6,
                     "warmup_steps": 1},
        "network": {"link_gbps": 1}})
    trial = cfg.trials()[0]
    result = run_training(trial, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu",
                          process_group=netem.process_group_on_host(hosts[rank])))
    return {"status": result.status, "steps": result.steps_done,
            "wire": result.summary["comm_bytes_per_step"] * result.steps_done, "losses": result.losses}


@pytest.mark.parametrize("hook", ["allreduce", "quantized_allreduce"])
def test_run_training_on_the_hosts_group_sends_its_gradients_through_the_links(hook):
    """service.train.run_training with the group train_loop_per_worker makes (no Ray): DDP's
    and the hook's bytes all leave through the hosts' shaped qdiscs."""
    from tests.dist_utils import run_distributed

    with netem.Network(2, link_gbps=1.0) as net:
        before = net.tx_bytes()
        results = run_distributed(_train_on_hosts, 2, (net.hosts, hook))
        sent = [a - b for a, b in zip(net.tx_bytes(), before)]
    assert [r["status"] for r in results] == ["ok", "ok"] and results[0]["steps"] == 6
    assert results[0]["losses"] == results[1]["losses"]  # the ranks agreed on every step
    for rank, r in enumerate(results):
        assert sent[rank] >= r["wire"] > 0, (sent, r["wire"])


def test_link_measurement_reports_the_shaped_rate_and_the_check_refuses_a_short_link():
    m = link_measure.measure(1.0)
    assert 0 < m.measured_gbps <= 1.0  # tbf caps it: payload never exceeds the frame rate
    assert m.measured_latency_ms > 0
    link_measure.check(link_measure.LinkMeasurement(1.0, 0.0, 0.85, 0.05))  # 85%: fine
    with pytest.raises(netem.NetemError) as err:
        link_measure.check(link_measure.LinkMeasurement(2.5, 0.0, 1.5, 0.05))
    text = str(err.value)
    assert "\n" not in text and "link_gbps 2.5" in text and "1.50 Gbit/s" in text and "60%" in text


def test_latency_needs_netem_which_the_preflight_checks():
    kernel_has_netem = True
    with netem.Network(1, link_gbps=None) as net:
        ns = net.hosts[0].namespace
        probe = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "netem",
                                "delay", "1ms"], capture_output=True, text=True)
        kernel_has_netem = probe.returncode == 0
    if kernel_has_netem:
        netem.preflight(1.0, latency_ms=0.5)  # builds a delayed link and removes it
    else:
        with pytest.raises(netem.NetemError) as err:
            netem.preflight(1.0, latency_ms=0.5)
        assert "sch_netem" in str(err.value) and "latency_ms: 0" in str(err.value)
    assert _ours() == ([], [])


# ----------------------------------------------------------------------------- leftovers


def _start_owner_and_kill(hosts: int = 2) -> tuple[int, list[str]]:
    """A process that builds a network and is SIGKILLed: (its pid, its namespaces)."""
    code = ("import sys, time; from service.network import netem; net = netem.Network(%d, 1.0).create(); "
            "print('ready', flush=True); time.sleep(600)" % hosts)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    _own(proc.pid)
    assert proc.stdout.readline().strip() == "ready"
    mine = [n for n in netem.list_namespaces() if n.startswith(f"{netem.PREFIX}-{proc.pid}-")]
    proc.kill()
    proc.wait()
    return proc.pid, mine


def test_leftovers_of_a_killed_owner_are_removed_and_live_owners_are_left_alone():
    pid, leftover = _start_owner_and_kill()
    assert len(leftover) == 2
    links = [name for name, owner in netem.list_links() if owner == pid]
    assert len(links) == 3  # the bridge and two veths: namespaces outlive the process that made them
    with netem.Network(1, link_gbps=1.0) as alive:  # owned by this (live) process
        removed = netem.remove_leftovers()
        assert set(leftover) <= set(removed)  # (their veths go with the namespaces)
        assert alive.hosts[0].namespace in netem.list_namespaces()
        assert alive.bridge in {name for name, _ in netem.list_links()}
    assert not [n for n in netem.list_namespaces() if f"-{pid}-" in n]
    assert not [name for name, owner in netem.list_links() if owner == pid]


# ----------------------------------------------------------------------------- refusals


def _no_ray_started(workdir: Path) -> None:
    assert not (workdir / "mlflow.db").exists()  # not even the tracking store was opened
    assert not (workdir / "results" / "network_one").exists() or not any(
        (workdir / "results" / "network_one").glob("*/"))


def test_sweep_refuses_without_cap_net_admin_in_one_line(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.run(["setpriv", "--bounding-set=-net_admin,-sys_admin", sys.executable, "-m",
                           "service.sweep", str(NETWORK_SWEEP)], cwd=tmp_path, env=_sweep_env(uri),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: network:"), proc.stderr
    assert "CAP_NET_ADMIN" in lines[0] and "CAP_SYS_ADMIN" in lines[0] and "root" in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    _no_ray_started(tmp_path)
    assert _ours() == ([], [])


def test_sweep_refuses_without_tc_in_one_line(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ip").symlink_to(subprocess.run(["which", "ip"], capture_output=True, text=True).stdout.strip())
    env = _sweep_env(f"sqlite:///{tmp_path / 'mlflow.db'}")
    env["PATH"] = str(bin_dir)
    proc = subprocess.run([sys.executable, "-m", "service.sweep", str(NETWORK_SWEEP)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "lacks tc" in lines[0] and "iproute2" in lines[0], proc.stderr
    _no_ray_started(tmp_path)


# ----------------------------------------------------------------------------- sweeps


def _wait_until(proc: subprocess.Popen, log: Path, predicate, timeout: float = 600) -> None:
    """Poll ``predicate()`` until it holds (fails if the sweep ends first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError(f"timed out: {log.read_text()}")


@pytest.mark.ray
@pytest.mark.timeout(1200)
def test_a_two_link_sweep_on_hosts_of_their_own_cpu_interrupted_then_resumed(tmp_path):
    """Issue 24 item 3 and issue 39 item 1 in one real sweep (two were one each, ~140 s of the
    suite apart): allreduce at W = 2, seed 0, over links of 0.2 and 0.5 Gbit/s (~1.4 and ~0.55 s a
    step of mlp_digits' 34 MB: well below what a busy 2-core machine delivers), on hosts of 0.8
    cores each (network.host_cpus). Quality trains once, 12 steps on loopback; each link runs 4
    timing steps on its two hosts.

    * a killed sweep's leftover hosts are removed at the start; the transport is probed on two
      0.8-core hosts, not on loopback;
    * SIGINT once the first timing trial's ranks are inside their hosts' CPU cgroups (one process
      each) ends the sweep (130), its run KILLED, its hosts and cgroups removed;
    * --resume finishes it: the timing runs' losses are the quality run's first 4 bit for bit (the
      premise, on the sweep's own paths), each link has its time to target (its timing run,
      summary.csv, the answer's tags), each timing run its link (params, measured rate, the bytes
      tc counted) and its hosts' share; a second plan of --resume finds every trial done and
      measures no link."""
    import csv

    from mlflow.tracking import MlflowClient

    from service.config import load_config
    from service.sweep.resume import plan_resume
    from service.tracking import SweepReader

    pid, leftover = _start_owner_and_kill(1)  # a killed sweep's hosts: the next start removes them
    assert leftover
    config = tmp_path / "split.yaml"
    config.write_text(NETWORK_SWEEP.read_text().replace("steps: 8", "steps: 12").replace("eval_every: 8", "eval_every: 4")
                      .replace("name: network_one", "name: network_split")
                      .replace("link_gbps: 1\n", "link_gbps: [0.2, 0.5]\n  timing_steps: 4\n  host_cpus: 0.8\n")
                      .replace("transport_probe: false", "transport_probe: true"))
    uri = store_uri(tmp_path)

    def sweep(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "service.sweep", str(config), *args], cwd=tmp_path,
                              env=_sweep_env(uri), capture_output=True, text=True, timeout=840)

    plan = sweep("--dry-run")
    assert plan.returncode == 0 and "quality once, time per link" in plan.stdout, plan.stdout + plan.stderr
    assert "3 trials" in plan.stdout and sum(ln.endswith(" timing") for ln in plan.stdout.splitlines()) == 2, plan.stdout

    log = tmp_path / "out.txt"
    with open(log, "w") as out_file:
        proc = subprocess.Popen([sys.executable, "-m", "service.sweep", str(config)], cwd=tmp_path,
                                env=_sweep_env(uri), stdout=out_file, stderr=subprocess.STDOUT, text=True)
    _own(proc.pid)

    def ranks_in_their_hosts() -> bool:
        if "transport measured" not in log.read_text():  # the probe's own hosts come first
            return False
        cgroups = _host_cgroups(proc.pid)
        return len(cgroups) == 2 and all(len(Path(c, "cgroup.procs").read_text().split()) == 1 for c in cgroups)

    try:
        _wait_until(proc, log, ranks_in_their_hosts)  # a timing trial trains on its two hosts
        mine = [n for n in netem.list_namespaces() if n.startswith(f"{netem.PREFIX}-{proc.pid}-")]
        assert sorted(os.path.basename(p) for p in _host_cgroups(proc.pid)) == sorted(mine)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = log.read_text()
    assert proc.returncode == 130, out
    assert not [n for n in netem.list_namespaces() if f"-{proc.pid}-" in n]
    assert not [name for name, owner in netem.list_links() if owner == proc.pid]
    assert not [p for p in host_cpu.list_cgroups() if f"-{proc.pid}-" in p]
    assert "left by a killed sweep" in out and "each emulated host owns 0.8 cores" in out
    assert not [n for n in netem.list_namespaces() if f"-{pid}-" in n]
    assert "transport measured at W = 2" in out
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("network_split")

    def runs() -> dict:
        return {r.info.run_name: r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags}

    interrupted = [r for r in runs().values() if r.data.tags["trial_kind"] == "timing"]
    assert [r.info.status for r in interrupted] == ["KILLED"], [(r.info.run_name, r.info.status) for r in interrupted]
    # the transport was probed where the trials train: two hosts of 0.8 cores, one rank each
    [probed] = SweepReader(uri).transport(interrupted[0].data.tags["mlflow.parentRunId"]).hosts
    assert (probed.world_size, probed.hosts, probed.ranks_per_host, probed.loopback) == (2, 2, 1, False), probed
    assert probed.cores == pytest.approx(0.8), probed

    resumed = sweep("--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    said = out + resumed.stdout
    assert "network: link 0.2 Gbit/s" in said and "network: link 0.5 Gbit/s" in said
    done = runs()
    assert sorted(done) == ["allreduce-w2-s0-0.2gbps-timing", "allreduce-w2-s0-0.5gbps-timing",
                            "allreduce-w2-s0-quality"]
    quality = done.pop("allreduce-w2-s0-quality")
    assert quality.data.tags["trial_kind"] == "quality" and quality.data.tags["trial_link_gbps"] == ""
    assert quality.data.metrics["steps_done"] == 12 and "link_gbps" not in quality.data.params
    assert "time_to_target_s" not in quality.data.metrics and "link_tx_bytes" not in quality.data.metrics
    losses = [m.value for m in sorted(client.get_metric_history(quality.info.run_id, "loss"), key=lambda m: m.step)]
    assert len(losses) == 12
    for name, run in done.items():
        m, link = run.data.metrics, float(run.data.tags["trial_link_gbps"])
        assert run.info.status == "FINISHED" and run.data.tags["status"] == "ok", name
        assert run.data.tags["trial_kind"] == "timing" and m["steps_done"] == 4 and run.data.params["steps"] == "4", name
        assert float(run.data.params["link_gbps"]) == link and run.data.params["latency_ms"] == "0.0", name
        assert 0.8 * link <= m["link_measured_gbps"] <= link, (name, m["link_measured_gbps"])
        # every step's gradients left both hosts through their tbf: tc counted at least the
        # hook's own wire bytes of every step on each of the 2 hosts
        assert m["link_tx_bytes"] >= 2 * m["comm_bytes_per_step"] * m["steps_done"], name
        assert m["host_cpus"] == 0.8, name  # the share its hosts had
        # its ranks computed in the share, their gloo threads beside it: the emulation the cluster bands describe
        assert m["comm_threads_apart"] == 1.0, name
        # (by step: the interrupted run's own points, if it logged any before SIGINT, are the same steps)
        timed = {x.step: x.value for x in client.get_metric_history(run.info.run_id, "loss")}
        assert [timed[k] for k in sorted(timed)] == losses[:4], name  # the same math on the shaped link as on loopback
        assert m["time_to_target_s"] > 0, name
    with next(tmp_path.rglob("summary.csv")).open() as f:
        rows = {row["link"]: row for row in csv.DictReader(f)}  # one row per (configuration, W, link)
    # a link of hosts that own their CPU says so wherever it is named
    assert sorted(rows) == ["0.2 Gbit/s at 0.8 cores/host", "0.5 Gbit/s at 0.8 cores/host"], rows
    for link, row in rows.items():
        timing = done[f"allreduce-w2-s0-{link.split()[0]}gbps-timing"].data.metrics
        assert float(row["time_to_target_s_mean"]) == pytest.approx(timing["time_to_target_s"])
        assert float(row["final_eval_loss_mean"]) == quality.data.metrics["final_eval_loss"]  # quality: once
        assert float(row["step_time_ms_median_mean"]) == timing["step_time_ms_median"]  # speed: the link's
    parent = client.get_run(quality.data.tags["mlflow.parentRunId"])
    assert {"recommended.w2.0.2Gbitpersat0.8coresperhost",
            "recommended.w2.0.5Gbitpersat0.8coresperhost"} <= set(parent.data.tags)
    # --resume matches the quality and timing runs by key: nothing left to run, so it measures
    # no link (a busy moment's measurement cannot refuse to resume a finished sweep)
    cfg = load_config(config)[0]
    plan = plan_resume(cfg, cfg.trials(), uri)
    assert (plan.reusable_runs, plan.pending) == ({}, [])
    again = sweep("--resume")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Nothing left to run." in again.stdout and "network: link" not in again.stdout
    assert _ours() == ([], [])


def test_interrupt_during_the_link_measurement_leaves_nothing(tmp_path):
    """SIGTERM while the sweep measures its link (before Ray): exit 130, the hosts removed."""
    proc = subprocess.Popen([sys.executable, "-m", "service.sweep", str(NETWORK_SWEEP)], cwd=tmp_path,
                            env=_sweep_env(f"sqlite:///{tmp_path / 'mlflow.db'}"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _own(proc.pid)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the measurement's two hosts
            if len([n for n in netem.list_namespaces() if n.startswith(f"{netem.PREFIX}-{proc.pid}-")]) == 2:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out
    assert not [n for n in netem.list_namespaces() if f"-{proc.pid}-" in n]
    assert not [name for name, owner in netem.list_links() if owner == proc.pid]
    _no_ray_started(tmp_path)


def test_zz_nothing_of_ours_is_left_on_the_machine():
    """Last in the file: no namespace or link of this module's owners (or of dead ones) remains."""
    ns, links = _ours()
    assert ns == [] and links == []
    rules = [rule for rule, pid in netem.list_rules() if _mine(pid)]
    assert rules == []  # the FORWARD rules of networks where the firewall sees bridged frames
    assert not [p for p in host_cpu.list_cgroups() if _mine(names.owner_of(os.path.basename(p)))]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for owner in _OWNERS - {None}:
        if _mine(owner.pid):  # (a pid now another test's: its hosts are not ours)
            assert f"{netem.PREFIX}-{owner.pid}-" not in listed


def _host_cgroups(owner: int) -> list[str]:
    """``owner``'s host cgroups, without the comm cgroups beside them (host_cpu.comm_cgroup)."""
    return [p for p in host_cpu.list_cgroups() if f"-{owner}-" in p
            and int(names.HOST_RE.match(os.path.basename(p)).group(3)) < host_cpu.COMM_INDEX]
