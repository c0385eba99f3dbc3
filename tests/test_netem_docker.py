"""The emulated network beside a running Docker engine (root; a real dockerd).

dockerd turns on br_netfilter (net.bridge.bridge-nf-call-iptables = 1) and sets iptables'
FORWARD policy to DROP, so the frames between two emulated hosts on their bridge went through
the host's firewall and were dropped: the network sweep failed after 120 s of link measurement.
Here, with the engine running:

* a real network sweep trains on its 1 Gbit/s link and leaves the host's firewall exactly as
  it found it (``iptables-save``, counters aside);
* a bridge that the firewall still blocks (a DROP of the test's own above the network's ACCEPT)
  is refused in one line saying why, by the connection check the link measurement runs first;
* a killed owner's ACCEPT rule is removed with its namespaces by ``remove_leftovers``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.stores import store_uri

from service.network import netem
from tests.docker_engine import docker_engine

ROOT = Path(__file__).resolve().parent.parent
NETWORK_SWEEP = ROOT / "tests" / "network_sweep.yaml"
pytestmark = [pytest.mark.docker,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")]


@pytest.fixture(scope="module", autouse=True)
def engine():
    """The running engine, and its FORWARD policy DROP. Docker sets DROP where it turns IP
    forwarding on itself; on a machine where forwarding was already on (an earlier dockerd),
    it leaves the policy alone, so the test sets what Docker sets, and puts the policy back."""
    with docker_engine():
        policy = _forward_policy()
        if policy != "DROP":
            subprocess.run(["iptables", "-w", "-P", "FORWARD", "DROP"], check=True)
        try:
            yield
        finally:
            if policy != "DROP":
                subprocess.run(["iptables", "-w", "-P", "FORWARD", policy], check=True)


def _forward_policy() -> str:
    out = subprocess.run(["iptables", "-w", "-S", "FORWARD"], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0].split()[-1]  # "-P FORWARD ACCEPT"


def _firewall(owner: int | None = None) -> str:
    """The host's iptables rules, without the packet counters that change as traffic flows and
    without the rules of other emulated networks than ``owner``'s (tests beside this one)."""
    text = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    keep = [re.sub(r"\[\d+:\d+\]", "", line) for line in text.splitlines() if not line.startswith("#")]
    return "\n".join(line for line in keep if "chs owner=" not in line or f"chs owner={owner}\"" in line)


def test_without_its_rule_a_bridge_beside_docker_drops_its_frames():
    # what makes this module mean something: the firewall that used to drop the hosts' frames
    assert Path(netem.BRIDGE_NF).read_text().strip() == "1" and _forward_policy() == "DROP"
    with netem.Network(2, link_gbps=1.0) as net:
        [(rule, _)] = [(r, pid) for r, pid in netem.list_rules() if net.bridge in r]
        subprocess.run(["iptables", "-w", "-D", "FORWARD", *rule], check=True)  # today's main: no rule
        with pytest.raises(netem.NetemError, match="cannot reach each other"):
            net.check_connected(timeout_s=2.0)


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_network_sweep_runs_beside_docker_and_leaves_the_firewall_as_found(tmp_path):
    from mlflow.tracking import MlflowClient

    before = _firewall()
    uri = store_uri(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(MLFLOW_TRACKING_URI=uri, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    proc = subprocess.Popen([sys.executable, "-m", "service.sweep", str(NETWORK_SWEEP)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout, proc.stderr = proc.communicate(timeout=840)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "network: link 1 Gbit/s" in proc.stdout and "measured" in proc.stdout
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("network_one")
    runs = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    assert [r.data.tags["status"] for r in runs] == ["ok"]
    m = runs[0].data.metrics
    assert m["link_tx_bytes"] >= 2 * m["comm_bytes_per_step"] * m["steps_done"]  # it crossed the link
    assert _firewall(owner=proc.pid) == before  # the sweep's rules (owned by its driver) are gone


def test_a_bridge_the_firewall_still_blocks_is_refused_in_one_line_saying_why():
    with netem.Network(2, link_gbps=1.0) as net:
        net.check_connected()  # the network's own rule lets its frames pass
        drop = ["-i", net.bridge, "-o", net.bridge, "-j", "DROP"]  # this bridge's frames only
        subprocess.run(["iptables", "-w", "-I", "FORWARD", "1", *drop], check=True)
        try:
            with pytest.raises(netem.NetemError) as err:
                net.check_connected(timeout_s=2.0)
        finally:
            subprocess.run(["iptables", "-w", "-D", "FORWARD", *drop], check=True)
    text = str(err.value)
    assert "\n" not in text and "cannot reach each other" in text and net.bridge in text
    assert "bridge-nf-call-iptables = 1" in text and "FORWARD policy DROP" in text
    assert not [rule for rule, pid in netem.list_rules() if pid == os.getpid()]


def test_a_killed_owners_rule_is_removed_with_its_hosts():
    code = ("import time; from service.network import netem; netem.Network(2, 1.0).create(); "
            "print('ready', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.kill()
    proc.wait()
    assert [pid for _, pid in netem.list_rules()].count(proc.pid) == 1
    removed = netem.remove_leftovers()
    assert any(name.startswith("iptables FORWARD") for name in removed)
    assert proc.pid not in [pid for _, pid in netem.list_rules()]
    assert not [n for n in netem.list_namespaces() if f"-{proc.pid}-" in n]
