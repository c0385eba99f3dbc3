"""service/sweep/processes.py on real processes (no Ray: LocalRay's ray.shutdown() is a no-op
when no Ray was started, so a plain process tree stands for the instance's). A process is
signalled only while it is the one recorded (same pid, same start time); stop() acts once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.sweep import processes
from service.sweep.processes import LocalRay, Proc

ROOT = Path(__file__).resolve().parent.parent

# A parent and its child, both ignoring SIGTERM and SIGINT; each prints its pid once it does.
TREE = r"""
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
if sys.argv[1] == "parent":
    subprocess.Popen([sys.executable, "-c", sys.argv[2], "child", sys.argv[2]])
print(os.getpid(), flush=True)
time.sleep(120)
"""


def test_a_tree_that_takes_no_sigterm_is_killed_every_process_of_it():
    before = processes.children()
    parent = subprocess.Popen([sys.executable, "-c", TREE, "parent", TREE], stdout=subprocess.PIPE, text=True)
    pids = {int(parent.stdout.readline()) for _ in range(2)}
    local_ray = LocalRay(processes.children() - before)  # as ray_runtime.init_local records its roots
    tree = processes.descendants(local_ray.roots)
    try:
        assert {p.pid for p in local_ray.roots} == {parent.pid}
        assert {p.pid for p in tree} == pids
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        time.sleep(0.3)
        assert processes.alive(tree) == tree, "the tree was meant to ignore SIGTERM"
        left = local_ray.stop()
    finally:
        processes.kill(tree)  # the test's own processes, whatever happened
    assert left == set()
    assert parent.wait(timeout=5) == -signal.SIGKILL
    assert not processes.alive(tree)  # the child too (reparented to init, which reaps it)
    assert local_ray.stop() == set()  # stopped once: a second call does nothing


# A parent that starts a sleeper every 20 ms and writes each one's pid to a file, for a minute at
# most: a test killed before its `finally` must not leave it forking (one did, for an hour).
SPAWNER = r"""
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
ends = time.monotonic() + 60
with open(sys.argv[1], "a") as pids:
    while time.monotonic() < ends:
        pids.write(f"{subprocess.Popen(['sleep', '30']).pid}\n")
        pids.flush()
        time.sleep(0.02)
"""


def test_a_tree_still_starting_processes_is_stopped_with_every_process_it_started(tmp_path):
    started = tmp_path / "pids"
    before = processes.children()
    parent = subprocess.Popen([sys.executable, "-c", SPAWNER, str(started)])
    try:
        while not started.exists() or len(started.read_text().split()) < 5:
            time.sleep(0.05)
        assert LocalRay(processes.children() - before).stop() == set()
        assert parent.wait(timeout=5) == -signal.SIGKILL
        sleepers = [Proc.of(int(pid)) for pid in started.read_text().split()]
        assert [p for p in sleepers if p is not None and processes.alive([p])] == []
    finally:
        parent.kill()
        parent.wait()


def test_proc_of_names_a_live_process_by_pid_and_start_time_and_an_ended_one_by_none():
    other = subprocess.Popen(["sleep", "60"])
    (seen,) = [p for p in processes.children() if p.pid == other.pid]
    assert Proc.of(other.pid) == seen
    other.kill()
    other.wait()
    assert Proc.of(other.pid) is None


def test_a_recorded_pid_that_now_names_another_process_is_left_alone():
    other = subprocess.Popen(["sleep", "60"])
    try:
        (now,) = [p for p in processes.children() if p.pid == other.pid]
        # the record of an earlier holder of the pid: it ended, and `other` took the pid after it
        earlier = Proc(other.pid, now.start - 1)
        assert processes.alive([earlier]) == set() and processes.descendants([earlier]) == set()
        assert LocalRay([earlier]).stop() == set()
        processes.kill([earlier])
        time.sleep(0.2)
        assert other.poll() is None, "another process's pid was signalled"
    finally:
        other.kill()
        other.wait()


def test_a_process_older_than_its_recorded_parent_is_not_its_child():
    ours = Proc(100, 500)
    table = {ours: 1, Proc(200, 600): 100, Proc(300, 400): 100, Proc(400, 700): 200, Proc(500, 800): 300}
    # 300 started before ours: the child of an earlier holder of pid 100, and its subtree not ours either
    assert processes.walk(table, [ours]) == {ours, Proc(200, 600), Proc(400, 700)}
    assert processes.walk(table, [Proc(100, 499)]) == set()  # pid 100 now names another process


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="a PID namespace needs root and util-linux's unshare (CI runs as root)")
def test_a_pid_reused_after_a_stop_survives_a_second_stop():
    """Real pid reuse, in a PID namespace of its own (tests/pid_reuse_check.py)."""
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                           str(ROOT / "tests" / "pid_reuse_check.py")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["roots"] == [got["first_pid"]]
    assert got["first_returncode"] == -signal.SIGKILL  # killed by the first stop
    assert got["second_pid"] == got["first_pid"], "the namespace did not hand the pid on"
    assert got["second_alive"], "a process that took a stopped process's pid was killed"
    assert got["left"] == [[], [], []]


@pytest.mark.ray
def test_a_sigterm_to_the_sweeps_process_group_leaves_its_ray_instance_to_the_sweep():
    """tests/group_signal_check.py: a local instance's processes (GCS, raylet, workers) take no
    SIGTERM sent to the sweep's group; the sweep, which handles it, still reaches the GCS and then
    stops every one of them itself."""
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "group_signal_check.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, start_new_session=True)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["processes"] >= 2  # at least a GCS and a raylet
    assert got["survived_the_group_signal"], "a Ray process of the sweep's instance died of the group's SIGTERM"
    assert got["gcs_answered"]
    assert got["left"] == [] and got["alive_after_stop"] == 0
