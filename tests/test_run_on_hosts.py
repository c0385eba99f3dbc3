"""bench/_common.py's run_on_hosts with copies: the job beside copies of itself on hosts of their
own (bench/projection.py --full, bench/host_cpus.py's full arm), each copy its own group, only the
first copy's output printed and its rank 0's result returned."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from _common import CopyHosts, join_group, run_on_hosts  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")


def _job(rank: int, world_size: int, port: int, net, out_dir: str, queue) -> None:
    import torch
    import torch.distributed as dist

    join_group(port, rank, world_size, timeout_s=120)
    ones = torch.ones(1)
    dist.all_reduce(ones)  # the group's size: its own copy's ranks only
    net.reshape(None)  # the first copy's reshapes every host's link; a copy's, nothing
    host = net.hosts[rank].namespace
    Path(out_dir, f"{host}.json").write_text(json.dumps({"rank": rank, "sum": ones.item(),
                                                         "copy": isinstance(net, CopyHosts)}))
    print(f"rank {rank} on {host}", flush=True)
    dist.destroy_process_group()
    queue.put((rank, {"rank": rank, "host": host, "copy": isinstance(net, CopyHosts)}, None))


def test_copies_run_beside_the_job_as_groups_of_their_own_and_only_the_first_speaks(tmp_path, capfd):
    first = run_on_hosts(_job, 2, None, (str(tmp_path),), timeout_s=300, copies=3)
    seen = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert len(seen) == 6, seen  # three copies of two ranks, each on a host of its own
    assert all(s["sum"] == 2.0 for s in seen.values())  # three groups of 2, not one of 6
    assert sorted(s["copy"] for s in seen.values()) == [False] * 2 + [True] * 4
    assert first["rank"] == 0 and not first["copy"] and first["host"] in seen
    printed = [line for line in capfd.readouterr().out.splitlines() if line.startswith("rank ")]
    assert sorted(printed) == sorted(f"rank {s['rank']} on {h}" for h, s in seen.items() if not s["copy"])


def _sleeper(rank: int, world_size: int, port: int, net, ready_dir: str, queue) -> None:
    import time

    Path(ready_dir, f"{rank}-{os.getpid()}").write_text("")
    time.sleep(600)


def _terminated_once_ready(proc, ready) -> str:
    """SIGTERM ``proc`` once ``ready()`` (its ranks inside their hosts); its stderr. Asserts it
    stopped as on Ctrl-C and left none of its hosts' namespaces or cgroups."""
    import signal
    import subprocess
    import time

    from service.network import host_cpu

    try:
        deadline = time.monotonic() + 120
        while not ready():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)  # ranks left running would hold its pipes open
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err
    owner = f"chs-{proc.pid}-"
    assert owner not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert [p for p in host_cpu.list_cgroups() if owner in p] == []
    return err


def test_sigterm_mid_run_stops_the_ranks_and_removes_every_host(tmp_path):
    """SIGTERM to a bench running ranks on emulated hosts (as `kill` or a CI timeout sends): it
    used to end the bench at once, with its ranks still running and its hosts' namespaces, links
    and cgroups left behind."""
    import subprocess

    script = ("import sys; sys.path.insert(0, 'bench'); from _common import run_on_hosts; "
              "from tests.test_run_on_hosts import _sleeper; "
              f"run_on_hosts(_sleeper, 2, 0.2, ({str(tmp_path)!r},), timeout_s=600, copies=2)")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    _terminated_once_ready(proc, lambda: len(list(tmp_path.iterdir())) == 4)  # both copies' ranks
    ranks = [int(p.name.split("-")[1]) for p in tmp_path.iterdir()]
    assert [pid for pid in ranks if Path(f"/proc/{pid}").exists()] == []  # killed, reaped by init


def test_sigterm_mid_run_of_host_cpus_stops_its_forked_ranks_and_removes_its_hosts():
    """bench/host_cpus.py forks its ranks itself (not run_on_hosts): the same SIGTERM left them and
    its hosts behind."""
    import subprocess

    from service.network import host_cpu

    cmd = [sys.executable, str(ROOT / "bench" / "host_cpus.py"), "--world-sizes", "2", "--rounds", "1", "--steps", "300",
           "--arms", "hosts", "--ray-s", "0", "--out", os.devnull]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    owner = f"chs-{proc.pid}-"
    _terminated_once_ready(proc, lambda: len([p for p in host_cpu.list_cgroups()
                                              if owner in p and Path(p, "cgroup.procs").read_text().strip()]) == 2)
    left = subprocess.run(["pgrep", "-f", "bench/host_cpus.py --world-sizes 2 --rounds 1 --steps 300"],
                          capture_output=True, text=True).stdout.split()
    assert left == [], left
