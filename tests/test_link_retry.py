"""A link measured short on a busy moment is measured again before the sweep refuses
(service/network/link_measure.py's measure_until_carried): the retries, what they print, and the
refusal with every figure and the load. The measurement itself is stubbed here; tests/test_netem.py
measures real links."""

from __future__ import annotations

import io

import pytest

from service.network import link_measure, netem
from service.network.link_measure import LinkMeasurement


def _measurements(*gbps: float):
    rates, calls = list(gbps), []

    def measure(link, latency_ms):
        calls.append(link)
        return LinkMeasurement(link, latency_ms, rates.pop(0), 0.05)
    return measure, calls


def test_a_short_measurement_is_taken_again_after_a_wait_and_the_first_carried_one_kept():
    measure, calls = _measurements(0.40, 0.55, 0.93)
    waits, out = [], io.StringIO()
    m = link_measure.measure_until_carried(1.0, 0.0, out=out, measure_fn=measure, sleep=waits.append)
    assert m.measured_gbps == 0.93 and calls == [1.0, 1.0, 1.0]
    assert waits == list(link_measure.RETRY_WAITS_S[:2])
    text = out.getvalue()
    assert "that is 40% of the rate at load average" in text and "measuring again in 5 s (1 of 3 retries)" in text
    assert "measuring again in 15 s (2 of 3 retries)" in text and text.count("measured 0.93 Gbit/s") == 1


def test_a_link_still_short_after_the_retries_is_refused_with_every_figure_and_the_load():
    measure, calls = _measurements(0.40, 0.45, 0.42, 0.41)
    with pytest.raises(netem.NetemError) as err:
        link_measure.measure_until_carried(1.0, 0.0, measure_fn=measure, sleep=lambda s: None)
    text = str(err.value)
    assert len(calls) == 1 + len(link_measure.RETRY_WAITS_S)
    assert "\n" not in text and "0.40, 0.45, 0.42, 0.41 Gbit/s" in text and "45% of the asked rate at best" in text
    assert "in 4 measurements at load average" in text and "CPUs" in text


def test_a_carried_link_is_measured_once():
    measure, calls = _measurements(0.95)
    waits = []
    link_measure.measure_until_carried(1.0, 0.0, measure_fn=measure, sleep=waits.append)
    assert calls == [1.0] and waits == []
