"""Pricing a hook's communication: an alpha-beta model of its collectives (from its spec), and a
measured step re-priced on a slower link. Bytes per collective live in hooks/wire.py.
"""
from __future__ import annotations

from .registry import spec
from .wire import KINDS, Collective, check_kind, wire_bytes

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


def collective_seconds(kind: str, nbytes: float, world_size: int, link_gbps: float,
                       latency_s: float = DEFAULT_LATENCY_S, count: float = 1.0) -> float:
    """Seconds for ``count`` collectives of ``kind`` carrying ``nbytes`` of payload per rank in all."""
    check_kind(kind)
    w = world_size
    beta = link_gbps * 1e9 / 8  # bytes per second
    if w <= 1:
        return 0.0
    if kind == "allreduce":
        return 2 * (w - 1) * (count * latency_s + nbytes / w / beta)
    if kind == "allgather":
        return (w - 1) * (count * latency_s + nbytes / beta)
    return (w - 1) * (count * latency_s + nbytes / w / beta)


def hook_collectives(name: str, n: int, world_size: int, element_size: int = 4, **params) -> list[Collective]:
    """The collectives one call of hook ``name`` issues on a bucket of ``n`` elements of
    ``element_size`` bytes, from its spec (``HookSpec.collectives``) with its defaults filled in.

    Inputs a size does not give (``HookSpec.from_stats``) may be passed too, e.g. PowerSGD's
    ``compressed_fraction`` (payload bytes / raw bytes once compressing; default 1 = before
    start_iter).
    """
    s = spec(name)
    return [Collective(*c) for c in s.collectives(n, world_size, element_size, **{**s.params, **params})]


def hook_wire_bytes(name: str, n: int, world_size: int, element_size: int = 4, **params) -> float:
    """Bytes one rank sends for one call of hook ``name`` on ``n`` elements (as its accounting counts)."""
    return sum(wire_bytes(c.kind, c.nbytes, world_size) for c in hook_collectives(name, n, world_size, element_size, **params))


def hook_seconds(name: str, n: int, world_size: int, link_gbps: float, latency_s: float = DEFAULT_LATENCY_S, element_size: int = 4, **params) -> float:
    """Projected communication seconds of one call of hook ``name`` on ``n`` elements."""
    return sum(
        collective_seconds(c.kind, c.nbytes, world_size, link_gbps, latency_s, c.count)
        for c in hook_collectives(name, n, world_size, element_size, **params)
    )


def projected_comm_seconds(name: str, stats: dict, steps: int, world_size: int, link_gbps: float,
                           latency_s: float = DEFAULT_LATENCY_S, element_size: int = 4, **params) -> float:
    """Projected communication seconds per step at ``world_size`` from a measured ``stats`` delta.

    Uses the measured calls and raw bytes (the mean bucket, of ``element_size``-byte gradients) of
    ``steps`` training steps; buckets do not depend on the world size. What the hook's spec reads
    from measured stats (``HookSpec.from_stats``: PowerSGD's payload/raw ratio and allreduces per
    call) does not depend on the world size either.
    """
    calls = stats.get("calls", 0)
    if not calls or not steps:
        return 0.0
    s = spec(name)
    measured = s.from_stats(stats) if s.from_stats is not None else {}
    mean_n = stats["raw_bytes"] / calls / element_size
    per_call = hook_seconds(name, int(mean_n), world_size, link_gbps, latency_s, element_size, **{**params, **measured})
    return per_call * calls / steps


def projected_step_seconds(compute_seconds: float, name: str, stats: dict, steps: int, world_size: int, link_gbps: float, latency_s: float = DEFAULT_LATENCY_S, **params) -> float:
    """Measured compute seconds per step + projected communication at ``world_size`` and ``link_gbps``."""
    return compute_seconds + projected_comm_seconds(name, stats, steps, world_size, link_gbps, latency_s, **params)


# ----------------------------------------------------------------------------- re-pricing a measured step
# A step measured on one link, re-priced on a slower one (bench/network.py holds it against
# measurement). Its communication window holds the wire time of its collectives, the CPU work
# that moves their bytes (copies, the TCP stack, a ring allreduce's reductions) and the hook's
# serial work (compression kernels, PowerSGD's matrix products, the wait between two collectives).
# What a slower link does to each, measured collective by collective (bench/collectives_probe.py,
# docs/hooks.md):
#
# * allreduce (gloo's ring, pipelined segment by segment): the CPU work runs under the wire. Alone
#   on a 1 Gbit/s link it takes the model's wire time (-3..+1 %, fp32/fp16/bf16, W = 2 and 4)
#   although on the fast link it took 1.2-2.3x its wire time there: a window of
#   serial + max(transport, wire), not serial + transport + wire;
# * allgather and all_to_all do not overlap: on the slow link they take their wire time plus at
#   least their CPU time of the fast link (1.1-1.8x the model's wire time at 1 Gbit/s). Their
#   fast-link time stays in the step, less its wire time there.
OVERLAPPING_KINDS = ("allreduce",)


def wire_seconds_by_kind(stats: dict, steps: int, world_size: int, link_gbps: float,
                         latency_s: float = DEFAULT_LATENCY_S) -> dict[str, float]:
    """Model wire seconds per step of a hook's measured collectives, per kind, from its
    ``state.stats()`` delta over ``steps`` steps (``{kind}_calls``, ``{kind}_bytes``)."""
    out = {}
    for kind in KINDS:
        calls, nbytes = stats.get(f"{kind}_calls", 0), stats.get(f"{kind}_bytes", 0)
        out[kind] = (calls * collective_seconds(kind, nbytes / calls, world_size, link_gbps, latency_s) / steps
                     if calls and steps else 0.0)
    return out


def projected_step_from_measured(step_s: float, stats: dict, steps: int, world_size: int,
                                 fast_gbps: float, fast_latency_s: float, slow_gbps: float,
                                 slow_latency_s: float, allreduce_seconds_per_wire_byte: float) -> float:
    """The step of ``step_s`` measured on a link of ``fast_gbps`` (its hook's collectives in
    ``stats`` over ``steps`` steps), re-priced on a link of ``slow_gbps``.

    ``allreduce_seconds_per_wire_byte``: what an allreduce alone took on the fast link per byte
    one rank sent (its transport, CPU work included). Allreduce transport overlaps the slow wire;
    the other kinds' fast-link time stays, their fast wire time replaced by the slow one.
    """
    fast = wire_seconds_by_kind(stats, steps, world_size, fast_gbps, fast_latency_s)
    slow = wire_seconds_by_kind(stats, steps, world_size, slow_gbps, slow_latency_s)
    transport = 0.0
    for kind in OVERLAPPING_KINDS:
        moved = wire_bytes(kind, stats.get(f"{kind}_bytes", 0), world_size) / steps if steps else 0.0
        transport += max(moved * allreduce_seconds_per_wire_byte, fast[kind])
    serial_fast = sum(v for k, v in fast.items() if k not in OVERLAPPING_KINDS)
    serial_slow = sum(v for k, v in slow.items() if k not in OVERLAPPING_KINDS)
    overlapping_slow = sum(slow[k] for k in OVERLAPPING_KINDS)
    return step_s - transport + max(transport, overlapping_slow) - serial_fast + serial_slow
