"""DDP gradient-communication hooks with byte accounting (pure PyTorch).

    import hooks
    state, hook = hooks.build("quantization_perchannel", process_group=None, chunk_size=512)
    ddp_model.register_comm_hook(state, hook)
    state.stats()    # calls, raw_bytes, payload_bytes, wire_bytes, seconds, nonfinite_inputs, ...

See docs/hooks.md for each hook's algorithm, wire cost and error.
"""
from . import cost
from .fidelity import with_fidelity
from .registry import HookSpec, available, build, validate
from .state import HookState, NonfiniteBucket

__all__ = ["HookSpec", "HookState", "NonfiniteBucket", "available", "build", "validate", "with_fidelity", "cost"]
