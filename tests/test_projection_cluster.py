"""bench/projection.py's emulated cluster (--host-cpus): a held-out cell is priced by the report's
cluster path (a share per rank: cores None; W = 2's probe on the hosts, scaled by the ring), not
by this machine's shape, and rows and bands are keyed by error feedback. Hand-built raw runs: no
trial, no namespace; but for --comm-apart's thread moves, which are real."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import _projection_cluster as cluster_mod  # noqa: E402
import _projection_rows as rows_mod  # noqa: E402

from hooks.wire import KINDS, rounds, wire_bytes  # noqa: E402
from service.network import host_cpu, netem  # noqa: E402
from service.step_model.price import Cell, price_cell  # noqa: E402
from service.step_model.timeline import BucketTiming, LinearCost, StepTimeline  # noqa: E402
from service.step_model.transport import Sample, fit  # noqa: E402
from service.step_model.trial import ComputePoint, TrialTimeline  # noqa: E402

SIZES = (4096, 65536, 1 << 20, 8 << 20)


def probe_ms(kind: str, nbytes: int, w: int, fixed_per_round: float) -> float:
    return fixed_per_round * rounds(kind, w) + 5e-6 * wire_bytes(kind, nbytes, w)


def probed(w: int, fixed_per_round: float) -> dict:
    samples = [Sample(k, w, b, probe_ms(k, b, w, fixed_per_round), 11, shared=True) for k in KINDS for b in SIZES]
    return {"samples": [vars(s) for s in samples], "hosts": {}}


def basis(hook: str = "allreduce") -> TrialTimeline:
    bucket = BucketTiming(ready_ms=20.0, numel=250_000, encode_ms=0.5, comm_ms=4.0, decode=LinearCost(0.2))
    t = StepTimeline(hook=hook, world_size=2, batch=32, forward_ms=30.0, buckets=(bucket,), backward_end_ms=60.0,
                     optimizer_ms=5.0)
    return TrialTimeline(t, (6, 7, 8), (ComputePoint(32, 30.0, 60.0), ComputePoint(16, 16.0, 31.0)))


def run(arm, step_ms: float, ef=None, timeline=None) -> dict:
    return {"hook": "allreduce", "error_feedback": ef, "arm": arm, "repeat": 0, "status": "ok", "step_ms": step_ms,
            "other_cores": 0.0, "timeline": timeline.to_json() if timeline else None}


def worlds() -> dict:
    """W = 2 (the unshaped basis, probed at 0.1 ms a ring round) and W = 8 at 0.5 Gbit/s, probed
    there at 3 ms a round (more than the wire): the cluster prices W = 8 from W = 2's fit, never W = 8's own."""
    link = [{0.5: {"gbps": 0.48, "latency_ms": 0.2}}]
    return {2: {"links": link, "runs": [run(cluster_mod.BASIS_ARM, 120.0, timeline=basis())],
                "transport_probe": probed(2, 0.1)},
            8: {"links": link, "runs": [run(0.5, 90.0)], "transport_probe": probed(8, 3.0)}}


def cluster_rules() -> dict:
    return {"global_batch": 64, "carried": 0.85, "cores": None, "host_cpus": 0.2, "machine_cores": 2, "transport_w": 2,
            "quiet": 0.5,
            "error_feedback": True}


def test_a_held_out_cell_is_priced_as_the_reports_cluster_cell_from_w2s_probe():
    w = worlds()
    row = next(r for r in rows_mod.summarise(w, cluster_rules())["rows"] if r["world_size"] == 8)
    w2 = fit([Sample(**s) for s in w[2]["transport_probe"]["samples"]], {})
    t = basis()
    expected = price_cell(t.timeline, t.compute, 64, Cell(8, 0.48, 0.2e-3, w2, cores=None)).step_ms
    assert row["projected_ms"] == pytest.approx(expected)
    assert row["counted"] and row["error_pct"] == pytest.approx(100 * (expected - 90.0) / 90.0)
    # not this machine's shape (8 ranks on 2 cores stretch every CPU phase 4x) ...
    shaped = t.price(64, 8, 0.48, 0.2e-3, w2, cores=2).step_ms
    assert shaped > expected * 1.5
    # ... nor W = 8's own probe: the report has the basis sweep's probe only
    own = fit([Sample(**s) for s in w[8]["transport_probe"]["samples"]], {})
    assert t.price(64, 8, 0.48, 0.2e-3, own).step_ms != pytest.approx(expected)


def test_a_held_out_cell_is_priced_again_with_the_hosts_probe_at_its_own_w():
    """Beside the report's default cluster path, the cell priced as ``report.cluster.transport``
    prices it when the user probed their cluster at every W: W = 8's own fit (3 ms a round), not
    W = 2's scaled by the ring."""
    w = worlds()
    row = next(r for r in rows_mod.summarise(w, cluster_rules())["rows"] if r["world_size"] == 8)
    both = fit([Sample(**s) for x in (2, 8) for s in w[x]["transport_probe"]["samples"]], {})
    t = basis()
    expected = price_cell(t.timeline, t.compute, 64, Cell(8, 0.48, 0.2e-3, both, cores=None)).step_ms
    assert row["probed_projected_ms"] == pytest.approx(expected)
    assert row["probed_error_pct"] == pytest.approx(100 * (expected - 90.0) / 90.0)
    assert row["probed_projected_ms"] > row["projected_ms"] + 10  # W = 8's fixed cost is 30x the ring's
    assert set(rows_mod.CELL_KEYS) >= {"probed_projected_ms", "probed_error_pct"}


def test_the_ring_check_sets_w8s_probe_beside_w2s_fixed_cost_scaled_by_the_ring():
    checks = {c["kind"]: c for c in cluster_mod.ring_check(worlds())}
    ar = checks["allreduce"]
    assert ar["world_size"] == 8
    assert ar["fixed_ms"] == pytest.approx(3.0 * rounds("allreduce", 8), rel=1e-6)
    assert ar["ring_fixed_ms"] == pytest.approx(0.1 * rounds("allreduce", 8), rel=1e-6)
    assert ar["per_mb_ms"] == pytest.approx(ar["basis_per_mb_ms"]) == pytest.approx(5.0)


def test_on_the_cluster_a_trial_counts_while_others_leave_its_hosts_their_share():
    rules = cluster_rules()
    assert rows_mod.quiet_limit(rules, 8) == pytest.approx(0.4) and rows_mod.quiet_limit(rules, 2) == pytest.approx(1.6)
    w = worlds()
    w[8]["runs"][0]["other_cores"] = 0.6  # took 0.2 of the 1.6 cores the 8 hosts own
    row = next(r for r in rows_mod.summarise(w, rules)["rows"] if r["world_size"] == 8)
    assert not row["counted"] and "no quiet measured trial" in row["why_not"]


def test_rows_and_bands_are_keyed_by_error_feedback():
    w = worlds()
    w[2]["runs"] = [dict(r, hook="topk", error_feedback=ef) for r in w[2]["runs"] for ef in (True, False)]
    w[8]["runs"] = [dict(w[8]["runs"][0], hook="topk", error_feedback=True),
                    dict(w[8]["runs"][0], hook="topk", error_feedback=False, step_ms=180.0)]
    for r in w[2]["runs"]:
        r["timeline"] = basis("topk").to_json()
    result = rows_mod.summarise(w, {**cluster_rules(), "error_feedback": [True, False]})
    bands = {(b["hook"], b["error_feedback"], b["world_size"]): b for b in result["bands"]["bands"]}
    assert set(bands) == {("topk", True, 8), ("topk", False, 8)}
    assert bands[("topk", False, 8)]["high_pct"] < bands[("topk", True, 8)]["low_pct"]  # measured twice as slow
    assert {r["error_feedback"] for r in rows_mod.view(result["rows"], False)} == {False}


def test_every_cell_is_priced_with_the_compute_points_pooled_over_every_configurations_basis():
    # two configurations' bases at W = 2: topk's timed its 16-sample point on a throttled moment (as
    # slow as its 32): alone it would price W = 8's 8 samples as 32's; pooled with allreduce's (and
    # a third) the median is the quiet point, as the report pools its bases (trial.pooled_compute)
    from service.step_model.trial import pooled_compute

    noisy = TrialTimeline(basis("topk").timeline, (6, 7, 8), (ComputePoint(32, 30.0, 60.0), ComputePoint(16, 30.0, 60.0)))
    w = worlds()
    w[2]["runs"] = [run(cluster_mod.BASIS_ARM, 120.0, timeline=basis()), run(cluster_mod.BASIS_ARM, 120.0, timeline=basis()),
                    dict(run(cluster_mod.BASIS_ARM, 120.0, timeline=noisy), hook="topk")]
    w[8]["runs"] = [run(0.5, 90.0), dict(run(0.5, 90.0), hook="topk")]
    rows = {r["hook"]: r for r in rows_mod.summarise(w, cluster_rules())["rows"] if r["world_size"] == 8}
    expected = pooled_compute([basis(), basis(), noisy])[2].price(64, 8, 0.48, 0.2e-3, cluster_mod.fit_at(w, 2)).step_ms
    assert rows["topk"]["projected_ms"] == pytest.approx(expected)
    alone = noisy.price(64, 8, 0.48, 0.2e-3, cluster_mod.fit_at(w, 2)).step_ms
    assert alone - rows["topk"]["projected_ms"] > 10  # the noisy point's extrapolation, gone


@pytest.mark.skipif(os.geteuid() != 0 or getattr(host_cpu.hierarchy(), "version", None) != 1,
                    reason="moving one thread needs root and cgroup v1 (CI: both)")
def test_threads_apart_leaves_the_calling_thread_in_its_hosts_share_and_the_rest_off_every_quota():
    """--comm-apart: a rank's other threads (gloo's) leave its host's quota; its own stays."""
    h = host_cpu.hierarchy()
    release, started = threading.Event(), threading.Event()

    def other() -> None:
        started.set()
        release.wait(30)

    with netem.Network(1, link_gbps=None, host_cpus=0.5) as net:
        host = net.hosts[0]
        with host_cpu.joined(host.cgroup):
            thread = threading.Thread(target=other, daemon=True)
            thread.start()
            started.wait(10)
            try:
                host_cpu.threads_apart(host.cgroup)
                host_cpu.threads_apart(host.cgroup)  # again: nothing new to move, no error
                apart = host_cpu.comm_cgroup(host.cgroup)
                assert _cgroup_of(h, threading.get_native_id()) == host.cgroup
                assert _cgroup_of(h, thread.native_id) == apart
                with open(f"{apart}/cpu.cfs_quota_us") as f:
                    assert f.read().strip() == "-1"  # no quota
            finally:
                release.set()
                thread.join(10)
        assert _cgroup_of(h, threading.get_native_id()) == host_cpu.own_cgroup(h)  # back home, every thread
    cluster_mod.remove_apart(os.getpid())
    assert not [p for p in host_cpu.list_cgroups() if host_cpu.owner_of(os.path.basename(p)) == os.getpid()]


@pytest.mark.skipif(os.geteuid() != 0 or getattr(host_cpu.hierarchy(), "version", None) != 1,
                    reason="moving one thread needs root and cgroup v1 (CI: both)")
def test_threads_apart_keeps_the_calling_thread_even_when_it_is_not_the_main_one():
    """Under Ray Train V2 a rank's training loop may run on a thread other than the process's main
    one (service/train/ray_entry.py's host_group): that thread, the rank's compute, keeps the share."""
    h = host_cpu.hierarchy()
    seen = {}
    with netem.Network(1, link_gbps=None, host_cpus=0.5) as net:
        host = net.hosts[0]
        with host_cpu.joined(host.cgroup):
            def rank_loop() -> None:
                seen["moved"] = host_cpu.threads_apart(host.cgroup)
                seen["mine"] = _cgroup_of(h, threading.get_native_id())
                seen["main"] = _cgroup_of(h, main)
                seen["cores"] = host_cpu.machine_cores(h)  # the share this thread computes in

            main = threading.get_native_id()
            worker = threading.Thread(target=rank_loop)
            worker.start()
            worker.join(10)
        apart = host_cpu.comm_cgroup(host.cgroup)
        assert seen == {"moved": True, "mine": host.cgroup, "main": apart, "cores": pytest.approx(0.5)}
    assert not os.path.isdir(apart)  # removed with the network
    assert not [p for p in host_cpu.list_cgroups() if host_cpu.owner_of(os.path.basename(p)) == os.getpid()]


def _cgroup_of(h, tid: int) -> str:
    for line in Path(f"/proc/self/task/{tid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return os.path.normpath(os.path.join(h.mount, path.lstrip("/")))
    raise AssertionError(f"thread {tid} has no cpu cgroup")
