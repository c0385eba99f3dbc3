"""A scheduler's SIGTERM to the sweep's whole process group (tests/test_processes.py runs this
in a session of its own, so the group is this script's alone). The sweep handles that signal
itself and must still reach its Ray instance afterwards: a GCS call to a dead GCS blocks the
caller until Ray gives up after 60 s and ends the process with exit 1 (CI, stop 47). Prints
one JSON object; everything it started ends with it."""

from __future__ import annotations

import json
import os
import signal
import time

import ray

from service.sweep import processes, ray_runtime


def main() -> None:
    local_ray = ray_runtime.init_local(1)
    # the sweep's own handler (installed after ray.init, as there), reduced to "survive it"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    tree = processes.descendants(local_ray.roots)
    try:
        os.killpg(0, signal.SIGTERM)  # as `kill -TERM -PGID`, Slurm or systemd stop the sweep
        time.sleep(2.0)  # a Ray process that takes SIGTERM is gone well within this
        survived = processes.alive(tree) == tree
        # only asked of a GCS that survived: a dead one blocks this call for 60 s, then exits 1
        answered = bool(ray.cluster_resources()) if survived else False
        started = time.monotonic()
        left = local_ray.stop()
        stop_s = time.monotonic() - started
    finally:
        processes.kill(tree)
    print(json.dumps({"processes": len(tree), "survived_the_group_signal": survived,
                      "gcs_answered": answered, "left": sorted(left), "stop_s": round(stop_s, 2),
                      "alive_after_stop": len(processes.alive(tree))}))


if __name__ == "__main__":
    main()
