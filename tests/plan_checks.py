"""The plan hook's checks inside real gloo processes (spawned by tests/test_plan_hook.py): a
uniform plan is its hook bit for bit, a mixed plan's per-bucket accounting adds up, PowerSGD
runs its own iterations in a bucket of a plan.

Each is ``check(rank, world_size)``, raising AssertionError on failure (tests/hooks_checks.py's
shape)."""

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hooks
from tests.hooks_checks import _batch, _mlp, _synced_grads, check_accumulation, run_checks

# Hooks whose results depend on nothing but their inputs and their state: a plan of one of them
# in every bucket is the hook itself, bit for bit, residuals included. (Hooks that draw random
# numbers, randomk, qsgd and PowerSGD's initial Q, draw per bucket state in a plan: the same
# distribution, other draws.)
UNIFORM_CASES = [("allreduce", {}), ("quantization_pertensor", {"error_feedback": True}),
                 ("fp16_compress", {"error_feedback": True}),
                 ("quantized_allreduce", {"chunk_size": 64, "error_feedback": True})]
ITERATIONS = 12  # every other one under no_sync: 6 synced steps, DDP's rebuild after the first


def _config(name: str, params: dict) -> dict:
    return {"name": name, **params}


def _kept(built: dict, name: str, **params):
    """A build function for ``_synced_grads`` that keeps the state it built in ``built``."""

    def build():
        built["state"], hook = hooks.build(name, **params)
        return built["state"], hook

    return build


def check_uniform_plan_is_its_hook(rank: int, w: int) -> dict:
    """Gradients of every synced step (no_sync accumulation between them, both bucket-view modes,
    DDP's rebuild after the first iteration) equal the hook's bit for bit, for a plan that runs
    the hook as its default and one that names it for every bucket; so do the summed statistics
    and the error-feedback residuals (keyed by parameter ordinal)."""
    compared = []
    for name, params in UNIFORM_CASES:
        for as_view in (False, True):
            single: dict = {}
            expected = _synced_grads(rank, _kept(single, name, **params), as_view, ITERATIONS)
            config = _config(name, params)
            for plan in ({"default": config}, {"buckets": {i: config for i in range(8)}, "default": "allreduce"}):
                built: dict = {}
                got = _synced_grads(rank, _kept(built, "plan", **plan), as_view, ITERATIONS)
                tag = (name, as_view, built["state"].params)
                assert 2 <= len(built["state"].by_bucket) <= 8, tag  # several buckets, each on its own state
                for step, (a, b) in enumerate(zip(expected, got)):
                    for pa, pb in zip(a, b):
                        assert torch.equal(pa, pb), (tag, step, float((pa - pb).abs().max()))
                _same_stats(single["state"].stats(), built["state"].stats(), tag)
                ra, rb = single["state"].state_dict()["residuals"], built["state"].state_dict()["residuals"]
                assert ra.keys() == rb.keys() and all(torch.equal(ra[k], rb[k]) for k in ra), tag
                assert bool(ra) == bool(params.get("error_feedback")), tag
                compared.append((name, as_view, len(expected)))
    return {"compared": compared}


def _same_stats(a: dict, b: dict, tag) -> None:
    for key in a:
        if key != "seconds":
            assert a[key] == b[key], (tag, key, a[key], b[key])


def check_mixed_plan_accounting(rank: int, w: int, steps: int = 5) -> dict:
    """Bucket 0 in fp16, every other bucket allreduce: each bucket's own statistics follow its
    hook's formula (fp16: 2 bytes per value, allreduce 4, ring wire 2(W-1)/W of them) and add up
    to the plan's ``stats()``, collective kinds included; nothing is lost or counted twice."""
    torch.manual_seed(0)
    ddp = DDP(_mlp(), bucket_cap_mb=0.004)
    state, hook = hooks.build("plan", buckets={0: {"name": "fp16_compress"}}, default="allreduce")
    ddp.register_comm_hook(state, hook)
    state.reset_stats()
    for step in range(steps):
        x, y = _batch(step, rank)
        nn.functional.cross_entropy(ddp(x), y).backward()
    per_bucket, total = state.bucket_stats(), state.stats()
    assert len(per_bucket) >= 2 and per_bucket[0]["config"] == "fp16_compress", per_bucket
    ring = 2 * (w - 1) / w
    for index, s in per_bucket.items():
        share = 2 if index == 0 else 4  # payload bytes per float32 value
        assert s["config"] == ("fp16_compress" if index == 0 else "allreduce"), (index, s)
        assert s["payload_bytes"] * 4 == s["raw_bytes"] * share, (index, s)
        assert s["allreduce_bytes"] == s["payload_bytes"] and s["allreduce_calls"] == s["calls"], (index, s)
        assert abs(s["wire_bytes"] - ring * s["payload_bytes"]) <= 1e-9 * s["payload_bytes"], (index, s)
    for key in ("calls", "raw_bytes", "payload_bytes", "wire_bytes", "allreduce_calls", "allreduce_bytes",
                "allgather_calls", "all_to_all_bytes"):
        assert abs(sum(s[key] for s in per_bucket.values()) - total[key]) <= 1e-9 * max(total[key], 1), key
    # every step called every bucket once (DDP's first step may lay them out otherwise)
    assert total["calls"] >= (steps - 1) * len(per_bucket), (total, len(per_bucket))
    assert total["nonfinite_inputs"] == 0 and total["payload_bytes"] < total["raw_bytes"], total
    return {"buckets": {i: (s["config"], s["calls"], s["payload_bytes"]) for i, s in per_bucket.items()}}


def check_powersgd_in_a_plan_counts_its_own_steps(rank: int, w: int, steps: int = 8) -> dict:
    """PowerSGD ticks its iteration on a step's last bucket; in a plan it runs on one bucket, not
    the last, and still starts compressing after ``start_iter`` steps (its bucket is the last
    its state sees)."""
    torch.manual_seed(0)
    ddp = DDP(_mlp(), bucket_cap_mb=0.004)
    state, hook = hooks.build("plan", buckets={0: {"name": "powersgd", "start_iter": 2}})
    ddp.register_comm_hook(state, hook)
    for step in range(steps):
        x, y = _batch(step, rank)
        nn.functional.cross_entropy(ddp(x), y).backward()
    powersgd = state.by_bucket[0].state
    assert powersgd.powersgd.iter == steps, powersgd.powersgd.iter
    s = state.bucket_stats()[0]
    assert s["allreduce_calls"] > s["calls"], s  # compressing: three allreduces per call
    return {"iter": powersgd.powersgd.iter, "bucket0": s}


def check_plan_accumulation(rank: int, w: int) -> dict:
    """The no_sync regression (tests/hooks_checks.py) on the conformance plan: 20 iterations,
    10 under no_sync, both bucket-view modes and both hook shapes, each bucket within its own
    configuration's bound."""
    return check_accumulation(rank, w, names=["plan"], iterations=20)


def run_plan_checks(rank: int, w: int, checks: list) -> dict:
    """Run this module's ``checks`` in one set of processes (tests/hooks_checks.py's run_checks)."""
    return run_checks(rank, w, checks, where=globals())
