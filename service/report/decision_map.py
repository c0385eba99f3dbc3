"""Where compression pays, as a picture: decision_map.png.

World size (2 ... what the global batch allows, log2) against link speed (1 ... 400 Gbit/s, log),
each cell coloured by its answer under the one rule (``projection.winner``: service/step_model/
pairs.py's ``rule``): the fastest configuration to target among those whose quality matched the
baseline where it wins beyond the error, else allreduce. A cell where the winner's margin is
inside the pair's error is hatched and names the answer and the runner-up (:func:`paint`). Above
the links, a 'measured here' row paints each world size the sweep ran with its measured answer
(the headline's). Circles mark the emulated links trials ran on, triangles loopback; the cluster
of ``report.cluster`` is starred (in the top of its cell, above the cell's label); cells whose
link is faster than the hosts' own transport are dotted (a faster link changes nothing there).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from service.answer.projection import Basis, CellWinner

IMAGE = "decision_map.png"
# The cluster's star sits in the upper part of its cell and the cell's label (a close call's two
# names) moves to the lower part: on the centre, the star hid the label. A cell is 1 unit high.
STAR_DY, LABEL_DY = 0.27, 0.15
MEASURED_DX = 0.34  # a measured cell's circle, left of the centre: a close call's names sit there


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
    """A decided cell: its answer's colour. A close call: its answer's colour (allreduce where
    the tie holds it: the one rule's answer), hatched, naming the answer and the runner-up."""
    if cell.winner is None:
        return CellPaint(None, (), False)
    if cell.too_close:
        return CellPaint(cell.winner.config, (cell.winner.config, cell.runner_up.config), True)
    return CellPaint(cell.winner.config, (), False)


def paint_measured(m) -> CellPaint:
    """A measured world size's answer (service/answer/decision.py's Measured) as the map's
    'measured here' row paints it: the same way as a projected cell."""
    a = m.answer
    if a.answer is None:
        return CellPaint(None, (), False)
    if not a.decided and a.runner_up is not None:
        return CellPaint(a.answer, (a.answer, a.runner_up), True)
    return CellPaint(a.answer, (), False)


def plot(cells: dict[tuple[int, float], CellWinner], measured: list[tuple[int, Optional[float]]],
         path: Path, title: str = "", cluster: Optional[tuple[int, float]] = None,
         quality_from: str = "", here: Optional[dict] = None, hidden_above_gbps: Optional[float] = None) -> Path:
    """decision_map.png from :func:`winners`' cells; ``measured``: (W, Gbit/s or None for
    loopback) where trials ran; ``here``: the measured answers per W (decision.Measured), painted
    in a top row of their own; ``hidden_above_gbps``: the link rate above which the hosts' own
    transport is slower than the link, those cells dotted."""
    from matplotlib.patches import Rectangle

    from service.report import plots

    plt = plots.plt
    sizes = sorted({w for w, _ in cells})
    links = sorted({g for _, g in cells})
    painted = {at: paint(cell) for at, cell in cells.items()}
    here_row = {w: paint_measured(m) for w, m in (here or {}).items() if w in sizes}
    configs = sorted({c for p in (*painted.values(), *here_row.values()) for c in (p.colour_of, *p.names)
                      if c is not None})
    palette = plt.get_cmap("tab10" if len(configs) <= 10 else "tab20")
    colour = {c: palette(i) for i, c in enumerate(configs)}
    key = {c: str(i + 1) for i, c in enumerate(configs)}  # a close cell names its two by these
    fig, ax = plt.subplots(figsize=(12, 6.5))
    top = len(links)  # the 'measured here' row, above the fastest link
    cells_drawn = [((w, links.index(g)), p, (w, g) == cluster) for (w, g), p in painted.items()]
    cells_drawn += [((w, top), p, False) for w, p in here_row.items()]
    _draw_cells(ax, cells_drawn, sizes, colour, key)
    hidden = [(w, g) for (w, g) in painted if hidden_above_gbps is not None and g > hidden_above_gbps]
    for w, g in hidden:  # the hosts' own transport is slower than this link: a faster one changes nothing
        ax.add_patch(Rectangle((sizes.index(w) - 0.5, links.index(g) - 0.5), 1, 1, fill=False, hatch="..",
                               edgecolor="0.35", lw=0))
    for w, g in measured:
        if w in sizes:
            # loopback: in the 'measured here' row (without one, on the top edge, drawn whole); left
            # of the centre, where a close call's names are
            y = links.index(g) if g in links else (top if here_row else top - 0.5)
            x = sizes.index(w) - (MEASURED_DX if g in links or here_row else 0.0)
            ax.plot(x, y, marker="o" if g in links else "v", color="black", ms=8, mfc="none", mew=2, clip_on=False)
    if cluster is not None and cluster[0] in sizes and cluster[1] in links:
        ax.plot(sizes.index(cluster[0]), links.index(cluster[1]) + STAR_DY, marker="*", color="black", ms=11,
                mec="white", mew=0.6)
    ax.set_xlim(-0.5, len(sizes) - 0.5)
    ax.set_ylim(-0.5, len(links) + (0.5 if here_row else -0.5))
    ax.set_xticks(range(len(sizes)), [str(w) for w in sizes])
    ax.set_yticks(range(len(links) + bool(here_row)), [f"{g:g}" for g in links] + (["measured here"] if here_row else []))
    if here_row:
        ax.axhline(top - 0.5, color="black", lw=1.5)
    ax.set_xlabel("world size (ranks, log2)")
    ax.set_ylabel("link speed per rank (Gbit/s, log)")
    handles = _legend(configs, colour, key, hidden_above_gbps if hidden else None, cluster is not None)
    ax.legend(handles=handles, fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    heading = "fastest to target at matching quality (projected)"
    ax.set_title(f"{title}: {heading}" if title else heading, fontsize=11, pad=14)  # room for the loopback marks
    if quality_from:  # wrapped to the figure's width: a long line would squeeze the axes
        quality_from = "\n".join(textwrap.fill(line, 170) for line in quality_from.splitlines())
        fig.text(0.01, 0.01, quality_from, fontsize=8, color="dimgrey")
    # the footnote's lines get room of their own below the axis' label (tight_layout ignores fig.text)
    lines = quality_from.count("\n") + 1 if quality_from else 0
    fig.tight_layout(rect=(0, 0.01 + lines * 12 / 72 / fig.get_figheight(), 1, 1))
    return plots._save(fig, Path(path))


def _draw_cells(ax, cells_drawn: list, sizes: list[int], colour: dict, key: dict) -> None:
    """Each cell ((W, row), its CellPaint, whether the star sits in it): its answer's colour,
    hatched where too close to call, the candidates' numbers written in it."""
    from matplotlib.patches import Rectangle

    for (w, y), p, starred in cells_drawn:
        x = sizes.index(w)
        face = colour[p.colour_of] if p.colour_of is not None else "white"
        ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=face, edgecolor="white",
                               hatch="///" if p.hatched else None, lw=0.5))
        if p.names:  # in the cluster's cell, below its star (:data:`STAR_DY`), which would hide it
            ax.text(x, y - (LABEL_DY if starred else 0.0), " | ".join(key[c] for c in p.names),
                    ha="center", va="center", fontsize=8, bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})


def _legend(configs: list[str], colour: dict, key: dict, hidden_above_gbps: Optional[float], starred: bool) -> list:
    """The map's legend: each configuration by its number, then what hatching, dots and marks mean."""
    from matplotlib.patches import Patch

    from service.report import plots

    line = plots.plt.Line2D
    handles = [Patch(facecolor=colour[c], label=f"{key[c]} {c}") for c in configs]
    handles += [Patch(facecolor="white", edgecolor="grey", hatch="///",
                      label="hatched: too close to call (answer | runner-up)")]
    if hidden_above_gbps is not None:
        handles.append(Patch(facecolor="white", edgecolor="0.35", hatch="..",
                             label=f"dotted: faster than these hosts move bytes (~{hidden_above_gbps:.3g} Gbit/s)"))
    handles += [line([], [], marker="o", color="black", mfc="none", ls="", label="measured (emulated link)"),
                line([], [], marker="v", color="black", mfc="none", ls="", label="measured on loopback")]
    if starred:
        handles.append(line([], [], marker="*", color="black", ls="", ms=12, label="report.cluster"))
    return handles
