"""Emulated hosts that own their CPU (service/network/host_cpu.py, network.host_cpus).

* the names: a host's cgroup is named as its namespace, and leftover removal takes exactly the
  cgroups of dead owners, never a live owner's nor anything not named as ours (a fake hierarchy
  in a temporary folder: no root needed);
* for real (root, the kernel's cpu controller): a spinning process moved into a host of share q
  uses about q cores; it goes back where it was; ``remove_owned`` removes the host's cgroup, even
  with a process still inside; the preflight refuses a share that does not fit, in one line.

The sweep with network.host_cpus set is tests/test_netem.py's interrupted sweep.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.network import host_cpu, names, netem


# ----------------------------------------------------------------------------- the names (no root)


@pytest.fixture
def fake_hierarchy(tmp_path, monkeypatch):
    """A cgroup v1 cpu hierarchy that is a plain folder, this process at its top."""
    h = host_cpu.Hierarchy(1, str(tmp_path))
    monkeypatch.setattr(host_cpu, "hierarchy", lambda *a: h)
    monkeypatch.setattr(host_cpu, "own_cgroup", lambda *a: str(tmp_path))
    return tmp_path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_hosts_cgroup_is_named_as_its_namespace_with_its_owner():
    name = names.host_name(1234, "a1b2c3", 5)
    assert name == "chs-1234-a1b2c3-h5" and names.owner_of(name) == 1234
    for other in ("docker", "chs-1234-a1b2c3", "chs-x-a1b2c3-h0", "chsa1b2c3v0", "chs-1234-A1B2C3-h0"):
        assert names.owner_of(other) is None


def test_leftovers_are_the_cgroups_of_dead_owners_and_nothing_else(fake_hierarchy):
    dead, live = _dead_pid(), os.getpid()
    for name in (names.host_name(dead, "aaaaaa", 0), names.host_name(dead, "aaaaaa", 1),
                 names.host_name(live, "bbbbbb", 0), "docker", "chs-1-notours"):
        (fake_hierarchy / name).mkdir()
    assert sorted(os.path.basename(p) for p in host_cpu.list_cgroups()) == sorted([
        names.host_name(dead, "aaaaaa", 0), names.host_name(dead, "aaaaaa", 1), names.host_name(live, "bbbbbb", 0)])
    removed = host_cpu.remove_leftovers()
    assert sorted(os.path.basename(p) for p in removed) == [names.host_name(dead, "aaaaaa", 0),
                                                            names.host_name(dead, "aaaaaa", 1)]
    assert sorted(p.name for p in fake_hierarchy.iterdir()) == sorted(["chs-1-notours", "docker",
                                                                        names.host_name(live, "bbbbbb", 0)])
    assert host_cpu.remove_where(lambda pid: pid == live) == [str(fake_hierarchy / names.host_name(live, "bbbbbb", 0))]
    assert sorted(p.name for p in fake_hierarchy.iterdir()) == ["chs-1-notours", "docker"]


def test_auto_share_keeps_the_headroom_and_rounds_down():
    assert host_cpu.auto_share(8, 2.0) == 0.2  # (2 - 0.4) / 8
    assert host_cpu.auto_share(3, 2.0) == 0.53
    assert host_cpu.auto_share(2, 16.0) == 7.8


def test_the_hierarchy_is_v1_cpu_where_mounted_else_v2(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
                      "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0\n")
    assert host_cpu.hierarchy(str(mounts)) == host_cpu.Hierarchy(1, "/sys/fs/cgroup/cpu,cpuacct")
    mounts.write_text("cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n")
    assert host_cpu.hierarchy(str(mounts)) is None


def test_the_report_names_the_hosts_share_beside_the_link_in_a_tag_safe_label():
    import re
    from types import SimpleNamespace

    from service.answer.data import Trial, link_order
    from service.answer.recommend import tag_safe

    def link(gbps, metrics):
        return Trial(record=SimpleNamespace(link_gbps=gbps, metrics=metrics)).link

    assert link(1.0, {"host_cpus": 0.8}) == "1 Gbit/s at 0.8 cores/host"
    assert link(2.5, {}) == "2.5 Gbit/s" and link(None, {"host_cpus": 0.8}) == "loopback"
    assert link_order(link(1.0, {"host_cpus": 0.8})) == 1.0
    assert re.fullmatch(r"[/\w.\- ]+", tag_safe(link(1.0, {"host_cpus": 0.8})))  # MLflow's tag names


# ----------------------------------------------------------------------------- for real (root)

real = pytest.mark.skipif(os.geteuid() != 0 or host_cpu.hierarchy() is None,
                          reason="cpu cgroups need root and the kernel's cpu controller")


def _spinner() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


@real
def test_a_process_in_a_host_of_share_q_gets_about_q_cores_and_remove_owned_removes_it():
    q = 0.25
    spinner = _spinner()
    try:
        with netem.Network(1, link_gbps=1.0, host_cpus=q) as net:
            cgroup = net.hosts[0].cgroup
            assert os.path.basename(cgroup) == net.hosts[0].namespace and cgroup in host_cpu.list_cgroups()
            with open(f"{cgroup}/cgroup.procs", "w") as f:
                f.write(str(spinner.pid))
            time.sleep(0.3)  # a period or two to settle
            before, start = host_cpu.usage_s(spinner.pid), time.monotonic()
            time.sleep(2.0)
            share = (host_cpu.usage_s(spinner.pid) - before) / (time.monotonic() - start)
            assert 0.5 * q <= share <= 1.3 * q, share  # a ceiling that holds, not a speed
            removed = netem.remove_owned()  # the spinner still inside: moved out, then removed
            assert cgroup in removed and not os.path.exists(cgroup)
        assert spinner.poll() is None  # it lives on, outside every host
        assert not [p for p in host_cpu.list_cgroups() if f"-{os.getpid()}-" in p]
    finally:
        spinner.kill()
        spinner.wait()


@real
def test_joined_moves_this_process_in_and_back():
    h = host_cpu.hierarchy()
    home = host_cpu.own_cgroup(h)
    with netem.Network(1, link_gbps=None, host_cpus=0.5) as net:
        cgroup = net.hosts[0].cgroup
        with host_cpu.joined(cgroup):
            assert host_cpu.own_cgroup(h) == cgroup
            quota = f"{cgroup}/cpu.cfs_quota_us" if h.version == 1 else f"{cgroup}/cpu.max"
            with open(quota) as f:
                assert int(f.read().split()[0]) == host_cpu.PERIOD_US // 2  # half of each period
        assert host_cpu.own_cgroup(h) == home
    assert not os.path.exists(cgroup)


@real
def test_preflight_refuses_a_share_that_does_not_fit_in_one_line():
    cores = host_cpu.machine_cores(host_cpu.hierarchy())
    with pytest.raises(host_cpu.HostCpuError) as err:
        host_cpu.preflight(cores, 2)
    text = str(err.value)
    assert "\n" not in text and "network.host_cpus" in text and "at most" in text
    assert host_cpu.preflight("auto", 2) == host_cpu.auto_share(2, cores)
    assert not [p for p in host_cpu.list_cgroups() if f"-{os.getpid()}-" in p]  # the probe is gone


@real
def test_a_sweep_whose_hosts_do_not_fit_refuses_in_one_line_before_anything(tmp_path):
    """host_cpus x the largest W over the machine's cores less the headroom: exit 2, one line,
    before the links are measured, MLflow or Ray."""
    cores = host_cpu.machine_cores(host_cpu.hierarchy())
    config = tmp_path / "c.yaml"
    sweep = (Path(__file__).parent / "network_sweep.yaml").read_text()
    config.write_text(sweep.replace("link_gbps: 1\n", f"link_gbps: 1\n  host_cpus: {cores:g}\n"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.run([sys.executable, "-m", "service.sweep", str(config)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith("error: network.host_cpus") and "at most" in lines[0], lines
    assert "Traceback" not in proc.stdout + proc.stderr and "network: link" not in proc.stdout
    assert not (tmp_path / "mlflow.db").exists()
