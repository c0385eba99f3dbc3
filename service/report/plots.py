"""Drawings of the report's data (service.report computes it; this module only draws).

matplotlib with the Agg backend: no display needed. Every plot keeps the same visual code:
colour and marker = hook (service/report/hook_styles.py), line style =
chunk size, so one legend reads across all figures.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

import hooks  # noqa: E402
from service.answer.recommend import FSDP_BASELINE  # noqa: E402
from service.report.loss_curves import paired_loss_delta  # noqa: E402
from service.report.hook_styles import hook_style  # noqa: E402
from service.text import byte_unit  # noqa: E402

_LINESTYLES = ["-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1))]


def hook_colour(hook: str) -> str:
    return hook_style(hook)[0]


def hook_marker(hook: str) -> str:
    return hook_style(hook)[1]


class ChunkStyles:
    """Line style per chunk size: solid for no chunk size, then by increasing chunk size."""

    def __init__(self, chunk_sizes):
        self.order = sorted({c for c in chunk_sizes if c is not None})

    def __call__(self, chunk_size):
        if chunk_size is None:
            return "-"
        return _LINESTYLES[(1 + self.order.index(chunk_size)) % len(_LINESTYLES)]


def _empty(ax, text):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


BASELINE = hooks.BASELINE


def _baseline_curve(curves_at_w: list):
    """allreduce's curve; in a sweep of fsdp alone, allreduce-fsdp's (recommend.cell_baseline)."""
    return (next((c for c in curves_at_w if c.config == BASELINE), None)
            or next((c for c in curves_at_w if c.config == FSDP_BASELINE), None))


def plot_loss_curves(curves: dict, path: Path, title: str = "") -> Path:
    """curves: {world_size: [LossCurve]} from service.report.loss_curve_data.

    Top row: the loss curves. Bottom row (when allreduce ran): each configuration's loss minus
    allreduce's at the same steps and seeds, averaged over the seeds both ran
    (loss_curves.paired_loss_delta), where curves that lie on top of each other above separate."""
    world_sizes = list(curves) or [None]
    with_delta = any(_baseline_curve(cs) is not None and len(cs) > 1 for cs in curves.values())
    rows = 2 if with_delta else 1
    fig, axes = plt.subplots(rows, len(world_sizes),
                             figsize=(5.2 * len(world_sizes) + 0.5, 4.6 + 3.2 * (rows - 1)),
                             squeeze=False, sharey="row", height_ratios=[1.4, 1][:rows],
                             layout="constrained")  # lays out titles, tick labels and legend without overlaps
    chunk_style = ChunkStyles(c.chunk_size for cs in curves.values() for c in cs)
    all_values = np.concatenate([c.mean for cs in curves.values() for c in cs] or [np.array([])])
    positive = all_values[all_values > 0]
    log_y = (len(positive) == len(all_values) and len(positive) > 0
             and positive.max() / positive.min() > 10)
    legend: dict[str, tuple] = {}
    any_stop = {"nan": False, "failed": False}
    for ax, world_size in zip(axes[0], world_sizes):
        if world_size is None:
            _empty(ax, "no trial has logged a loss yet")
            continue
        for c in curves[world_size]:
            _plot_curve(ax, c, chunk_style, legend, any_stop)
        ax.set_title(f"world size {world_size}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if log_y:
            ax.set_yscale("log")
        if with_delta:
            _plot_delta(axes[1][list(curves).index(world_size)], curves[world_size], world_size, chunk_style)
    axes[0][0].set_ylabel("training loss" + (" (log scale)" if log_y else ""))
    if with_delta:
        axes[1][0].set_ylabel(f"loss minus {BASELINE}'s")
    handles = _legend_handles(legend, any_stop)
    if handles:
        fig.legend(handles, list(legend), loc="outside lower center",
                   ncol=min(4, len(handles)), frameon=False, fontsize=9)
    fig.suptitle(f"{title}: loss against step" if title else "loss against step")
    return _save(fig, path)


def _plot_curve(ax, c, chunk_style, legend: dict, any_stop: dict) -> None:
    """One configuration's mean loss (a band of one standard deviation over seeds where there are
    several) and where its trials stopped; its legend entry and stop kinds recorded."""
    (colour, marker), ls = hook_style(c.hook), chunk_style(c.chunk_size)
    legend.setdefault(c.config, (colour, ls, marker))
    if len(c.steps) == 0:
        return
    ax.plot(c.steps, c.mean, color=colour, linestyle=ls, lw=1.5, alpha=0.9, marker=marker,
            markevery=max(1, len(c.steps) // 8), ms=5)
    band = c.count > 1
    if band.any():
        ax.fill_between(c.steps, np.where(band, c.mean - c.std, np.nan),
                        np.where(band, c.mean + c.std, np.nan), color=colour, alpha=0.15,
                        lw=0)
    for _, step, value, kind in c.stops:
        any_stop[kind] = True
        ax.plot([step], [value], marker="X" if kind == "nan" else "P", ms=11,
                color=colour, markeredgecolor="red" if kind == "nan" else "black",
                markeredgewidth=1.5, linestyle="none", zorder=5)


def _legend_handles(legend: dict, any_stop: dict) -> list:
    """The legend's lines (``legend`` gains the stop markers that occurred), in its order."""
    if any_stop["nan"]:
        legend["went NaN: stopped here"] = None
    if any_stop["failed"]:
        legend["failed here"] = None
    handles = []
    for label, style in legend.items():
        if style is None:
            nan = label.startswith("went NaN")
            handles.append(Line2D([], [], marker="X" if nan else "P", ms=10, linestyle="none",
                                  color="white", markeredgecolor="red" if nan else "black",
                                  markeredgewidth=1.5))
        else:
            handles.append(Line2D([], [], color=style[0], linestyle=style[1], marker=style[2], lw=2))
    return handles


def _plot_delta(ax, curves_at_w: list, world_size, chunk_style) -> None:
    base = _baseline_curve(curves_at_w)
    ax.axhline(0.0, color=hook_colour(BASELINE), lw=1.0)
    if base is None:
        _empty(ax, f"no {BASELINE} at this world size")
        return
    for c in curves_at_w:
        if c is base:
            continue
        common, delta, _ = paired_loss_delta(c, base)
        if not len(common):
            continue
        (colour, marker), ls = hook_style(c.hook), chunk_style(c.chunk_size)
        ax.plot(common, delta, color=colour, linestyle=ls, lw=1.3,
                marker=marker, markevery=max(1, len(common) // 8), ms=4)
    ax.set_title(f"minus {base.config} on the same seeds, world size {world_size}", fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)


def plot_throughput(lines: list, path: Path, title: str = "") -> Path:
    """lines: [ThroughputLine] from service.report.throughput_data."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    if not lines:
        _empty(ax, "no trial has finished ok yet")
    chunk_style = ChunkStyles(line.chunk_size for line in lines)
    world_sizes = sorted({w for line in lines for w in line.world_sizes})
    for line in lines:
        ax.errorbar(line.world_sizes, line.mean, yerr=line.std if any(line.std) else None,
                    color=hook_colour(line.hook), linestyle=chunk_style(line.chunk_size),
                    marker=hook_marker(line.hook), capsize=3, lw=1.6, label=line.config)
    if lines:
        ax.set_xticks(world_sizes)
        ax.set_xlabel("world size (workers)")
        ax.set_ylabel("samples / s (after warm-up)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        ax.set_ylim(bottom=0)
    ax.set_title(f"{title}: throughput" if title else "throughput")
    fig.tight_layout()
    return _save(fig, path)


_FILLS = ["full", "none", "left", "bottom", "right", "top"]  # by chunk size, same order as line styles


def plot_tradeoff(points: dict, quality_metric: str, path: Path, title: str = "") -> Path:
    """points: {world_size: [TradeoffPoint]} from service.report.tradeoff_data (each point over the
    seeds every configuration at its world size ran: service/report/tradeoff.py).

    Each configuration is named once, in a legend beside the panels (its hook's colour and
    marker, its chunk size's fill), never by labels next to its point: those overlapped into
    a smear where configurations sit close together."""
    world_sizes = list(points) or [None]
    fig, axes = plt.subplots(1, len(world_sizes), figsize=(5.6 * len(world_sizes) + 3.0, 4.8),
                             squeeze=False, layout="constrained")
    ylabel = "final eval accuracy" if quality_metric == "final_eval_accuracy" else "final loss"
    scale, unit = byte_unit(p.bytes_per_step for g in points.values() for p in g)
    chunks = ChunkStyles(p.chunk_size for g in points.values() for p in g)
    legend: dict[str, Line2D] = {}
    for ax, world_size in zip(axes[0], world_sizes):
        if world_size is None:
            _empty(ax, "no trial with bytes/step and a final metric yet")
            continue
        group = points[world_size]
        for p in group:
            colour, marker = hook_style(p.hook)
            fill = _FILLS[(chunks.order.index(p.chunk_size) + 1) % len(_FILLS)
                          if p.chunk_size is not None else 0]
            style = dict(marker=marker, ms=9 if p.on_front else 7, color=colour, fillstyle=fill,
                         markeredgecolor="black" if p.on_front else colour,
                         alpha=1.0 if p.on_front else 0.55)
            ax.errorbar([p.bytes_per_step / scale], [p.quality], yerr=[p.quality_std] if p.quality_std
                        else None, capsize=3, linestyle="none", **style)
            legend.setdefault(p.config, Line2D([], [], linestyle="none", **{**style, "alpha": 1.0,
                                                                             "markeredgecolor": colour}))
        front = sorted((p for p in group if p.on_front), key=lambda p: p.bytes_per_step)
        if front:
            ax.plot([p.bytes_per_step / scale for p in front], [p.quality for p in front],
                    color="green", lw=1.5, alpha=0.6, drawstyle="steps-post")
        values = [p.bytes_per_step for p in group if p.bytes_per_step > 0]
        if values and max(values) / min(values) > 8:
            ax.set_xscale("log")
        ax.set_title(f"world size {world_size}")
        ax.set_xlabel(f"{unit} per step on the wire (per rank)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.margins(x=0.15, y=0.1)
    handles = list(legend.values()) + [
        Line2D([], [], color="green", lw=1.5, alpha=0.6, marker="o", markeredgecolor="black",
               markerfacecolor="lightgrey"),
        Line2D([], [], linestyle="none", marker="o", color="lightgrey", alpha=0.55)]
    labels = list(legend) + ["Pareto front (black edge): worth choosing",
                             "faded: another is no worse on both axes"]
    fig.legend(handles, labels, loc="outside right center", frameon=False,
               fontsize=8)
    fig.suptitle(f"{title}: quality against communication" if title
                 else "quality against communication")
    return _save(fig, path)

