"""Wait until the Ray cluster has RAY_WORKERS (default 1) alive worker nodes, then exit 0.

compose's depends_on can only wait for a ray-worker container to *start*; its raylet joins the
head a few seconds later. A job submitted in between saw a cluster of 0 CPUs and the sweep
refused it (the first compose test run on a busy machine). `submit` runs this first.
Exit 1 with one line after RAY_WORKERS_TIMEOUT_S (default 300) seconds.
"""
import os
import sys
import time

from ray.util.state import list_nodes

address = os.environ.get("RAY_DASHBOARD_ADDRESS", "http://ray-head:8265")
want = int(os.environ.get("RAY_WORKERS", "1"))
deadline = time.monotonic() + float(os.environ.get("RAY_WORKERS_TIMEOUT_S", "300"))
alive = []
while time.monotonic() < deadline:
    try:
        alive = [n for n in list_nodes(address=address, filters=[("state", "=", "ALIVE")])
                 if not n.is_head_node]
    except Exception:  # the dashboard is still starting: ask again
        alive = []
    if len(alive) >= want:
        print(f"wait_for_workers: {len(alive)} Ray worker node(s) alive", flush=True)
        sys.exit(0)
    time.sleep(2)
sys.exit(f"wait_for_workers: {len(alive)} of {want} Ray worker nodes joined {address} in time")
