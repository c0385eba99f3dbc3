"""Bytes on the wire per collective (the standard algorithms): the leaf the accounting and the
cost model (hooks/cost.py) both read. Imports nothing of hooks/.

For a payload of ``n`` bytes per rank in a group of ``W`` ranks, each rank sends:

* ring allreduce:  2(W-1)/W * n    (reduce-scatter then allgather, 2(W-1) rounds of n/W)
* ring allgather:  (W-1) * n       (W-1 rounds of n)
* all_to_all:      (W-1)/W * n     (W-1 rounds of n/W: every other rank gets its shard)

FSDP's two collectives (hooks/sharded.py) are counted on the *unsharded* size ``n`` (the
reduce-scatter's input, the all-gather's output), as FSDP sees its tensors:

* ring reduce-scatter: (W-1)/W * n   (W-1 rounds of n/W)
* ring all-gather:     (W-1)/W * n   (W-1 rounds of this rank's n/W shard)

At W = 1 nothing is sent.
"""
from __future__ import annotations

from typing import NamedTuple

# The collective kinds hooks issue: the accounting keeps each one's calls and bytes apart
# (``{kind}_calls``, ``{kind}_bytes`` in ``HookState.stats()``) so the cost model can re-price them.
ALLREDUCE, ALLGATHER, ALL_TO_ALL = "allreduce", "allgather", "all_to_all"
KINDS = (ALLREDUCE, ALLGATHER, ALL_TO_ALL)
# FSDP's: kept apart from KINDS, which the transport probe measures and the DDP step model prices
# (neither knows these yet); ``allgather`` above is a DDP hook's, its n one rank's message.
REDUCE_SCATTER, ALL_GATHER = "reduce_scatter", "all_gather"
SHARDED_KINDS = (REDUCE_SCATTER, ALL_GATHER)
ALL_KINDS = KINDS + SHARDED_KINDS  # what HookState's accounting keeps apart


class Collective(NamedTuple):
    """What one hook call hands to collectives of one ``kind``: ``nbytes`` of payload per rank,
    split over ``count`` collectives (PowerSGD's three allreduces once compressing; a mean over
    calls when read from measured stats). Wire bytes depend on the total only; latency on ``count``."""

    kind: str
    nbytes: float
    count: float = 1.0
    group: int = 0  # ranks in the collective's group (post_local_sgd's groups); 0: every rank

    def ranks(self, world_size: int) -> int:
        """The ranks the collective runs across at ``world_size``."""
        return min(self.group, world_size) if self.group else world_size


def check_kind(kind: str) -> None:
    if kind not in ALL_KINDS:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(ALL_KINDS)}")


def wire_bytes(kind: str, nbytes: float, world_size: int) -> float:
    """Bytes one rank sends for collectives of ``kind`` with ``nbytes`` of payload in all."""
    check_kind(kind)
    w = world_size
    if kind == "allreduce":
        return 2.0 * (w - 1) / w * nbytes
    if kind == "allgather":
        return float((w - 1) * nbytes)
    return (w - 1) / w * nbytes  # all_to_all, reduce_scatter, all_gather


def rounds(kind: str, world_size: int) -> int:
    """Messages a rank sends in one ring collective of ``kind``: 2(W-1) for allreduce, W-1 otherwise."""
    check_kind(kind)
    return 2 * (world_size - 1) if kind == ALLREDUCE else world_size - 1
