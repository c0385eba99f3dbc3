"""A stopped Ray's recorded pid handed to another process, for real (tests/test_processes.py runs
this as pid 1 of a new PID namespace: ``unshare --pid --fork --mount-proc``). Its pids are its
own, so writing /proc/sys/kernel/ns_last_pid gives the next process the pid just freed without
touching the machine's pids. Prints one JSON object; everything it started ends with it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

# Loaded by its path: the service.sweep package imports the config and torch (10 s on a busy
# machine), and this module needs none of it.
_PATH = Path(__file__).resolve().parent.parent / "service" / "sweep" / "processes.py"
_SPEC = importlib.util.spec_from_file_location("processes", _PATH)
processes = sys.modules["processes"] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(processes)


def _spawn(at_pid: int | None = None) -> subprocess.Popen:
    if at_pid is not None:  # the kernel hands out the pid after the last one it gave
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(at_pid - 1))
    return subprocess.Popen(["sleep", "60"])


def main() -> None:
    before = processes.children()
    first = _spawn()
    local_ray = processes.LocalRay(processes.children() - before)  # as ray_runtime.init_local records
    left_first = local_ray.stop()  # killed: the sleep is the instance's process
    first.wait()  # reaped: its pid is free
    second = _spawn(at_pid=first.pid)
    left_again = local_ray.stop()  # Ctrl-C's path stopped it, then the sweep's end asks again
    left_fresh = processes.LocalRay(local_ray.roots).stop()  # the recorded identity alone
    print(json.dumps({"roots": sorted(p.pid for p in local_ray.roots), "first_pid": first.pid,
                      "first_returncode": first.returncode, "second_pid": second.pid,
                      "second_alive": second.poll() is None,
                      "left": [sorted(left_first), sorted(left_again), sorted(left_fresh)]}))
    second.kill()
    second.wait()


if __name__ == "__main__":
    main()
