"""Bytes on the wire per collective (the standard algorithms), used by every hook's accounting.

For a payload of ``n`` bytes per rank in a group of ``W`` ranks, each rank sends:

* ring allreduce:  2(W-1)/W * n    (reduce-scatter then allgather, 2(W-1) rounds of n/W)
* ring allgather:  (W-1) * n       (W-1 rounds of n)
* all_to_all:      (W-1)/W * n     (W-1 rounds of n/W: every other rank gets its shard)

At W = 1 nothing is sent.
"""
from __future__ import annotations


def wire_bytes(kind: str, nbytes: float, world_size: int) -> float:
    """Bytes one rank sends for one collective of ``kind`` with ``nbytes`` of payload."""
    w = world_size
    if kind == "allreduce":
        return 2.0 * (w - 1) / w * nbytes
    if kind == "allgather":
        return float((w - 1) * nbytes)
    if kind == "all_to_all":
        return (w - 1) / w * nbytes
    raise ValueError(f"unknown collective {kind!r}; known: allreduce, allgather, all_to_all")
