"""Compilation, a trial's own phase (``workload.compile``, ``search.compile``).

A compiled trial compiles the module its DDP wrapper runs, the trial's hook registered, with
``torch.compile`` (inductor: C++ on CPU, Triton on CUDA). Called inside DDP's forward, dynamo
splits the model's graph at DDP's buckets (torch's DDPOptimizer), so each bucket's gradients are
ready, and its hook called, as its part of the backward ends; the hook itself runs eagerly in
DDP's reducer, as ever. The paired-timing baseline's side DDP wrapper runs the same module, so
its windows time compiled allreduce beside the compiled trial (service/train/paired_timing.py);
evals run the bare module eagerly (``run_eval``: an eval is no step, and its batch would compile
again).

Why not ``ddp.compile()`` (nn.Module.compile): it hands torch.compile the module's own
``_call_impl``, a frame of torch's that dynamo skips, and dynamo then skips DDP's forward and a
model made of torch.nn modules only (an nn.Sequential) as well: nothing was compiled, silently
(0 compiled-graph calls per step, tests/compile_checks.py counts them). A frame of our own
around the module's call is traced (torch's OptimizedModule does the same for torch.nn modules).

torch compiles lazily: the first forward traces and compiles the forward graphs, the first
backward the backward's. Left to the loop, that would land in step 1 and in the first paired
window, as seconds of "step time" and "time to target". So :func:`compile_trial` runs one
forward/backward of the trial's first micro-batch through a DDP wrapper of its own, under
``no_sync()`` (no hook, no collective: the trial's hook state, counters, error feedback and
draws, never see it; a wrapper of its own because DDP's static_graph cannot run under no_sync,
pytorch/pytorch#143580) with the trajectory kept (gradients, buffers and RNG as before:
``paired_timing.trajectory_kept``). The compiled graphs are cached on the module, so the trial's
own DDP and the side one run them from step 1. The seconds this takes are the trial's
``compile_s`` (also ``phase_compile_s``); bench/compile.py measures what is left in the first steps.
"""

from __future__ import annotations

import os
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from service.train.paired_timing import trajectory_kept
from service.workloads import to_device


def compile_trial(modules, ddp_kwargs: dict, wl, first_micro_batch, precision, mode: str) -> float:
    """Compile each of ``modules`` (the trial's module; paired timing's copy of it, if it has one)
    with torch.compile's ``mode`` and trace and compile it on ``first_micro_batch`` (indices) now,
    under DDP with the trial's ``ddp_kwargs``; returns the seconds it took. Every rank: DDP's
    construction broadcasts rank 0's parameters, and its forward buffers (collectives)."""
    t0 = time.perf_counter()
    for module in modules:
        compile_module(module, mode)
        warm_up(module, {**ddp_kwargs, "static_graph": False}, wl, first_micro_batch, precision)
    return time.perf_counter() - t0


def compile_module(module: torch.nn.Module, mode: str) -> None:
    """Every call of ``module`` compiled from now on (the slot nn.Module.compile fills, with a
    frame of ours dynamo traces: the module doc says why)."""
    def call(*args, **kwargs):
        return module._call_impl(*args, **kwargs)

    # a rank compiles with the threads it trains with (cpus_per_worker), unless the user says otherwise:
    # inductor's own default is a pool of compile processes, one per core of the machine, in every rank
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(torch.get_num_threads()))
    module._compiled_call_impl = torch.compile(call, mode=mode)


def warm_up(module: torch.nn.Module, ddp_kwargs: dict, wl, indices, precision) -> None:
    """One forward/backward of ``module`` under a DDP wrapper of its own, on ``indices``, that
    trains nothing: under ``no_sync()`` (no hook call, no collective; the trial's DDP sees none of
    it), the module's gradients, buffers and RNG kept."""
    device = precision.device
    ddp = DDP(module, device_ids=[device.index] if device.type == "cuda" else None, **ddp_kwargs)
    batch = to_device(wl.fetch(wl.train_set, indices), device, precision.input_dtype)
    with trajectory_kept(module), ddp.no_sync():
        with precision.autocast():
            loss = wl.step_loss(ddp, batch)
        loss.backward()


def is_compiled(module: torch.nn.Module) -> bool:
    """Was ``module`` compiled (:func:`compile_module`)?"""
    return getattr(module, "_compiled_call_impl", None) is not None
