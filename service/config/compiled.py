"""torch.compile of a trial's model (``workload.compile``, ``search.compile``): the module inside
DDP is compiled, DDP(compile(module)), its graph split at DDP's buckets by torch's DDPOptimizer,
while DDP's reducer and the trial's hook run eagerly. Here: the modes the config takes, and the
settings a compiled trial cannot run, each refused before any trial starts in one line naming it
and torch's reason (service/train/compiled.py compiles; docs/hooks.md,
"Under torch.compile", says what was measured)."""

from __future__ import annotations

from service.config.errors import FieldProblem
from service.text import short_value

# torch.compile's modes that leave the step's communication to DDP. The modes with CUDA graphs
# ("reduce-overhead", "max-autotune") are refused: a graph would capture what DDP's hooks launch
# outside the compiled module (the reducer's collectives, a hook's own kernels and state).
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# torch's DDPOptimizer (dynamo's graph split at DDP's buckets) asserts that no bucket is smaller
# than DDP's first bucket, 1 MiB (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES).
MIN_COMPILED_BUCKET_CAP_MB = 1.0


def mode_refusal(value) -> str | None:
    """Why workload.compile's ``value`` is refused, one line (None: allowed)."""
    if isinstance(value, bool) or value in COMPILE_MODES:
        return None
    allowed = f"allowed: false, true or a torch.compile mode: {', '.join(COMPILE_MODES)}"
    if value in CUDA_GRAPH_MODES:
        return (f"{value!r} is not allowed: its CUDA graphs would capture what DDP's comm hooks launch outside "
                f"the compiled module; {allowed}")
    return f"{short_value(value)} is not allowed; {allowed}"


def compile_refusals(cfg) -> None:
    """A FieldProblem naming the first setting of ``cfg`` (a SweepConfig whose search.compile lists
    true) that a compiled trial cannot run, and why."""
    if True in cfg.search.static_graph:
        raise FieldProblem("search.static_graph", "true with compile: DDP's static_graph over a module compiled "
                                                  "before its first step stops calling the comm hook after that "
                                                  "step (0 hook calls per step measured with torch 2.13: the "
                                                  "gradients are never averaged); allowed: false with compile, "
                                                  "or search.compile: [false]")
    small = [cap for cap in cfg.search.bucket_cap_mb if cap < MIN_COMPILED_BUCKET_CAP_MB]
    if small:
        raise FieldProblem("search.bucket_cap_mb", f"{small[0]:g} with compile: torch.compile's DDPOptimizer "
                                                   "(dynamo's graph split at DDP's buckets) asserts that no bucket "
                                                   "is smaller than DDP's 1 MiB first bucket; allowed: 1 or more "
                                                   "with compile, or search.compile: [false]")
