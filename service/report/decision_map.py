"""Where compression pays, as a picture: decision_map.png.

World size (2 ... what the global batch allows, log2) against link speed (1 ... 400 Gbit/s, log),
each decided cell coloured by the configuration with the shortest projected time to target among
those whose quality matched the baseline (service/answer/projection.py); a cell whose winner's
margin over the runner-up is inside that pair's measured ratio error and its trials' spread
(``projection.winner``: service/step_model/pairs.py's rule) is hatched grey and names both
candidates instead: a colour there would be the noise's pick, and flip from cell to cell
(:func:`paint`). The measured
cells marked (a circle per emulated link a trial ran on; loopback at the top edge), the cluster
of ``report.cluster`` starred (in the top of its cell, above the cell's label).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from service.answer.projection import Basis, CellProjection, CellWinner, default_world_sizes, project, winner
from service.step_model.bands import ErrorBands
from service.step_model.pairs import PairBands

IMAGE = "decision_map.png"
MAP_LINKS_GBPS = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0)
FIRST_MAP_W = 2
# The cluster's star sits in the upper part of its cell and the cell's label (a close call's two
# names) moves to the lower part: on the centre, the star hid the label. A cell is 1 unit high.
STAR_DY, LABEL_DY = 0.27, 0.15
MEASURED_DX = 0.34  # a measured cell's circle, left of the centre: a close call's names sit there


def map_world_sizes(global_batch: int) -> list[int]:
    """2, 4, ... up to the global batch."""
    return default_world_sizes(global_batch, FIRST_MAP_W)


def winners(bases: list[Basis], world_sizes: list[int], latency_ms: float, links_gbps=MAP_LINKS_GBPS,
            bands: Optional[ErrorBands] = None, transport=None,
            pairs: Optional[PairBands] = None) -> dict[tuple[int, float], CellWinner]:
    """(W, link) -> the cell's winner, every basis priced there at ``latency_ms`` (and the sweep's ``transport``)."""
    by_cell: dict[tuple[int, float], list[CellProjection]] = {}
    for p in project(bases, world_sizes, links_gbps, latency_ms, bands, transport):
        by_cell.setdefault((p.world_size, p.link_gbps), []).append(p)
    return {cell: winner(ps, pairs) for cell, ps in by_cell.items()}


def quality_note(bases: list[Basis], latency_ms: float) -> str:
    """The map's footnote: which world sizes keep their own quality, which assume another's, the latency."""
    own = sorted({q.world_size for b in bases for q in (b.quality_at(b.measured_world_size), *b.other_quality)})
    assumed = sorted({b.measured_world_size for b in bases})
    return (f"quality: W={', '.join(map(str, own))} their own trials'; every other W from "
            f"W={', '.join(map(str, assumed))} (assumed there); priced at {1000 * latency_ms:g} µs per message")


@dataclass(frozen=True)
class CellPaint:
    """How one cell is drawn: ``colour_of`` the configuration whose colour fills it (None: no
    single winner, a neutral face), ``names`` the configurations written in it, ``hatched``."""

    colour_of: Optional[str]
    names: tuple[str, ...]
    hatched: bool


def paint(cell: CellWinner) -> CellPaint:
    """A decided cell: its winner's colour. A close call: no winner's colour, both candidates named."""
    if cell.winner is None:
        return CellPaint(None, (), False)
    if cell.too_close:
        return CellPaint(None, (cell.winner.config, cell.runner_up.config), True)
    return CellPaint(cell.winner.config, (), False)


def plot(cells: dict[tuple[int, float], CellWinner], measured: list[tuple[int, Optional[float]]],
         path: Path, title: str = "", cluster: Optional[tuple[int, float]] = None,
         quality_from: str = "") -> Path:
    """decision_map.png from :func:`winners`' cells; ``measured``: (W, Gbit/s or None for
    loopback) where trials ran."""
    from matplotlib.patches import Patch, Rectangle

    from service.report import plots

    plt = plots.plt
    sizes = sorted({w for w, _ in cells})
    links = sorted({g for _, g in cells})
    painted = {at: paint(cell) for at, cell in cells.items()}
    configs = sorted({c for p in painted.values() for c in (p.colour_of, *p.names) if c is not None})
    palette = plt.get_cmap("tab10" if len(configs) <= 10 else "tab20")
    colour = {c: palette(i) for i, c in enumerate(configs)}
    key = {c: str(i + 1) for i, c in enumerate(configs)}  # a close cell names its two by these
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for (w, g), p in painted.items():
        x, y = sizes.index(w), links.index(g)
        face = colour[p.colour_of] if p.colour_of is not None else ("0.88" if p.hatched else "white")
        ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=face, edgecolor="white",
                               hatch="///" if p.hatched else None, lw=0.5))
        if p.names:  # in the cluster's cell, below its star (:data:`STAR_DY`), which would hide it
            ax.text(x, y - (LABEL_DY if (w, g) == cluster else 0.0), " | ".join(key[c] for c in p.names),
                    ha="center", va="center", fontsize=8, bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
    for w, g in measured:
        if w in sizes:
            y = links.index(g) if g in links else len(links) - 0.5
            # loopback: on the top edge, drawn whole; a link's circle left of the centre, where a
            # close call's names are
            x = sizes.index(w) - (MEASURED_DX if g in links else 0.0)
            ax.plot(x, y, marker="o" if g in links else "v", color="black", ms=8, mfc="none", mew=2, clip_on=False)
    if cluster is not None and cluster[0] in sizes and cluster[1] in links:
        ax.plot(sizes.index(cluster[0]), links.index(cluster[1]) + STAR_DY, marker="*", color="black", ms=11,
                mec="white", mew=0.6)
    ax.set_xlim(-0.5, len(sizes) - 0.5)
    ax.set_ylim(-0.5, len(links) - 0.5)
    ax.set_xticks(range(len(sizes)), [str(w) for w in sizes])
    ax.set_yticks(range(len(links)), [f"{g:g}" for g in links])
    ax.set_xlabel("world size (ranks, log2)")
    ax.set_ylabel("link speed per rank (Gbit/s, log)")
    handles = [Patch(facecolor=colour[c], label=f"{key[c]} {c}") for c in configs]
    handles += [Patch(facecolor="0.88", edgecolor="grey", hatch="///",
                      label="too close to call: the two named (their ratio's error band, the seeds' and the probe's spread)"),
                plt.Line2D([], [], marker="o", color="black", mfc="none", ls="", label="measured (emulated link)"),
                plt.Line2D([], [], marker="v", color="black", mfc="none", ls="", label="measured on loopback")]
    if cluster is not None:
        handles.append(plt.Line2D([], [], marker="*", color="black", ls="", ms=12, label="report.cluster"))
    ax.legend(handles=handles, fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    heading = "fastest to target at matching quality (projected)"
    ax.set_title(f"{title}: {heading}" if title else heading, fontsize=11, pad=14)  # room for the loopback marks
    # the footnote's lines get room of their own below the axis' label (tight_layout ignores fig.text)
    lines = quality_from.count("\n") + 1 if quality_from else 0
    if quality_from:
        fig.text(0.01, 0.01, quality_from, fontsize=8, color="dimgrey")
    fig.tight_layout(rect=(0, 0.01 + lines * 12 / 72 / fig.get_figheight(), 1, 1))
    return plots._save(fig, Path(path))
