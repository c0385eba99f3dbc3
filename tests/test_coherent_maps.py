"""Physically coherent projections (service/step_model/, service/answer/projection.py and
decision_map.py): what must hold whatever the noise, on hand-built timelines.

* one configuration's projected step never grows as the link gets faster;
* an allreduce-family hook's communication follows the ring's 2(W-1)/W at a fixed global batch;
* an allgather hook's decode grows with W (one message per rank);
* a close call on the map names both candidates and wears no winner's colour; a decided cell's
  winner changes across W or link only where the two projected times cross.

Sizes as in test_step_model.py: a bucket of 250,000 fp32 values is 1e6 bytes.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from hooks.registry import available, spec
from service.report import decision_map
from service.answer import projection
from service.answer.projection import Basis
from service.step_model.bands import ErrorBands, MeasuredBand
from service.step_model.pairs import PairBands
from service.step_model.price import comm_ms
from service.step_model.timeline import BucketTiming, StepTimeline, decode_cost
from service.step_model.trial import ComputePoint, TrialTimeline

N = 250_000
LINKS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 100.0, 400.0)
SIZES = (2, 4, 8, 16, 32, 64)
ALLREDUCE_FAMILY = [h for h, s in available().items()
                    if {c[0] for c in s.collectives(N, 4, 4, **s.params)} == {"allreduce"}]
ALLGATHER_DECODERS = [h for h, s in available().items() if s.decodes_each_rank]


def measured(hook: str, comm=(3.0, 2.0, 4.0), encode=0.4, decode=0.6, global_batch=64) -> TrialTimeline:
    """Three buckets of one hook measured at W = 2 on loopback (its transport in comm), the rank's
    compute at 32 and 16 samples, a hook that waits in its call waiting for half its comm."""
    waited = 0.5 if spec(hook).waits_in_call else 0.0
    buckets = tuple(BucketTiming(ready_ms=r, numel=N, encode_ms=encode, comm_ms=c, waited=waited,
                                 decode=decode_cost(hook, decode, 2))
                    for r, c in zip((8.0, 16.0, 24.0), comm))
    t = StepTimeline(hook=hook, world_size=2, batch=global_batch // 2, forward_ms=10.0, buckets=buckets,
                     backward_end_ms=24.0 + 3 * encode, optimizer_ms=3.0)
    return TrialTimeline(t, (5,), (ComputePoint(32, 10.0, 24.0), ComputePoint(16, 6.0, 14.0)))


@pytest.mark.parametrize("hook", sorted(available()))
def test_a_faster_link_never_makes_the_projected_step_longer(hook):
    trial = measured(hook)
    for w in SIZES:
        for latency_s in (0.0, 30e-6):
            steps = [trial.price(64, w, g, latency_s).step_ms for g in LINKS]
            assert all(a >= b - 1e-9 for a, b in zip(steps, steps[1:])), (w, latency_s, steps)


@pytest.mark.parametrize("hook", ALLREDUCE_FAMILY)
def test_allreduce_family_communication_follows_the_rings_2_w_minus_1_over_w(hook):
    # One bucket ready as the backward pass ends, nothing to encode or decode: what the step adds
    # to the compute is the bucket's communication. Measured at W = 2 (ring factor 1), it is
    # 2(W-1)/W times that at W, on the wire (slow link) and in transport (fast link) alike,
    # whatever the rank's compute does at the fixed global batch of 64.
    assert ALLREDUCE_FAMILY and "allreduce" in ALLREDUCE_FAMILY
    b = BucketTiming(ready_ms=20.0, numel=N, encode_ms=0.0, comm_ms=5.0, decode=decode_cost(hook, 0.0, 2))
    t = StepTimeline(hook=hook, world_size=2, batch=32, forward_ms=10.0, buckets=(b,), backward_end_ms=20.0,
                     optimizer_ms=3.0)
    trial = TrialTimeline(t, (5,), (ComputePoint(32, 10.0, 20.0), ComputePoint(16, 6.0, 12.0)))
    for link in (0.1, 1000.0):
        at2 = trial.price(64, 2, link, 0.0)
        exposed2 = at2.step_ms - at2.compute_ms
        assert exposed2 == pytest.approx(comm_ms(t, b, 2, link, 0.0))
        for w in SIZES[1:]:
            p = trial.price(64, w, link, 0.0)
            assert p.step_ms - p.compute_ms == pytest.approx(exposed2 * 2 * (w - 1) / w), (link, w)


@pytest.mark.parametrize("hook", ALLGATHER_DECODERS)
def test_an_allgather_hooks_decode_grows_with_the_world_size(hook):
    # Measured at W = 2 with a 0.6 ms decode: one message per rank, 0.3 ms each; at W it decodes
    # W messages: 0.3 W ms after its last collective.
    trial = measured(hook, decode=0.6)
    decodes = []
    for w in SIZES:
        last = trial.price(64, w, 10.0, 0.0).buckets[-1]
        decodes.append(last.done_ms - last.end_ms)
        assert decodes[-1] == pytest.approx(0.3 * w)
    assert decodes == sorted(decodes) and decodes[0] < decodes[-1]


# --------------------------------------------------------------------------------------------
# The decision map


LATENCY_MS = 0.025


def basis(config: str, trials: tuple[TrialTimeline, ...], crossing=100.0) -> Basis:
    hook = trials[0].timeline.hook
    return Basis(config, hook, 2, 64, trials, (crossing,) * len(trials), True, 2)


def sweep_bases() -> list[Basis]:
    """allreduce against fp16_compress, which sends half the bytes for an encode: it wins on
    slow links and loses on fast ones; plus allreduce's twin (another run of the same hook,
    its seeds' timelines 2 % apart): every cell the twin reaches is a close call."""
    ar = measured("allreduce", encode=0.0)
    fp16 = measured("fp16_compress", encode=1.5, decode=1.5)
    slower = replace(ar, timeline=replace(ar.timeline, forward_ms=ar.timeline.forward_ms * 1.02))
    return [basis("allreduce", (ar,)), basis("fp16_compress", (fp16,)), basis("allreduce-twin", (ar, slower))]


def grid(bases) -> dict:
    bands = ErrorBands(tuple(MeasuredBand(b.hook, None, 2, -5.0, 5.0) for b in bases), "x")
    return projection.grid_answers(bases, list(SIZES), LATENCY_MS, LINKS, bands, pairs=PairBands((), "x"))


def test_a_close_call_wears_the_answers_colour_hatched_and_names_both_candidates():
    cells = grid(sweep_bases())
    close = [c for c in cells.values() if c.too_close]
    assert close, "the twins are inside each other's band: some cell must be a close call"
    for cell in close:  # the answer is kept (allreduce: the twin cannot be told from it), hatched
        p = decision_map.paint(cell)
        assert p.colour_of == cell.winner.config == "allreduce" and p.hatched
        assert p.names == (cell.winner.config, cell.runner_up.config)
    decided = [c for c in cells.values() if c.winner is not None and not c.too_close]
    assert decided, "fp16_compress must win some slow-link cells outright"
    for cell in decided:
        assert decision_map.paint(cell) == decision_map.CellPaint(cell.winner.config, (), False)


def test_a_decided_winner_changes_only_where_the_projected_times_cross():
    # Without the twin: along any row (one W, the links) or column (one link, the W), two
    # decided cells with different winners have the two projected times in opposite order:
    # each winner is faster in its own cell and slower in the other's (close calls between
    # them are hatched, not coloured).
    bases = sweep_bases()[:2]
    cells = grid(bases)
    times = {at: {p.config: p.time_to_target_s for p in projection.project(bases, [at[0]], [at[1]], LATENCY_MS)}
             for at in cells}
    decided = {at: c.winner.config for at, c in cells.items() if c.winner is not None and not c.too_close}
    changes = 0
    for here, a in decided.items():
        for there, b in decided.items():
            in_line = here[0] == there[0] or here[1] == there[1]
            if in_line and a != b:
                changes += 1
                assert times[here][a] < times[here][b] and times[there][b] < times[there][a], (here, there)
    assert changes, "fp16_compress wins slow links, allreduce fast ones: the map must change somewhere"
