"""DDP gradient-communication hooks with byte accounting (pure PyTorch).

    import hooks
    state, hook = hooks.build("quantization_perchannel", process_group=None, chunk_size=512)
    ddp_model.register_comm_hook(state, hook)
    hooks.kernel_backend()  # "native" (fused C quantization kernels) or "torch" (any device)
    state.stats()    # calls, raw_bytes, payload_bytes, wire_bytes, seconds, nonfinite_inputs, ...
    hooks.build("plan", buckets={0: {"name": "fp16_compress"}}, default="allreduce")  # a hook per DDP bucket

See docs/hooks.md for each hook's algorithm, wire cost and error.
"""
from . import cost, wire
from .fidelity import with_fidelity
from .quantize import kernel_backend
from .registry import BASELINE, available, build, validate
from .spec import HookSpec, Param
from .state import HookState, NonfiniteBucket

__all__ = ["BASELINE", "HookSpec", "Param", "HookState", "NonfiniteBucket", "available", "build", "kernel_backend", "validate", "with_fidelity", "cost", "wire"]
