"""Run a function on W real gloo processes (fresh processes forked from a forkserver, 127.0.0.1).

Usage::

    from tests.dist_utils import run_distributed

    def check(rank, world_size, arg):      # runs in every process, gloo group initialised
        ...
        return something_picklable

    results = run_distributed(check, world_size=2, args=(arg,))   # list, one per rank

Exceptions in any rank are re-raised in the caller with the rank's traceback. Each process
uses one thread (the test machine is shared and small). The function must be importable by
name (a module-level function), as it is pickled.

The ranks fork from a multiprocessing forkserver that imported torch, DDP's torch._dynamo and
this project's packages once per test process: a spawned rank imported them itself (~2 CPU-s
per rank before its function ran, some hundreds of rank processes a suite). The server is a
fresh interpreter, never a fork of pytest's process, whose state it does not share; it runs one
thread (nothing it imports starts one: no pandas, whose pyarrow does; BLAS and OpenMP pools of
one thread), so a fork copies no other thread's locks. Each rank still gets the caller's
sys.path and working directory and, below, its environment as it is at the call, as spawn did.
"""
from __future__ import annotations

import os
import socket
import traceback

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from multiprocessing import forkserver

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from _common import Rendezvous, join_group  # noqa: E402  (the benches' rendezvous: one home)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it). Only for a server
    that binds it itself at once (an MLflow server); a process group's rendezvous uses a store
    that holds its socket (``run_distributed``, ``init_single_rank_group``): a port free a moment
    ago was taken by another test's process before its ranks bound it (CI, 2026-12-05)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_single_rank_group(backend: str = "gloo", timeout_s: float = 60.0) -> None:
    """A real process group of one rank in this process; its rendezvous is in memory (no port)."""
    import datetime

    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=timeout_s))


# Imported once by the forkserver; a rank imports anything else its function needs.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.nn.parallel", "hooks", "service.config",
           "service.train", "service.workloads", "tests.dist_utils"]


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the server's thread pools, made as it imports: one thread
    try:
        forkserver.ensure_running()  # once per test process; then a no-op
    finally:
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    return ctx


def _entry(rank, world_size, port, fn, args, queue, backend, timeout_s, environ):
    os.environ.clear()
    os.environ.update(environ)  # the caller's, at the call: the server's is from when it started
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import faulthandler

    # A hung rank prints every thread's stack before the parent gives up on it.
    faulthandler.dump_traceback_later(max(timeout_s - 10, 5), exit=False)
    try:
        join_group(port, rank, world_size, backend, timeout_s)  # the parent's store, held for the whole run
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
    ctx = _context()
    queue = ctx.SimpleQueue()
    # listening in this process from before the ranks start to after they end: no port is
    # chosen free and bound later, when another process may hold it
    meet = Rendezvous(world_size, timeout_s)
    port = meet.port
    procs = [
        ctx.Process(target=_entry, args=(r, world_size, port, fn, args, queue, backend, timeout_s, dict(os.environ)),
                    daemon=True)
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
    del meet  # its server stops with the last reference
    if failures:
        raise RuntimeError("distributed run failed\n" + "\n".join(failures))
    return [results[r] for r in range(world_size)]
