"""Plot identity: every registered hook draws in its own (colour, marker), read from its
registry entry, and the figures use exactly that (issue 13: fp16_compress used to hash to
quantization_pertensor's colour, both solid, indistinguishable in a report)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.colors as mcolors
import numpy as np

import hooks
from service import plots
from service.report import LossCurve

STOP_MARKERS = {"X", "P"}  # the loss plot's "went NaN" / "failed here" marks


def test_every_registered_hook_has_a_distinct_colour_and_marker_pair():
    specs = hooks.available()
    pairs = {name: (mcolors.to_hex(spec.colour), spec.marker) for name, spec in specs.items()}
    assert len(set(pairs.values())) == len(pairs), pairs
    # and distinct colours outright, as far as a palette reaches: a legend reads by colour first
    assert len({c for c, _ in pairs.values()}) == len(pairs), pairs
    for name, (_, marker) in pairs.items():
        assert marker not in STOP_MARKERS, f"{name}: marker {marker!r} is a stop mark"
    for name in specs:
        assert plots.hook_style(name) == (specs[name].colour, specs[name].marker)


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
    assert drawn[0][:2] == (mcolors.to_hex(hooks.available()["fp16_compress"].colour),
                            hooks.available()["fp16_compress"].marker)
    legend = figures[0].legends[0]
    legend_styles = {t.get_text(): (mcolors.to_hex(h.get_color()), h.get_marker())
                     for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert legend_styles["fp16_compress"] != legend_styles["quantization_pertensor"]
