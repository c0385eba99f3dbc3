"""Every registered hook under torch.compile, beside eager, inside real gloo processes (spawned by
tests/test_compile.py): the same bytes on the wire per step, the hook called once per bucket per
step, the loss within the quality verdict's tolerance, the same NaN provenance.

The model is compiled ONCE (service/train/compiled.py's own compile and warm-up) and every hook
runs on a fresh DDP wrapper of it: the compiled graphs are cached on the module, so each hook's
compiled run executes them without compiling again (inductor costs seconds per graph on two
cores). Each eager run is the same module under ``torch.compiler.set_stance("force_eager")``.
A profiler counts the compiled graphs each step runs: a "compiled" run that silently ran eagerly
would pass every other check.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset

import hooks
from service.config import Fault
from service.train.compiled import compile_module, is_compiled, warm_up
from service.train.faults import FaultInjector
from service.train.nan import NanMonitor
from service.train.training_options import Precision
from service.workloads import Workload
from tests.hooks_checks import TEST_PARAMS

STEPS = 6  # then one more, with a NaN gradient on rank 1
POISONED = 1
# a few hook parameters off their defaults so the compiled run keeps state across steps too
COMPILE_PARAMS = {"powersgd": {"start_iter": 2}}
# DDP as the service runs it, and with find_unused_parameters, under which DDP never rebuilds its
# buckets after its first step: eager and compiled then cut the gradient into the same buckets
# (rebuilt, the compiled backward's gradient order makes other ones: docs/hooks.md)
DDP_SETTINGS = {"rebuilt": {}, "same_buckets": {"find_unused_parameters": True}}


def _model() -> nn.Module:
    """An nn.Sequential of 1.2 MB of gradients: two DDP buckets after DDP's rebuild (its first
    bucket is capped at 1 MiB), two graphs after DDPOptimizer's split; made of torch.nn modules
    only, the case nn.Module.compile() leaves uncompiled."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def _batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(STEPS + 1)]


def _params(name: str) -> dict:
    spec = hooks.available()[name]
    feedback = {"error_feedback": True} if "error_feedback" in spec.params and name != "powersgd" else {}
    return {**TEST_PARAMS.get(name, {}), **feedback, **COMPILE_PARAMS.get(name, {})}


def _counted(hook, calls: list, layout: dict, names: dict):
    """The hook, recording each call's bucket index in the current step's list and each bucket's
    parameter names (the latest layout: DDP rebuilds its buckets after its first step)."""
    def counted(state, bucket):
        calls[-1].append(bucket.index())
        layout[bucket.index()] = sorted(names[id(p)] for p in bucket.parameters())
        return hook(state, bucket)
    return counted


def _compiled_graphs(prof) -> int:
    """Compiled forward graphs a profiled step ran (DDPOptimizer's split: one per piece)."""
    return sum(e.name == "CompiledFunction" for e in prof.events())


def _run(module: nn.Module, init: list, name: str, rank: int, world_size: int, ddp_kwargs: dict) -> dict:
    """STEPS steps of SGD from ``init`` with hook ``name``, then a step with a NaN gradient on
    rank 1 (the service's FaultInjector): per step the hook's bucket indices, wire bytes, loss
    and compiled graphs run; the buckets' parameters; the NaN report."""
    with torch.no_grad():
        for p, v in zip(module.parameters(), init):
            p.copy_(v)
    ddp = DDP(module, **ddp_kwargs)
    state, hook = hooks.build(name, **_params(name))
    calls: list[list[int]] = []
    layout: dict[int, list[str]] = {}
    ddp.register_comm_hook(state, _counted(hook, calls, layout, {id(p): n for n, p in module.named_parameters()}))
    monitor = NanMonitor(ddp, state, rank=rank, world_size=world_size, hook_name=name)
    faults = FaultInjector([Fault(kind="nan_grad", step=STEPS + 1, rank=POISONED)], rank)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    out = {"wire": [], "loss": [], "graphs": []}
    for step, (x, y) in enumerate(_batches(rank), start=1):
        calls.append([])
        faults.arm(step, module)
        before = state.stats()["wire_bytes"]
        opt.zero_grad(set_to_none=True)
        with torch.profiler.profile() as prof:
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
        check = monitor.check(step, loss.detach())
        out["wire"].append(state.stats()["wire_bytes"] - before)
        out["graphs"].append(_compiled_graphs(prof))
        if check.nonfinite:
            break
        out["loss"].append(check.mean_loss)
        opt.step()
    faults.arm(STEPS + 2, module)  # armed for a step without a fault, it takes its NaN hook off the parameter
    report = monitor.report
    out["calls"], out["layout"] = calls, layout
    out["nan"] = report and (report.first_nan_step, report.nan_source, report.nan_rank, report.bucket_index,
                             sorted(report.param_names))
    return out


def _module_compile_graphs(module: nn.Module) -> int:
    """Compiled graphs one step of DDP(module).compile() runs (nn.Module.compile on the wrapper)."""
    ddp = DDP(module)
    ddp.compile()
    x, y = _batches(0)[0]
    with torch.profiler.profile() as prof:
        nn.functional.cross_entropy(ddp(x), y).backward()
    return _compiled_graphs(prof)


def check_every_hook_compiled_beside_eager(rank: int, world_size: int) -> dict:
    """Every registered hook eager and compiled (one compilation for all), and what nn.Module.compile
    on the DDP wrapper runs instead."""
    module = _model()
    init = [p.detach().clone() for p in module.parameters()]
    plain = _module_compile_graphs(module)
    x, y = _batches(rank)[0]
    wl = Workload(module, TensorDataset(x, y), TensorDataset(x, y), nn.functional.cross_entropy)
    compile_module(module, "default")  # the service's compilation and warm-up, once for every hook
    warm_up(module, {}, wl, torch.arange(len(x)), Precision("fp32", "cpu"))
    assert is_compiled(module)
    out = {"module_compile_graphs": plain}
    for name in hooks.available():
        for ddp, kwargs in DDP_SETTINGS.items():
            with torch.compiler.set_stance("force_eager"):
                eager = _run(module, init, name, rank, world_size, kwargs)
            out[name, ddp] = {"eager": eager, "compiled": _run(module, init, name, rank, world_size, kwargs)}
    return out
