"""Pricing a hook's communication: an alpha-beta model of its collectives (from its spec), and
which collective kinds overlap their transport with the wire. Bytes per collective live in
hooks/wire.py; the step model that uses both is service/step_model/.
"""
from __future__ import annotations

from .registry import spec
from .wire import Collective, check_kind, wire_bytes

# ----------------------------------------------------------------------------- alpha-beta model
# An alpha-beta model of each hook's collectives, to price a run on networks we do not have.
#
# Assumptions (docs/hooks.md states them beside the formulas):
#
# * one flat ring of W ranks, every link with latency ``alpha`` seconds per message and bandwidth
#   ``beta`` bytes/s, full duplex; a rank sends one message per round;
# * ring allreduce of n bytes: 2(W-1) rounds of n/W bytes; ring allgather of n bytes per rank:
#   W-1 rounds of n bytes; all_to_all of n bytes per rank: W-1 rounds of n/W bytes;
# * one collective's wire time: overlap with compute and other buckets, transport and the hooks'
#   kernels are the step model's (service/step_model/price.py).

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


# ----------------------------------------------------------------------------- transport and wire
# What the step model (service/step_model/price.py) keeps of a collective measured on one link when it
# prices it on another. Its communication window holds the wire time of its collectives, the CPU work
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
#   fast-link time stays in the step, less its wire time there;
# * FSDP's reduce_scatter and all_gather (measured alike, docs/hooks.md) do not either: gloo's
#   all_gather is its allgather (1.5x the wire at W = 2, above transport + wire); its
#   reduce_scatter is an allreduce of the whole input (2(W-1)/W n sent, twice the ring's that
#   wire_bytes counts), so against the counted wire transport + wire is the nearer price.
OVERLAPPING_KINDS = ("allreduce",)
