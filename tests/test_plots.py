"""Plot identity: every registered hook draws in its own (colour, marker), read from
service/report/hook_styles.py, and the figures use exactly that (issue 13: fp16_compress used to hash to
quantization_pertensor's colour, both solid, indistinguishable in a report)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.colors as mcolors
import numpy as np

import hooks
from service.report import hook_styles, plots
from service.report.hook_styles import hook_style
from service.answer.projection import MAP_LINKS_GBPS
from service.report import LossCurve

STOP_MARKERS = {"X", "P"}  # the loss plot's "went NaN" / "failed here" marks


def test_every_registered_hook_has_a_distinct_colour_and_marker_pair():
    specs = hooks.available()
    pairs = {name: (mcolors.to_hex(hook_style(name)[0]), hook_style(name)[1]) for name in specs}
    assert len(set(pairs.values())) == len(pairs), pairs
    # and distinct colours outright, as far as a palette reaches: a legend reads by colour first
    assert len({c for c, _ in pairs.values()}) == len(pairs), pairs
    for name, (_, marker) in pairs.items():
        assert marker not in STOP_MARKERS, f"{name}: marker {marker!r} is a stop mark"
    for name in specs:
        assert plots.hook_style(name) == hook_style(name)
    # a spare pair is no built-in's, and an unregistered hook (an old run) draws in grey
    assert not set(hook_styles.SPARE) & set(hook_styles.STYLES.values())
    assert hook_style("no_such_hook") == hook_styles.UNREGISTERED


def test_fp16_and_pertensor_draw_differently(tmp_path: Path, monkeypatch):
    """The reproduction of issue 13 item 2: two hooks' curves on one panel must not look alike."""
    figures = []
    real_save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (figures.append(fig), real_save(fig, path))[1])
    steps = np.arange(1, 21)
    curves = {2: [LossCurve(config=h, hook=h, chunk_size=None, world_size=2, run_ids=[h], steps=steps,
                            mean=np.linspace(2, 1, 20) + i, std=np.zeros(20), count=np.ones(20, int),
                            stops=[])
                  for i, h in enumerate(["fp16_compress", "quantization_pertensor"])]}
    plots.plot_loss_curves(curves, tmp_path / "loss.png")
    ax = next(a for a in figures[0].axes if a.get_title() == "world size 2")
    drawn = [(mcolors.to_hex(l.get_color()), l.get_marker(), l.get_linestyle()) for l in ax.lines]
    assert len(drawn) == 2 and drawn[0] != drawn[1]
    assert drawn[0][:2] == (mcolors.to_hex(hook_style("fp16_compress")[0]), hook_style("fp16_compress")[1])
    legend = figures[0].legends[0]
    legend_styles = {t.get_text(): (mcolors.to_hex(h.get_color()), h.get_marker())
                     for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert legend_styles["fp16_compress"] != legend_styles["quantization_pertensor"]


def _overlapping_texts(fig):
    """Pairs of drawn, non-empty texts of a figure whose extents overlap. Tick labels count only
    for ticks inside the axis' view (matplotlib keeps label objects for ticks it does not draw)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    canvas = FigureCanvasAgg(fig)  # the saved figure is closed: draw it again, as saved
    canvas.draw()
    renderer = canvas.get_renderer()
    tick_labels, drawn_ticks = set(), []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            span = (hi - lo) * 1e-9
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                tick_labels.update((id(tick.label1), id(tick.label2)))
                if lo - span <= tick.get_loc() <= hi + span:
                    drawn_ticks += [tick.label1, tick.label2]
    texts = [t for t in fig.findobj(Text) if id(t) not in tick_labels] + drawn_ticks
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts
             if t.get_visible() and t.get_text().strip()]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


def test_no_two_labels_of_the_tradeoff_plot_overlap(tmp_path: Path, monkeypatch):
    """Issue 16: the point labels used to overlap into a smear where configurations sit close
    together (here: seven configurations within a few percent of each other's bytes/quality)."""
    from service.report import TradeoffPoint

    figures = []
    real_save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (figures.append(fig), real_save(fig, path))[1])
    configs = [("allreduce", None, 8.0e6, 0.955), ("bf16_compress", None, 4.0e6, 0.955),
               ("fp16_compress", None, 4.0e6, 0.954), ("quantization_pertensor", None, 2.0e6, 0.953),
               ("quantization_perchannel", 128, 2.1e6, 0.955), ("quantization_perchannel", 512, 2.02e6, 0.955),
               ("quantized_allreduce", 512, 2.05e6, 0.954)]
    points = {w: [TradeoffPoint(f"{h}-c{c}" if c else h, h, w, b, q, 0.001, on_front=i % 2 == 0, chunk_size=c)
                  for i, (h, c, b, q) in enumerate(configs)] for w in (2, 4)}
    plots.plot_tradeoff(points, "final_eval_accuracy", tmp_path / "tradeoff.png", title="quant")
    fig = figures[0]
    assert not _overlapping_texts(fig)
    legend_labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert set(p.config for p in points[2]) <= set(legend_labels)  # every configuration named once
    assert len(legend_labels) == len(set(legend_labels))


def test_loss_plot_has_a_panel_of_each_configuration_minus_the_baseline(tmp_path: Path, monkeypatch):
    figures = []
    real_save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (figures.append(fig), real_save(fig, path))[1])
    steps = np.arange(1, 21)
    base = np.linspace(2, 1, 20)
    curves = {2: [LossCurve(config=h, hook=h, chunk_size=None, world_size=2, run_ids=[h], steps=steps,
                            mean=base + d, std=np.zeros(20), count=np.ones(20, int), stops=[], per_seed={0: base + d})
                  for h, d in (("allreduce", 0.0), ("fp16_compress", 0.001), ("quantization_pertensor", 0.01))]}
    plots.plot_loss_curves(curves, tmp_path / "loss.png")
    delta = next(a for a in figures[0].axes if a.get_title() == "minus allreduce on the same seeds, world size 2")
    drawn = {mcolors.to_hex(l.get_color()): l.get_ydata() for l in delta.lines if len(l.get_xdata()) > 2}
    assert np.allclose(drawn[mcolors.to_hex(hook_style("fp16_compress")[0])], 0.001)
    assert np.allclose(drawn[mcolors.to_hex(hook_style("quantization_pertensor")[0])], 0.01)
    assert not _overlapping_texts(figures[0])


def _curve(config: str, losses_by_seed: dict[int, np.ndarray]) -> LossCurve:
    stacked = np.array(list(losses_by_seed.values()))
    n = stacked.shape[1]
    return LossCurve(config=config, hook=config, chunk_size=None, world_size=2, run_ids=[config],
                     steps=np.arange(1, n + 1), mean=stacked.mean(axis=0), std=np.zeros(n),
                     count=np.full(n, len(losses_by_seed)), stops=[], per_seed=losses_by_seed)


def test_the_minus_allreduce_panel_compares_the_seeds_both_ran(tmp_path: Path, monkeypatch):
    """bf16_compress ran seeds 0 and 1 and lies within 0.003 of allreduce at each; allreduce's
    adaptive third seed sits 0.2 lower. Its mean over all three seeds against bf16_compress's two
    would draw a gap of ~0.07; seed by seed on the shared seeds the panel draws the 0.003."""
    from service.report.loss_curves import paired_loss_delta

    base = np.linspace(2.0, 1.0, 20)
    allreduce = _curve("allreduce", {0: base, 1: base + 0.1, 2: base - 0.2})
    bf16 = _curve("bf16_compress", {0: base + 0.003, 1: base + 0.1 + 0.003})
    steps, delta, seeds = paired_loss_delta(bf16, allreduce)
    assert seeds == [0, 1] and list(steps) == list(range(1, 21))
    assert np.allclose(delta, 0.003)
    assert np.allclose(bf16.mean - allreduce.mean, 0.003 + 0.05 - 0.1 / 3 + 0.2 / 3)  # what the old panel drew
    figures = []
    real_save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (figures.append(fig), real_save(fig, path))[1])
    plots.plot_loss_curves({2: [allreduce, bf16]}, tmp_path / "loss.png")
    ax = next(a for a in figures[0].axes if a.get_title().startswith("minus allreduce on the same seeds"))
    (line,) = [l for l in ax.lines if len(l.get_xdata()) == 20]
    assert np.allclose(line.get_ydata(), 0.003)


def test_a_sweep_of_fsdp_alone_draws_its_panel_minus_allreduce_under_fsdp(tmp_path: Path, monkeypatch):
    """No DDP allreduce ran: the panel is against allreduce-fsdp, as the verdicts are."""
    base = np.linspace(2.0, 1.0, 20)
    figures = []
    real_save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (figures.append(fig), real_save(fig, path))[1])
    plots.plot_loss_curves({2: [_curve("allreduce-fsdp", {0: base}),
                                _curve("quantized_allreduce-c512-all_gatheruint8-fsdp", {0: base + 0.002})]},
                           tmp_path / "loss.png")
    ax = next(a for a in figures[0].axes if a.get_title() == "minus allreduce-fsdp on the same seeds, world size 2")
    (line,) = [l for l in ax.lines if len(l.get_xdata()) == 20]
    assert np.allclose(line.get_ydata(), 0.002)


def test_the_cluster_star_leaves_its_cells_label_readable(tmp_path: Path, monkeypatch):
    """A close call names its two candidates in the cell; the star marking report.cluster's cell
    used to sit on the cell's centre, on top of those names. Drawn, the two must not overlap."""
    from types import SimpleNamespace

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from service.report import decision_map
    from service.answer.projection import CellWinner

    figures = []
    real_save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (figures.append(fig), real_save(fig, path))[1])
    a, b = SimpleNamespace(config="allreduce"), SimpleNamespace(config="bf16_compress")
    sizes, links = [2, 4, 8, 16, 32, 64], MAP_LINKS_GBPS
    cells = {(w, g): CellWinner(w, g, a, b, True) for w in sizes for g in links}
    decision_map.plot(cells, [], tmp_path / "map.png", cluster=(32, 10.0))
    fig = figures[0]
    ax = fig.axes[0]
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    x, y = sizes.index(32), list(links).index(10.0)
    (star,) = [line for line in ax.lines if line.get_marker() == "*"]
    (sx,), (sy,) = star.get_xdata(), star.get_ydata()
    cx, cy = ax.transData.transform((sx, sy))
    half = star.get_markersize() * fig.dpi / 72 / 2
    label = next(t for t in ax.texts if t.get_window_extent(renderer).contains(*ax.transData.transform((x, y)))
                 or abs(t.get_position()[0] - x) < 0.01 and abs(t.get_position()[1] - y) < 0.5)
    box = label.get_bbox_patch().get_window_extent(renderer) if label.get_bbox_patch() else label.get_window_extent(renderer)
    assert not (cx + half > box.x0 and cx - half < box.x1 and cy + half > box.y0 and cy - half < box.y1), (
        (cx, cy, half), box)
    # and the star stays inside its own cell
    assert x - 0.5 < sx < x + 0.5 and y - 0.5 < sy < y + 0.5


def test_the_decision_maps_footnote_clears_the_axis_label(tmp_path: Path, monkeypatch):
    """The footnote (quality, latency, where the transport was probed: two lines) sits under the
    x axis' label, not on it."""
    from types import SimpleNamespace

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from service.report import decision_map
    from service.answer.projection import CellWinner

    figures = []
    real_save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (figures.append(fig), real_save(fig, path))[1])
    a = SimpleNamespace(config="allreduce")
    cells = {(w, g): CellWinner(w, g, a, None, False) for w in (2, 4, 8) for g in MAP_LINKS_GBPS}
    decision_map.plot(cells, [], tmp_path / "map.png",
                      quality_from="quality: W=2 their own trials' ...\ntransport: the sweep's own probe, W = 2 on loopback")
    fig = figures[0]
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    label = fig.axes[0].xaxis.label.get_window_extent(renderer)
    ticks = [t.get_window_extent(renderer) for t in fig.axes[0].get_xticklabels()]
    (note,) = [t for t in fig.texts if t.get_text().startswith("quality:")]
    box = note.get_window_extent(renderer)
    assert box.y1 < min([label.y0] + [t.y0 for t in ticks]), (box, label)


def test_a_measured_cells_circle_leaves_its_label_readable(tmp_path: Path, monkeypatch):
    """The circle marking a cell measured on an emulated link sat on the cell's centre, over a
    close call's names."""
    from types import SimpleNamespace

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from service.report import decision_map
    from service.answer.projection import CellWinner

    figures = []
    real_save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (figures.append(fig), real_save(fig, path))[1])
    a, b = SimpleNamespace(config="allreduce"), SimpleNamespace(config="bf16_compress")
    links = list(MAP_LINKS_GBPS)
    cells = {(w, g): CellWinner(w, g, a, b, True) for w in (2, 4, 8) for g in links}
    decision_map.plot(cells, [(4, 1.0)], tmp_path / "map.png")
    fig = figures[0]
    ax = fig.axes[0]
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    x, y = 1, links.index(1.0)
    (circle,) = [line for line in ax.lines if line.get_marker() == "o"]
    cx, cy = ax.transData.transform((circle.get_xdata()[0], circle.get_ydata()[0]))
    half = circle.get_markersize() * fig.dpi / 72 / 2
    label = next(t for t in ax.texts if abs(t.get_position()[0] - x) < 0.01 and abs(t.get_position()[1] - y) < 0.5)
    box = label.get_bbox_patch().get_window_extent(renderer)
    assert not (cx + half > box.x0 and cx - half < box.x1 and cy + half > box.y0 and cy - half < box.y1), ((cx, cy), box)
    assert x - 0.5 < circle.get_xdata()[0] < x + 0.5  # in its own cell
