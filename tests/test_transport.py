"""Transport measured once per sweep (service/step_model/transport.py, the probe in
service/train/transport_probe.py): the fit recovers a known machine, it prices a trial's
collectives in place of the trial's own recorded comm, and it survives transport.json."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hooks.wire import wire_bytes
from service.step_model.price import comm_ms
from service.step_model.timeline import BucketTiming, LinearCost, StepTimeline
from hooks.wire import KINDS, SHARDED_KINDS, rounds
from service.step_model.transport import KindFit, ProbeHosts, Sample, TransportFit, fit
from service.step_model.trial import ComputePoint, TrialTimeline

N = 250_000  # fp32 values: 1e6 bytes


def machine(kind: str, nbytes: int, w: int) -> float:
    """A made-up machine: 0.02 ms per round, 1 ms per MB sent (allreduce), 2 ms per MB (the others)."""
    per_byte = 1e-6 if kind == "allreduce" else 2e-6
    return 0.02 * rounds(kind, w) + per_byte * wire_bytes(kind, nbytes, w)


def samples() -> list[Sample]:
    return [Sample(k, w, b, machine(k, b, w), 5) for k in ("allreduce", "allgather", "all_to_all")
            for w in (2, 4) for b in (4096, 65536, 1 << 20, 8 << 20)]


def test_the_fit_recovers_the_machine_and_how_it_grows_with_w():
    f = fit(samples(), {2: 3.0, 4: 5.0})
    at2, at4 = f.kinds["allreduce"]
    assert (at2.world_size, at4.world_size) == (2, 4)
    assert at2.fixed_ms == pytest.approx(0.02 * 2) and at4.fixed_ms == pytest.approx(0.02 * 6)  # per collective
    assert at2.per_byte_ms == pytest.approx(1e-6) and at4.per_byte_ms == pytest.approx(1e-6)
    assert f.kinds["allgather"][1].per_byte_ms == pytest.approx(2e-6) and f.max_rel_error < 1e-9
    # W = 8 was never probed: the nearest probed W's (4) fixed cost per round, times W = 8's rounds
    assert f.ms("allreduce", 1e6, 8) == pytest.approx(machine("allreduce", 1e6, 8))
    assert f.ms("allgather", 1e6, 8, count=2) == pytest.approx(machine("allgather", 1e6, 8) + 0.02 * 7)


def test_each_probed_w_keeps_its_own_fit_where_one_form_across_w_misses():
    # A machine whose fixed cost does not grow as the ring's rounds do (W ranks time-share 2 cores:
    # 0.3 ms per collective at W = 2, 0.5 at W = 4, whatever the rounds): one fit across W missed
    # such probes by tens of %; per W it gives each back.
    def shared(kind, nbytes, w):
        return {2: 0.3, 4: 0.5}[w] + 1e-6 * wire_bytes(kind, nbytes, w)

    probes = [Sample(k, w, b, shared(k, b, w), 5) for k in ("allreduce", "allgather", "all_to_all")
              for w in (2, 4) for b in (4096, 65536, 1 << 20, 8 << 20)]
    f = fit(probes, {2: 1.0, 4: 1.0})
    assert f.max_rel_error < 1e-9
    for s in probes:
        assert f.ms(s.kind, s.nbytes, s.world_size) == pytest.approx(s.ms)


def test_transport_json_round_trips():
    f = fit(samples(), {2: 3.0, 4: 5.0})
    again = TransportFit.from_json(json.loads(json.dumps(f.to_json())))
    assert again == f and again.world_sizes == [2, 4] and again.probe_s == {2: 3.0, 4: 5.0}


def test_a_trials_priced_collectives_come_from_transport_json():
    # Two trials of one configuration whose one bucket recorded 2 and 9 ms of comm (a noisy
    # sample each). On their own they price at W = 8 apart; with the sweep's transport both
    # price the bucket at the fit's allreduce of 1e6 bytes at W = 8: 0.02*14 + 1e-6*1.75e6 ms,
    # on a link fast enough that the wire (overlapped) is under it.
    f = TransportFit.from_json(json.loads(json.dumps(fit(samples(), {2: 3.0}).to_json())))
    trials = []
    for recorded in (2.0, 9.0):
        b = BucketTiming(ready_ms=20.0, numel=N, encode_ms=0.0, comm_ms=recorded, decode=LinearCost(0.0))
        t = StepTimeline(hook="allreduce", world_size=2, batch=32, forward_ms=10.0, buckets=(b,),
                         backward_end_ms=20.0, optimizer_ms=3.0)
        trials.append(TrialTimeline(t, (5,), (ComputePoint(32, 10.0, 20.0), ComputePoint(16, 6.0, 12.0))))
    expected = 0.02 * 14 + 1e-6 * wire_bytes("allreduce", 1e6, 8)
    for trial in trials:
        assert comm_ms(trial.timeline, trial.timeline.buckets[0], 8, 1000.0, 0.0, f) == pytest.approx(expected)
        p = trial.price(64, 8, 1000.0, 0.0, f)
        assert p.step_ms - p.compute_ms == pytest.approx(expected)
    own = [t.price(64, 8, 1000.0, 0.0) for t in trials]
    assert own[1].step_ms - own[0].step_ms > 5  # without it, the seeds' noise is the difference
    # a non-overlapping kind adds its wire to the transport: allgather on 0.08 Gbit/s
    ag = StepTimeline(hook="allgather_then_aggregate", world_size=2, batch=32, forward_ms=10.0, optimizer_ms=3.0,
                      buckets=(BucketTiming(20.0, N, 0.0, 5.0, LinearCost(0.0)),), backward_end_ms=20.0)
    wire_ms = 1000 * 7 * (1e6 / 1e7)
    assert comm_ms(ag, ag.buckets[0], 8, 0.08, 0.0, f) == pytest.approx(machine("allgather", 1e6, 8) + wire_ms)


def test_a_kind_the_probe_did_not_measure_is_named():
    f = TransportFit({"allreduce": (KindFit(2, 0.01, 1e-6, 0.0),)}, (), {})
    with pytest.raises(KeyError, match="no allgather"):
        f.ms("allgather", 1e6, 4)


def test_a_hook_that_waits_in_its_call_keeps_its_kernels_between_collectives():
    # PowerSGD's comm_ms holds its P, orthogonalisation and Q kernels between its allreduces
    # (measured 7.5 ms at W = 2 where the collectives alone cost the fit's fraction of a ms): the
    # fit replaces the collectives' transport, not those kernels (bench/projection.py's own basis
    # priced 26 % short before).
    f = fit(samples(), {2: 1.0, 4: 1.0})
    params = {"rank": 1, "start_iter": 2, "error_feedback": True, "warm_start": True, "orthogonalization_epsilon": 1e-08,
              "min_compression_rate": 2.0, "batched": False, "wire_dtype": "fp32",
              "compressed_fraction": 0.117, "allreduces": 2.85}
    b = BucketTiming(ready_ms=15.0, numel=297216, encode_ms=0.35, comm_ms=7.5, decode=LinearCost(0.0), waited=1.0)
    t = StepTimeline(hook="powersgd", world_size=2, batch=32, forward_ms=12.0, buckets=(b,), backward_end_ms=24.0,
                     optimizer_ms=2.0, hook_params=params)
    from hooks.cost import hook_collectives
    moved_at_2 = sum(f.ms(c.kind, c.nbytes, 2, c.count) for c in hook_collectives("powersgd", b.numel, 2, 4, **params))
    assert moved_at_2 < 1.0
    assert comm_ms(t, b, 2, 1e6, 0.0, f) == pytest.approx(7.5)            # its own W: as measured
    moved_at_4 = sum(f.ms(c.kind, c.nbytes, 4, c.count) for c in hook_collectives("powersgd", b.numel, 4, 4, **params))
    assert comm_ms(t, b, 4, 1e6, 0.0, f) == pytest.approx(7.5 - moved_at_2 + moved_at_4)
    # allreduce's comm is its collectives': the fit alone
    ar = StepTimeline(hook="allreduce", world_size=2, batch=32, forward_ms=12.0, buckets=(replace(b, waited=0.0),),
                      backward_end_ms=24.0, optimizer_ms=2.0)
    assert comm_ms(ar, ar.buckets[0], 2, 1e6, 0.0, f) == pytest.approx(f.ms("allreduce", 4 * 297216, 2))


def test_a_cluster_cell_is_priced_from_the_world_sizes_probed_with_a_core_per_rank():
    # W = 2 probed with a core per rank (0.02 ms a round), W = 4 on 2 cores (4 ranks: 10x the
    # fixed cost, time-sharing). This machine's W = 4 cell keeps the shared fit; a cluster's W = 8
    # scales W = 2's by the ring, not this machine's crowding.
    own = [Sample(k, 2, b, machine(k, b, 2), 5) for k in ("allreduce", "allgather", "all_to_all")
           for b in (4096, 65536, 1 << 20, 8 << 20)]
    crowded = [Sample(k, 4, b, machine(k, b, 4) + 9 * 0.02 * rounds(k, 4), 5, shared=True)
               for k in ("allreduce", "allgather", "all_to_all") for b in (4096, 65536, 1 << 20, 8 << 20)]
    f = fit(own + crowded, {2: 1.0, 4: 1.0})
    assert f.kinds["allreduce"][1].shared and not f.kinds["allreduce"][0].shared
    assert f.ms("allreduce", 1e6, 4) == pytest.approx(machine("allreduce", 1e6, 4) + 9 * 0.02 * 6)
    assert f.own_cores().ms("allreduce", 1e6, 8) == pytest.approx(machine("allreduce", 1e6, 8))
    assert TransportFit.from_json(json.loads(json.dumps(f.to_json()))) == f


def test_the_hosts_a_transport_was_probed_on_survive_transport_json_and_an_old_file_still_reads():
    hosts = (ProbeHosts(2, 2, 1, 0.5, "Some CPU", False), ProbeHosts(4, 1, 4, 2.0, "Some CPU", True))
    f = fit(samples(), {2: 3.0, 4: 5.0}, hosts)
    again = TransportFit.from_json(json.loads(json.dumps(f.to_json())))
    assert again == f and again.hosts == hosts and again.own_cores().hosts == hosts
    assert again.where() == ("W = 2 across 2 hosts, 1 rank(s) per host of 0.5 core(s) (Some CPU); "
                             "W = 4 on loopback, 4 rank(s) per host of 2 core(s) (Some CPU)")
    old = f.to_json()
    del old["hosts"]  # format 2 as sweeps wrote it before the hosts were recorded
    assert TransportFit.from_json(old).hosts == () and "not recorded" in TransportFit.from_json(old).where()


def test_a_cells_step_follows_its_link_wherever_the_wire_is_slower_than_the_hosts_transport():
    # One 4 MB allreduce bucket at W = 32. On hosts whose transport costs 0.895 ms per MB sent
    # (this machine's gloo) the wire hides under it from 10 Gbit/s up: 10, 25 and 100 price the
    # same. On hosts with a tenth of that CPU work per byte, the wire is the slower up to ~90 Gbit/s:
    # the step follows the link, and is the transport's only beyond it.
    b = BucketTiming(ready_ms=20.0, numel=1_000_000, encode_ms=0.0, comm_ms=5.0, decode=LinearCost(0.0))
    t = StepTimeline(hook="allreduce", world_size=2, batch=32, forward_ms=10.0, buckets=(b,), backward_end_ms=20.0,
                     optimizer_ms=3.0)

    def host(per_mb_ms: float) -> TransportFit:
        return TransportFit({"allreduce": (KindFit(2, 0.0, per_mb_ms * 1e-6, 0.0),)}, (), {2: 1.0})

    sent = wire_bytes("allreduce", 4e6, 32)
    for link in (10.0, 25.0, 100.0):
        slow = comm_ms(t, b, 32, link, 0.0, host(0.895))
        fast = comm_ms(t, b, 32, link, 0.0, host(0.0895))
        wire = 1000 * sent * 8 / (link * 1e9)
        assert slow == pytest.approx(0.895e-6 * sent)             # the hosts' transport, whatever the link
        assert fast == pytest.approx(max(wire, 0.0895e-6 * sent))  # the slower of wire and transport
    assert comm_ms(t, b, 32, 10.0, 0.0, host(0.0895)) > 2 * comm_ms(t, b, 32, 25.0, 0.0, host(0.0895))


def test_a_probe_across_a_real_link_counts_that_links_wire_once():
    """A cluster's probe (python -m service.probe --link-gbps 1) timed its allgathers across 1 Gbit/s
    links: the wire is inside each sample. gloo's allgather does not pipeline its transport under the
    wire (the model adds them), so the cell on that same link costs what the probe measured, not
    that plus the wire again; on a 10x faster link, the hosts' part plus the faster wire. Allreduce
    (max of the two) is priced as probed, the link's wire in it or not. The link survives transport.json."""
    host_ms_per_byte, link = 0.2e-6, 1.0   # the hosts' own work per byte sent, and the probed link
    b = BucketTiming(ready_ms=20.0, numel=1_000_000, encode_ms=0.0, comm_ms=5.0, decode=LinearCost(0.0))
    ag = StepTimeline(hook="allgather_then_aggregate", world_size=2, batch=32, forward_ms=10.0, buckets=(b,),
                      backward_end_ms=20.0, optimizer_ms=3.0)
    sent = wire_bytes("allgather", 4e6, 2)
    wire_ms = lambda gbps: 1000 * sent * 8 / (gbps * 1e9)
    probed_ms_per_byte = host_ms_per_byte + wire_ms(link) / sent   # what the probe's samples show
    probed = TransportFit({k: (KindFit(2, 0.0, probed_ms_per_byte, 0.0),) for k in ("allgather", "allreduce")},
                          (), {2: 1.0}, link_gbps=link)
    assert comm_ms(ag, b, 2, link, 0.0, probed) == pytest.approx(probed_ms_per_byte * sent)
    assert comm_ms(ag, b, 2, 10.0, 0.0, probed) == pytest.approx(host_ms_per_byte * sent + wire_ms(10.0))
    same_without_the_link = replace(probed, link_gbps=None)  # how it was priced before: the wire twice
    assert comm_ms(ag, b, 2, link, 0.0, same_without_the_link) == pytest.approx(probed_ms_per_byte * sent + wire_ms(link))
    ar = replace(ag, hook="allreduce")
    assert comm_ms(ar, b, 2, link, 0.0, probed) == comm_ms(ar, b, 2, link, 0.0, same_without_the_link)
    again = TransportFit.from_json(probed.to_json())
    assert again.link_gbps == link and again == probed and probed.own_cores().link_gbps == link
    assert TransportFit.from_json({**probed.to_json(), "link_gbps": None}).link_gbps is None
    assert "across links of 1 Gbit/s" in replace(probed, hosts=(ProbeHosts(2, 2, 1, 1.0, "Some CPU", False),)).where()


def _hosts_of_a_real_group(rank: int, world_size: int):
    from service.train.transport_probe import probe_hosts

    return probe_hosts(), probe_hosts(host=f"emulated-h{rank}")


def test_a_real_groups_hosts_as_its_ranks_see_them():
    """Two gloo ranks on this machine are one host on loopback; the same ranks naming their own
    emulated hosts (the process stays in the machine's namespace) are two, one rank each, and a
    host of one rank is not time-shared whatever its share."""
    from tests.dist_utils import run_distributed

    results = run_distributed(_hosts_of_a_real_group, 2, timeout_s=120)
    here, emulated = results[0]
    assert results[1] == results[0]  # every rank learns the same
    assert (here.world_size, here.hosts, here.ranks_per_host, here.loopback) == (2, 1, 2, True)
    assert (emulated.hosts, emulated.ranks_per_host, emulated.loopback) == (2, 1, False)
    assert here.cores >= 1 and here.cpu_model
    assert here.time_shared == (2 > here.cores) and not emulated.time_shared
    assert not replace(emulated, cores=0.2).time_shared and replace(emulated, ranks_per_host=2, cores=0.4).time_shared


def _probe_and_a_late_rank(rank: int, world_size: int):
    import time

    import torch
    import torch.distributed as dist

    from service.train.transport_probe import _time, probe

    samples, _ = probe(sizes=(4096, 1 << 20), repeats=3, kinds=("allreduce",))
    buf = torch.ones(1024)

    def late_allreduce():  # rank 1 arrives 50 ms after rank 0, which waits in the collective
        if rank == 1:
            time.sleep(0.05)
        dist.all_reduce(buf)

    return samples, _time(late_allreduce, 3)


def test_the_probe_records_each_collectives_cpu_beside_its_wall_time_and_waiting_is_not_cpu():
    """A real 2-rank gloo group: every sample carries the CPU time a collective cost a rank's
    process; a collective that waits 50 ms for a late rank takes the slowest rank's 50 ms of wall
    time and almost none of their CPU (the ranks' mean), so waiting and work can be told apart."""
    from tests.dist_utils import run_distributed

    samples, (times, cpu) = run_distributed(_probe_and_a_late_rank, 2, timeout_s=120)[0]
    assert [(s.kind, s.nbytes) for s in samples] == [("allreduce", 4096), ("allreduce", 1 << 20)]
    assert all(s.cpu_ms is not None and s.cpu_ms > 0 for s in samples), samples
    assert all(0 < s.p25_ms <= s.ms for s in samples), samples  # the repeats' lower quartile
    assert all(t >= 50 for t in times) and all(c < 15 for c in cpu), (times, cpu)
    again = TransportFit.from_json(json.loads(json.dumps(fit(samples, {2: 1.0}).to_json())))
    assert [(s.cpu_ms, s.p25_ms) for s in again.samples] == [(s.cpu_ms, s.p25_ms) for s in samples]
    old = {k: v for k, v in vars(samples[0]).items() if k not in ("cpu_ms", "p25_ms")}  # probed before them
    assert Sample(**old).cpu_ms is None and Sample(**old).p25_ms is None


def test_a_bimodal_probe_keeps_its_fast_mode_beside_the_median():
    """11 repeats, five in a fast mode and six in a slow one (a rank descheduled for a time slice):
    the median is the slow mode's, the lower quartile the fast one's; one more fast repeat flips
    the median, not the quartile."""
    from service.step_model.transport import medians

    slow = medians("allreduce", 2, 4096, [0.3] * 5 + [3.0] * 6, cpu_ms=[0.2] * 11)
    fast = medians("allreduce", 2, 4096, [0.3] * 6 + [3.0] * 5, cpu_ms=[0.2] * 11)
    assert (slow.ms, fast.ms) == (3.0, 0.3)
    assert slow.p25_ms == fast.p25_ms == 0.3 and slow.cpu_ms == 0.2 and slow.repeats == 11


# ----------------------------------------------------------------------------- FSDP's two collectives


def _probe_sharded_kinds(rank: int, world_size: int):
    from hooks.wire import ALL_KINDS
    from service.train.transport_probe import probe

    asked, _ = probe(sizes=(4096, 1 << 20), repeats=3, kinds=ALL_KINDS)  # gloo refuses a shard not n / W
    default, _ = probe(sizes=(4096,), repeats=1)
    return asked, default


def test_the_probe_times_fsdps_reduce_scatter_and_all_gather_when_asked_and_only_then():
    """A real 2-rank gloo group: asked for every kind, the probe returns reduce_scatter and
    all_gather samples beside the hooks' three, each payload the unsharded size (a multiple of W
    fp32 values, as hooks/wire.py counts it: each rank's shard is n / W); by default (every sweep
    without fsdp trials) only the hooks' three. A fit over the real samples prices a
    reduce_scatter at the probed W within its own worst error, and survives transport.json."""
    from tests.dist_utils import run_distributed

    asked, default = run_distributed(_probe_sharded_kinds, 2, timeout_s=180)[0]
    assert [s.kind for s in asked] == [k for k in KINDS + SHARDED_KINDS for _ in range(2)]
    assert {s.kind for s in default} == {"allreduce", "allgather", "all_to_all"}
    assert all(s.nbytes % (4 * 2) == 0 and s.ms > 0 and s.cpu_ms is not None for s in asked), asked
    assert [s.nbytes for s in asked if s.kind == "reduce_scatter"] == [4096, 1 << 20]  # the unsharded n
    f = TransportFit.from_json(json.loads(json.dumps(fit(asked, {2: 1.0}).to_json())))
    [rs] = f.kinds["reduce_scatter"]
    assert rs.world_size == 2 and "all_gather" in f.kinds
    for s in (s for s in asked if s.kind == "reduce_scatter"):
        assert abs(f.ms("reduce_scatter", s.nbytes, 2) - s.ms) / s.ms <= rs.max_rel_error + 1e-9
    assert set(fit(default, {2: 1.0}).kinds) == {"allreduce", "allgather", "all_to_all"}


def test_the_fit_prices_the_sharded_kinds_on_the_unsharded_size_and_scales_them_by_the_ring():
    sharded = [Sample(k, w, b, machine(k, b, w), 5) for k in ("reduce_scatter", "all_gather")
               for w in (2, 4) for b in (4096, 65536, 1 << 20, 8 << 20)]
    f = fit(samples() + sharded, {2: 3.0, 4: 5.0})
    assert f.max_rel_error < 1e-9
    at2, at4 = f.kinds["reduce_scatter"]
    assert at2.fixed_ms == pytest.approx(0.02 * 1) and at4.fixed_ms == pytest.approx(0.02 * 3)  # W - 1 rounds
    assert at2.per_byte_ms == pytest.approx(2e-6)
    # (W-1)/W of the unsharded 1e6 bytes sent at W = 8, never probed: W = 4's fixed cost per round
    assert f.ms("reduce_scatter", 1e6, 8) == pytest.approx(0.02 * 7 + 2e-6 * 7 / 8 * 1e6)
    assert f.ms("all_gather", 1e6, 8, count=3) == pytest.approx(3 * 0.02 * 7 + 2e-6 * 7 / 8 * 1e6)
    assert TransportFit.from_json(json.loads(json.dumps(f.to_json()))) == f


def test_an_older_transport_json_without_the_sharded_kinds_still_reads_and_names_what_it_lacks():
    """A transport.json written before the probe knew FSDP's kinds (or by a sweep without fsdp
    trials) reads as before; its DDP kinds price as before, and a sharded kind is not guessed from
    another: as any kind the probe did not measure, it is a KeyError naming it, and the caller
    prices it as without a transport.json (``kind in fit.kinds``)."""
    old = fit(samples(), {2: 3.0, 4: 5.0}).to_json()
    assert set(old["kinds"]) == {"allreduce", "allgather", "all_to_all"} and old["format"] == 2
    f = TransportFit.from_json(json.loads(json.dumps(old)))
    assert f.ms("allreduce", 1e6, 8) == pytest.approx(machine("allreduce", 1e6, 8))
    assert "reduce_scatter" not in f.kinds and "all_gather" not in f.kinds
    with pytest.raises(KeyError, match="no reduce_scatter"):
        f.ms("reduce_scatter", 1e6, 2)
    with pytest.raises(KeyError, match="no all_gather"):
        f.own_cores().own_ms("all_gather", 1e6, 4)


def _trials(parallelism: list[str], world_sizes: list[int]):
    from service.config import SweepConfig

    workload = {"name": "mlp_digits", "steps": 4, "global_batch_size": 32, "lr": 0.05, "warmup_steps": 1}
    cfg = SweepConfig.model_validate({"name": "probe_kinds", "workload": workload, "search": {
        "hooks": ["allreduce"], "world_size": world_sizes, "parallelism": parallelism}})
    return cfg, cfg.trials()


def test_only_a_sweep_with_fsdp_trials_probes_the_sharded_kinds_and_only_at_their_world_sizes(monkeypatch):
    """The sweep's probe (service/sweep/transport.py) asks Ray Train's workers for FSDP's
    reduce-scatter and all-gather only at a world size its fsdp trials run at: a sweep without
    them probes the hooks' three kinds, as before, and takes no longer."""
    import io

    from service import tracking
    from service.sweep import transport as sweep_transport

    asked = {}

    def fake_probe(world_size, storage, cpus, network, autoscaling, kinds):
        asked[world_size] = kinds
        probed = [Sample(k, world_size, b, machine(k, b, world_size), 3) for k in kinds for b in (4096, 1 << 20)]
        return probed, 1.0, ProbeHosts(world_size, 1, world_size, 2.0, "Some CPU", True)

    class NoKept:
        def __init__(self, uri):
            pass

        def transport(self, run_id):
            return None

    logged = []
    monkeypatch.setattr(sweep_transport, "probe_on_ray", fake_probe)
    monkeypatch.setattr(tracking, "SweepReader", NoKept)
    monkeypatch.setattr(tracking, "log_transport", lambda run, uri, data: logged.append(data))
    ddp_kinds, all_kinds = ("allreduce", "allgather", "all_to_all"), KINDS + SHARDED_KINDS
    for parallelism, expected in ((["ddp"], {2: ddp_kinds, 4: ddp_kinds}),
                                  (["ddp", "fsdp"], {2: all_kinds, 4: all_kinds})):
        asked.clear()
        cfg, trials = _trials(parallelism, [1, 2, 4])
        result = sweep_transport.measure_transport(cfg, trials, "run", "uri", "storage", io.StringIO())
        assert asked == expected
        assert set(result.kinds) == set(expected[2]) and set(logged[-1]["kinds"]) == set(expected[2])
    _, trials = _trials(["ddp", "fsdp"], [2, 4])
    only_w2 = [t for t in trials if t.parallelism == "ddp" or t.world_size == 2]
    assert sweep_transport.kinds_to_probe(only_w2, 2)[-2:] == ("reduce_scatter", "all_gather")
    assert sweep_transport.kinds_to_probe(only_w2, 4) == ddp_kinds


def test_the_cluster_probe_times_every_kind_unless_told_ddp_only(capsys):
    from service.sweep.probe_cli import parse_args

    assert not parse_args(["--address", "h:6379", "--world-size", "2"]).ddp_only
    assert parse_args(["--address", "h:6379", "--world-size", "2", "--ddp-only"]).ddp_only
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "reduce_scatter and all_gather" in said and "--ddp-only" in said
