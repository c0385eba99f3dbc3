"""How the report draws each hook: its (colour, marker), the same in every figure and every sweep.

A presentation fact, so it lives with the plots, not in ``hooks.HookSpec``; this is the one module
of service/ that names hooks (tests/test_code_hygiene.py allows it). Every registered hook draws
in its own pair (tests/test_plots.py): the built-in hooks from :data:`STYLES`, a hook added
without a row here from :data:`SPARE` in registry order, and a hook no longer registered (an old
run read back from MLflow) in grey. No marker is "X" or "P": those mark where a trial went NaN
or failed. Line style is left to the chunk size (plots.ChunkStyles).
"""

from __future__ import annotations

import hooks

STYLES: dict[str, tuple[str, str]] = {
    "allreduce": ("black", "o"),
    "allgather_then_aggregate": ("tab:gray", "s"),
    "fp16_compress": ("tab:orange", "^"),
    "bf16_compress": ("tab:brown", "v"),
    "quantization_pertensor": ("tab:blue", "D"),
    "quantization_perchannel": ("tab:green", "p"),
    "powersgd": ("tab:purple", "*"),
    "quantized_allreduce": ("tab:red", "h"),
    "topk": ("tab:cyan", ">"),
    "randomk": ("tab:olive", "<"),
    "signsgd": ("tab:pink", "d"),
    "qsgd": ("navy", "8"),
    "plan": ("darkgreen", "s"),
    "post_local_sgd": ("goldenrod", "H"),
    "diloco": ("crimson", "x"),
}
# Pairs no row of STYLES uses, for registered hooks without a row (a user's own hooks).
SPARE = (("gold", "H"), ("teal", "1"), ("maroon", "2"), ("darkviolet", "3"), ("lime", "4"), ("coral", "+"))
UNREGISTERED = ("grey", "o")


def hook_style(hook: str) -> tuple[str, str]:
    """(colour, marker) of ``hook`` (the module doc)."""
    if hook in STYLES:
        return STYLES[hook]
    unstyled = [name for name in hooks.available() if name not in STYLES]
    if hook not in unstyled:
        return UNREGISTERED
    return SPARE[unstyled.index(hook) % len(SPARE)]
