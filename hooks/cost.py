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


# ----------------------------------------------------------------------------- alpha-beta model
# An alpha-beta model of each hook's collectives, to price a run on networks we do not have.
#
# Assumptions (docs/hooks.md states them beside the formulas):
#
# * one flat ring of W ranks, every link with latency ``alpha`` seconds per message and bandwidth
#   ``beta`` bytes/s, full duplex; a rank sends one message per round;
# * ring allreduce of n bytes: 2(W-1) rounds of n/W bytes; ring allgather of n bytes per rank:
#   W-1 rounds of n bytes; all_to_all of n bytes per rank: W-1 rounds of n/W bytes;
# * no overlap between collectives nor with compute (projected time = compute + communication,
#   an upper bound when DDP overlaps buckets with the backward pass); compression compute costs
#   are in the measured compute time, not in the model.

DEFAULT_LATENCY_S = 5e-6  # a typical one-hop datacenter latency per message


def collective_seconds(kind: str, nbytes: float, world_size: int, link_gbps: float, latency_s: float = DEFAULT_LATENCY_S) -> float:
    """Seconds for one collective of ``kind`` with ``nbytes`` of payload per rank."""
    w = world_size
    beta = link_gbps * 1e9 / 8  # bytes per second
    if w <= 1:
        return 0.0
    if kind == "allreduce":
        return 2 * (w - 1) * (latency_s + nbytes / w / beta)
    if kind == "allgather":
        return (w - 1) * (latency_s + nbytes / beta)
    if kind == "all_to_all":
        return (w - 1) * (latency_s + nbytes / w / beta)
    raise ValueError(f"unknown collective {kind!r}; known: allreduce, allgather, all_to_all")


def hook_collectives(name: str, n: int, world_size: int, element_size: int = 4, **params) -> list[tuple[str, int]]:
    """The collectives one call of hook ``name`` issues on a bucket of ``n`` elements: [(kind, payload bytes)].

    From the hook's spec (``HookSpec.collectives``), with its parameter defaults filled in.
    PowerSGD depends on the bucket's matrix shapes: give ``compressed_fraction`` (payload bytes /
    raw bytes once compressing, e.g. from measured stats; default 1 = before start_iter).
    """
    from .registry import spec  # local import: the registry imports the hooks, which import this module

    s = spec(name)
    return s.collectives(n, world_size, element_size=element_size, **{**s.params, **params})


def hook_wire_bytes(name: str, n: int, world_size: int, element_size: int = 4, **params) -> float:
    """Bytes one rank sends for one call of hook ``name`` on ``n`` elements (as its accounting counts)."""
    return sum(wire_bytes(k, b, world_size) for k, b in hook_collectives(name, n, world_size, element_size, **params))


def hook_seconds(name: str, n: int, world_size: int, link_gbps: float, latency_s: float = DEFAULT_LATENCY_S, element_size: int = 4, **params) -> float:
    """Projected communication seconds of one call of hook ``name`` on ``n`` elements."""
    return sum(
        collective_seconds(k, b, world_size, link_gbps, latency_s)
        for k, b in hook_collectives(name, n, world_size, element_size, **params)
    )


def projected_comm_seconds(name: str, stats: dict, steps: int, world_size: int, link_gbps: float, latency_s: float = DEFAULT_LATENCY_S, **params) -> float:
    """Projected communication seconds per step at ``world_size`` from a measured ``stats`` delta.

    Uses the measured calls and raw bytes (the mean bucket) of ``steps`` training steps; buckets
    do not depend on the world size. For PowerSGD the measured payload/raw ratio stands in for
    the compressed fraction (the matrix split does not depend on the world size either).
    """
    calls = stats.get("calls", 0)
    if not calls or not steps:
        return 0.0
    mean_n = stats["raw_bytes"] / calls / 4
    if name == "powersgd":
        params = {**params, "compressed_fraction": stats["payload_bytes"] / max(stats["raw_bytes"], 1)}
        # three allreduces per call once compressing: add their latency
        per_call = hook_seconds(name, int(mean_n), world_size, link_gbps, latency_s, **params)
        extra_rounds = (stats.get("allreduce_calls", calls) - calls) / calls
        per_call += extra_rounds * 2 * max(world_size - 1, 0) * latency_s
    else:
        per_call = hook_seconds(name, int(mean_n), world_size, link_gbps, latency_s, **params)
    return per_call * calls / steps


def projected_step_seconds(compute_seconds: float, name: str, stats: dict, steps: int, world_size: int, link_gbps: float, latency_s: float = DEFAULT_LATENCY_S, **params) -> float:
    """Measured compute seconds per step + projected communication at ``world_size`` and ``link_gbps``."""
    return compute_seconds + projected_comm_seconds(name, stats, steps, world_size, link_gbps, latency_s, **params)
