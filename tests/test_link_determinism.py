"""The premise of "quality once, time per link" (issue 24 item 3): a trial's training math does
not depend on the link it runs on.

Every registered hook (``hooks.available()``, so a hook added later is covered without touching
this file) trains the same (hook, W = 2, seed) with ``service.train.run_training`` (no Ray) three
times: on the default gloo group over loopback (the unshaped path a network sweep's quality run
takes), then on a gloo group between two emulated hosts (service/network/netem.py) whose links are shaped
to 1 Gbit/s, then the same hosts reshaped to 0.02 Gbit/s. The loss history of every step, the
final eval loss and accuracy (a function of every final weight) and the wire bytes must be equal
bit for bit on the three paths.

Made to expose timing: ``tiny_deep`` with a 4 KB bucket cap is three DDP buckets a step (18 KB),
so several buckets' collectives are in flight at once and complete in an order the link decides;
at 0.02 Gbit/s (20 Mbit/s) each step's gradients (more for the allgather hooks) queue on the link
behind tc's 8-frame (12 KB) burst, where 1 Gbit/s passes them within its 250 KB burst. Error feedback is
on wherever a hook has it (its residual is state that crosses steps) and PowerSGD compresses from
step 3 (``start_iter: 2``) rather than after the run has ended.

One process pair trains every hook on every path (the hooks one after another, the reshaping
between the paths done by rank 0 between two barriers): three pairs would cost 3x the start-up.
"""

from __future__ import annotations

import os

import pytest

from service.network import netem

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")

WORLD_SIZE = 2
LINKS_GBPS = (1.0, 0.02)
STEPS = 8


def _every_hook() -> list:
    """Every registered hook, as a search.hooks entry: error feedback on where it has it,
    PowerSGD's compression from step 3 (a parameter the hook declares, not its name)."""
    import hooks

    entries: list = []
    for name, spec in hooks.available().items():
        params = {"error_feedback": True} if "error_feedback" in spec.params else {}
        if "start_iter" in spec.params:
            params["start_iter"] = 2
        entries.append({"name": name, **params} if params else name)
    return entries


def _config():
    from service.config import SweepConfig

    return SweepConfig.model_validate({
        "name": "link-determinism",
        "search": {"hooks": _every_hook(), "world_size": [WORLD_SIZE], "seed": [0], "bucket_cap_mb": 0.004},
        "workload": {"name": "tests.tiny_workload:tiny_deep", "steps": STEPS, "global_batch_size": 32,
                     "lr": 0.05, "eval_every": STEPS, "warmup_steps": 1}})


def _train_every_hook(rank: int, world_size: int, group) -> dict[str, dict]:
    from service.train import TrainingContext, run_training

    cfg, out = _config(), {}
    for trial in cfg.trials():
        result = run_training(trial, cfg, TrainingContext(rank=rank, world_size=world_size, device="cpu", process_group=group))
        s = result.summary
        out[trial.config_label] = {
            "status": result.status, "losses": result.losses, "wire_bytes_per_step": s["comm_bytes_per_step"],
            "final_eval_loss": s.get("final_eval_loss"), "final_eval_accuracy": s.get("final_eval_accuracy"),
            "step_ms": s["step_time_ms_median"]}
    return out


def _every_hook_on_every_path(rank: int, world_size: int, net: netem.Network) -> dict:
    import torch.distributed as dist

    paths = {"loopback": _train_every_hook(rank, world_size, None)}  # the default group: 127.0.0.1
    group = netem.process_group_on_host(net.hosts[rank])
    sent = {}
    for gbps in LINKS_GBPS:
        if rank == 0:
            net.reshape(gbps)  # tc on both hosts (connections stay up)
        dist.barrier()
        before = net.tx_bytes()
        paths[f"{gbps:g} Gbit/s"] = _train_every_hook(rank, world_size, group)
        dist.barrier()
        sent[gbps] = [a - b for a, b in zip(net.tx_bytes(), before)]
    return {"paths": paths, "sent": sent}


@pytest.mark.timeout(900)
def test_every_hook_trains_bit_for_bit_alike_on_loopback_and_on_two_shaped_links():
    from tests.dist_utils import run_distributed

    with netem.Network(WORLD_SIZE, link_gbps=LINKS_GBPS[0]) as net:
        results = run_distributed(_every_hook_on_every_path, WORLD_SIZE, (net,))
    assert not [n for n in netem.list_namespaces() if n.startswith(f"{netem.PREFIX}-{os.getpid()}-")]
    rank0 = results[0]["paths"]
    reference = rank0["loopback"]
    labels = [t.config_label for t in _config().trials()]
    assert sorted(reference) == sorted(labels) and len(labels) >= len(_every_hook())
    for label, run in reference.items():
        assert run["status"] == "ok" and len(run["losses"]) == STEPS, (label, run)
        assert run["final_eval_loss"] is not None, label
    differ = {}
    for path, runs in rank0.items():
        for label, run in runs.items():
            got = {k: run[k] for k in ("status", "losses", "final_eval_loss", "final_eval_accuracy",
                                       "wire_bytes_per_step")}
            want = {k: reference[label][k] for k in got}
            if got != want:
                differ[(path, label)] = (got, want)
    assert not differ, differ
    for r in results:  # every rank saw the same agreed losses
        assert {p: {h: v["losses"] for h, v in runs.items()} for p, runs in r["paths"].items()} == \
            {p: {h: v["losses"] for h, v in runs.items()} for p, runs in rank0.items()}
    # the shaped paths really carried the training: each host sent at least every hook's wire bytes
    for gbps in LINKS_GBPS:
        runs = rank0[f"{gbps:g} Gbit/s"]
        wire = sum(run["wire_bytes_per_step"] * STEPS for run in runs.values())
        assert all(s >= wire for s in results[0]["sent"][gbps]), (gbps, results[0]["sent"][gbps], wire)
    slow, fast = rank0[f"{LINKS_GBPS[1]:g} Gbit/s"], rank0[f"{LINKS_GBPS[0]:g} Gbit/s"]
    print("median step ms, loopback / 1 / 0.02 Gbit/s:",
          {label: (round(reference[label]["step_ms"], 1), round(fast[label]["step_ms"], 1),
                   round(slow[label]["step_ms"], 1)) for label in labels})
