"""One answer everywhere (service/answer/): the headline, the decision map, projection.csv, the plan
section and answer.json read one rule's output, priced one way. Each test here is one of the
disagreements the report used to show, on hand-built bases (tests/test_projection.py checks the
same on a real store)."""
from __future__ import annotations

import json

import pytest

from service.answer import decision, pricing, projection, recommend
from service.answer.projection import Basis
from service.report import decision_map, render
from service.step_model.bands import ErrorBands, MeasuredBand
from service.step_model.pairs import PairBands
from service.step_model.transport import KindFit, ProbeHosts, TransportFit
from tests.stores import store_uri
from tests.test_projection import trial_timeline
from tests.test_recommend import candidate

NO_PAIRS = PairBands((), "unmeasured")
EXACT = ErrorBands(tuple(MeasuredBand(h, None, w, 0.0, 0.0) for h in ("allreduce", "bf16_compress")
                         for w in (2, 8)), "x")   # a model with no error: only the spreads decide
LATENCY_MS = 0.005


def measured_at_2(config: str, crossing: float, spread: float) -> Basis:
    """A configuration measured at W = 2 (its quality and its measured time's spread there)."""
    tl = trial_timeline(hook=config)
    return Basis(config, config, 2, 64, (tl,), (crossing,), True, 1, spread=spread)


def test_the_map_at_a_measured_world_size_keeps_allreduce_where_the_measurement_could_not_tell():
    # bf16_compress needs 3 % fewer steps and sends half the bytes: projected faster in every
    # W = 2 cell. But measured at W = 2 its time to target moved by 8 % from seed to seed, and
    # the measured answer kept allreduce: the map's W = 2 column must not decide against that.
    bases = [measured_at_2("allreduce", 100.0, 0.08), measured_at_2("bf16_compress", 97.0, 0.08)]
    cells = projection.grid_answers(bases, [2, 8], LATENCY_MS, (1.0, 10.0, 400.0), EXACT, pairs=NO_PAIRS)
    for link in (1.0, 10.0, 400.0):
        at2 = cells[(2, link)]
        assert at2.winner.config == "allreduce" and at2.too_close, (link, at2)
        assert decision_map.paint(at2).colour_of == "allreduce"
    # at W = 8, which no trial ran, the spread of W = 2's measurement is not carried: bf16 wins the slow link
    assert cells[(8, 1.0)].winner.config == "bf16_compress" and cells[(8, 1.0)].decided


def test_the_maps_measured_row_paints_the_headlines_answer():
    base = candidate("allreduce", [10, 10], [1.0, 1.0], spread=1.0)
    close = candidate("bf16_compress", [9.8, 9.8], [1.0, 1.0], spread=1.0)
    rec = recommend.recommend(2, "loopback", [base, close])
    answer = decision.sweep_answer([rec])
    assert render.headline(answer) == ["Here: keep allreduce at W = 2 on loopback."]
    painted = decision_map.paint_measured(answer.measured[2])
    assert painted.colour_of == "allreduce" and painted.hatched and painted.names == ("allreduce", "bf16_compress")
    entry = answer.to_json()["measured"]["2"]
    assert (entry["answer"], entry["runner_up"], entry["decided"]) == ("allreduce", "bf16_compress", False)
    assert entry["margin_pct"] < 0 < entry["error_pct"]  # the faster runner-up, inside the spread


def test_too_close_to_call_names_allreduce_and_the_runner_up_in_every_part():
    # the cluster cell: bf16_compress 3 % faster, inside the pair's +-10 % band
    bands = ErrorBands(tuple(MeasuredBand(h, None, 8, -5.0, 5.0) for h in ("allreduce", "bf16_compress")), "x")
    bases = [Basis("allreduce", "allreduce", 1, 64, (trial_timeline(),), (100.0,), True, 1),
             Basis("bf16_compress", "bf16_compress", 1, 64, (trial_timeline(hook="bf16_compress"),), (97.0,), True, 1)]
    cells = projection.project(bases, [8], [400.0], LATENCY_MS, bands)
    cell = projection.winner(cells, NO_PAIRS)
    row = cell.row()
    assert (row["cell_winner"], row["cell_runner_up"], row["cell_decided"]) == ("allreduce", "bf16_compress", "false")

    class Cluster:
        world_size, link_gbps, latency_ms, transport = 8, 400.0, LATENCY_MS, None

    answer = decision.sweep_answer([], Cluster, cell)
    line = render.headline(answer)
    assert line[0] == "No trial has finished yet: nothing to recommend."  # no measured answer given
    sentence = render._cluster_sentence(answer.cluster, "gloo on CPU", None)
    assert sentence.startswith("Your cluster (W = 8 on 400 Gbit/s, report.cluster): keep allreduce (bf16_compress ")
    assert "inside the" in sentence
    assert answer.to_json()["cluster"]["answer"] == "allreduce"


def test_the_compute_is_named_from_the_trials_hosts_not_the_transport_probes():
    trial_hosts = ProbeHosts(2, 1, 2, 2.0, "Trial CPU", True)
    probe_hosts = ProbeHosts(2, 2, 1, 0.2, "Probe CPU", False)
    tl = trial_timeline()
    tl = type(tl)(tl.timeline, tl.sampled_steps, tl.compute_points, trial_hosts)
    bases = [Basis("allreduce", "allreduce", 1, 64, (tl,), (100.0,), True, 1)]
    probe = TransportFit({"allreduce": (KindFit(2, 0.5, 1e-6, 0.0),)}, (), {2: 1.0}, (probe_hosts,))
    price = pricing.Pricing(probe, LATENCY_MS, probe)

    class Cluster:
        world_size, link_gbps, latency_ms, transport = 8, 10.0, LATENCY_MS, None

    cell = projection.winner(projection.project(bases, [8], [10.0], LATENCY_MS, EXACT, probe), NO_PAIRS)
    answer = decision.sweep_answer([], Cluster, cell, "", price, bases)
    hosts = answer.to_json()["cluster"]["hosts"]
    assert [h["cpu_model"] for h in hosts["compute"]] == ["Trial CPU"]
    assert [h["cpu_model"] for h in hosts["transport"]] == ["Probe CPU"]
    sentence = render._cluster_sentence(answer.cluster, "gloo on CPU", None)
    assert "priced as hosts like this one: 2 cores, gloo on CPU" in sentence


def test_the_headline_says_which_link_speed_stops_mattering_for_these_hosts():
    # 0.87 ms per MB sent: these hosts' gloo moves about 9.2 Gbit/s; a 25 Gbit/s cluster is not faster
    probe = TransportFit({"allreduce": (KindFit(2, 0.5, 0.87e-6, 0.0),)}, (), {2: 1.0})
    hidden = pricing.Pricing(probe, LATENCY_MS, probe).hidden_above_gbps()
    assert hidden == pytest.approx(9.2, abs=0.05)
    c = decision.ClusterAnswer(32, 25.0, LATENCY_MS, decision.CellAnswer("allreduce", None, True, None, None))
    assert "a link above 9.2 Gbit/s changes nothing" in render._cluster_sentence(c, "gloo on CPU", hidden)
    assert "changes nothing" not in render._cluster_sentence(c, "gloo on CPU", None)  # no probe: not known


def test_the_cluster_transport_is_read_from_the_parent_runs_copy_once_the_file_is_gone(tmp_path):
    """report.cluster.transport is copied onto the parent run when the sweep starts (a real MLflow
    store): the report then prices with that copy, not the file, which may move or change."""
    from service import tracking
    from service.answer.data import open_store
    from service.config import load_config
    from service.config.loading import report_section

    fit = TransportFit({"allreduce": (KindFit(16, 0.025, 2e-7, 0.0),)}, (), {16: 2.0},
                       (ProbeHosts(16, 16, 1, 1.0, "Cluster CPU", False),))
    path = tmp_path / "transport.json"
    path.write_text(json.dumps(fit.to_json()))
    config = tmp_path / "c.yaml"
    config.write_text("name: copy\nworkload: {name: mlp_digits, steps: 8, warmup_steps: 2}\nsearch: {hooks: [allreduce], world_size: [2]}\n"
                      f"report:\n  cluster: {{world_size: 16, link_gbps: 25, transport: {path}}}\n")
    cfg, _ = load_config(str(config))
    uri = store_uri(tmp_path)
    parent = tracking.start_parent_run(cfg, str(config), tracking_uri=uri)
    tracking.log_cluster_transport(parent, uri, cfg.report.cluster)
    path.unlink()   # moved away after the sweep: the recorded config still reads, the copy prices
    report_cfg = report_section(config.read_text())
    price = pricing.pricing(open_store(uri), parent, report_cfg)
    assert price.transport == fit and price.from_cluster and price.cluster_file == str(path)
    path.write_text(json.dumps(TransportFit({}, (), {}).to_json()))  # or changed: the copy stands
    tracking.log_cluster_transport(parent, uri, cfg.report.cluster)  # a --resume keeps its first copy
    assert pricing.pricing(open_store(uri), parent, report_cfg).transport == fit


def test_the_here_sentence_names_allreduce_once_whatever_it_was_weighed_against():
    def rec(w, other):
        return recommend.recommend(w, "loopback", [candidate("allreduce", [10, 10], [1.0, 1.0], spread=1.0),
                                                   candidate(other, [9.8, 9.8], [1.0, 1.0], spread=1.0)])

    answer = decision.sweep_answer([rec(2, "bf16_compress"), rec(4, "quantization_pertensor")])
    assert [m.answer.runner_up for m in answer.measured.values()] == ["bf16_compress", "quantization_pertensor"]
    assert render.headline(answer) == ["Here: keep allreduce at W = 2 and 4 on loopback."]


def test_a_contender_whose_measured_spread_reaches_its_whole_time_is_too_close_to_call_not_a_crash():
    """At a measured world size a projected cell is widened by the measurement's spread; a spread
    of 100 % or more leaves a fastest seed of 0 s (a short sweep's noisy trials did: the report
    died on a division by zero). Such a pair cannot be told apart: allreduce is kept."""
    from service.step_model.pairs import Contender, RatioBand, decide

    noisy = Contender("bf16_compress", 1.0, 0.0, 2.5)
    base = Contender("allreduce", 1.2, 0.0, 3.0)
    band = RatioBand(-5.0, 5.0, "measured for a / b")
    d = decide([noisy, base], lambda a, b: band, baseline="allreduce")
    assert (d.winner, d.runner_up, d.decided) == ("allreduce", "bf16_compress", False)
