"""Run a function on W real gloo processes (torch.multiprocessing spawn, 127.0.0.1).

Usage::

    from tests.dist_utils import run_distributed

    def check(rank, world_size, arg):      # runs in every process, gloo group initialised
        ...
        return something_picklable

    results = run_distributed(check, world_size=2, args=(arg,))   # list, one per rank

Exceptions in any rank are re-raised in the caller with the rank's traceback. Each process
uses one thread (the test machine is shared and small). The function must be importable by
name (a module-level function), as spawn pickles it.
"""
from __future__ import annotations

import os
import socket
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, fn, args, queue, backend, timeout_s):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import faulthandler

    # A hung rank prints every thread's stack before the parent gives up on it.
    faulthandler.dump_traceback_later(max(timeout_s - 10, 5), exit=False)
    try:
        import datetime

        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        result = fn(rank, world_size, *args)
        queue.put((rank, True, result))
    except BaseException:  # report everything, including assertion errors, to the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn, world_size: int, args: tuple = (), backend: str = "gloo", timeout_s: float = 600.0):
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return the per-rank results.

    Raises RuntimeError naming the failing rank(s) with their tracebacks.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(r, world_size, port, fn, args, queue, backend, timeout_s), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    failures: list[str] = []
    # Every rank puts exactly one item; a crashed process (segfault) puts none, so watch liveness.
    import time

    deadline = time.monotonic() + timeout_s + 60
    while len(results) + len(failures) < world_size:
        if not queue.empty():
            rank, ok, value = queue.get()
            if ok:
                results[rank] = value
            else:
                failures.append(f"rank {rank}:\n{value}")
            continue
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead and queue.empty():
            time.sleep(0.5)
            if queue.empty():
                failures.append(f"process(es) died without reporting: exit codes {[p.exitcode for p in procs]}")
                break
        if time.monotonic() > deadline:
            failures.append(f"timed out after {timeout_s + 60:.0f} s")
            break
        time.sleep(0.02)
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    if failures:
        raise RuntimeError("distributed run failed\n" + "\n".join(failures))
    return [results[r] for r in range(world_size)]
