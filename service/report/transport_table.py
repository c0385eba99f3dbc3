"""The report's transport table: what moving bytes through each collective cost this machine,
measured once before the sweep's trials (``transport.json``, service/step_model/transport.py),
the figures every projected cell's transport is priced from (summary.md and report.html)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from service.step_model.transport import TransportFit

HEADING = "Transport measured for this sweep (transport.json)"
HEADER = ("collective", "probed W", "fixed per collective", "per MB sent", "worst fit error", "1 MB payload",
          "cores")
NOT_MEASURED = ("Transport: not measured for this sweep (no world size above 1, GPUs, or a sweep from before it "
                "was measured): each trial's recorded communication is scaled instead.")
# {reason}: why, as the sweep recorded it ("its probe failed (...)", "tracking.transport_probe is false")
NOT_MEASURED_BECAUSE = ("Transport: not measured for this sweep: {reason}; each trial's recorded communication is "
                        "scaled instead.")


def not_measured(failure: Optional[str]) -> str:
    """Why the sweep has no transport: the reason it recorded (a failed probe, the probe turned
    off), else the usual reasons."""
    return NOT_MEASURED_BECAUSE.format(reason=failure) if failure else NOT_MEASURED


@dataclass(frozen=True)
class TransportTable:
    header: tuple[str, ...]
    rows: list[list[str]]
    caption: str


def table(fit: Optional[TransportFit]) -> Optional[TransportTable]:
    """Per kind and probed W: the fit, its worst error over its samples, and a 1 MB collective."""
    if fit is None:
        return None
    rows = []
    for kind, fits in fit.kinds.items():
        for f in fits:
            rows.append([kind, str(f.world_size), f"{1000 * f.fixed_ms:.1f} µs", f"{1e6 * f.per_byte_ms:.3f} ms",
                         f"{100 * f.max_rel_error:.0f} %", f"{fit.ms(kind, 1e6, f.world_size):.2f} ms",
                         "shared by the ranks (not used for cluster cells)" if f.shared else "one per rank"])
    cost = ", ".join(f"W={w}: {s:g} s" for w, s in sorted(fit.probe_s.items()))
    return TransportTable(HEADER, rows, f"Fitted over {len(fit.samples)} probes (medians of repeats); "
                                        f"the probe took {cost}. Other world sizes scale the nearest probed W's "
                                        "fixed cost by the ring's rounds.")


def markdown(fit: Optional[TransportFit], failure: Optional[str] = None) -> list[str]:
    """The table's lines for summary.md (a sentence when the sweep measured no transport, with
    ``failure``, the probe's recorded reason, where it failed)."""
    t = table(fit)
    if t is None:
        return [not_measured(failure), ""]
    lines = [f"### {HEADING}", "", "| " + " | ".join(t.header) + " |", "|" + "---|" * len(t.header)]
    return lines + ["| " + " | ".join(r) + " |" for r in t.rows] + ["", t.caption, ""]
