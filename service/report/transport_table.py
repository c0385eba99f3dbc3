"""The report's transport table: what moving bytes through each collective cost this machine,
measured once before the sweep's trials (``transport.json``, service/step_model/transport.py),
the figures every projected cell's transport is priced from."""

from __future__ import annotations

from typing import Optional

from service.step_model.transport import TransportFit

HEADING = "### Transport measured for this sweep (transport.json)"


def rows(fit: TransportFit) -> list[list[str]]:
    """Per kind: the fit, its worst error over the samples, and a 1 MB collective at each probed W."""
    out = []
    for kind, f in fit.kinds.items():
        at = "; ".join(f"W={w}: {fit.ms(kind, 1e6, w):.2f} ms" for w in fit.world_sizes)
        out.append([kind, f"{1000 * f.fixed_ms:.1f} µs", f"{1e6 * f.per_byte_ms:.3f} ms", f"{100 * f.max_rel_error:.0f} %", at])
    return out


def markdown(fit: Optional[TransportFit]) -> list[str]:
    """The table's lines (none when the sweep measured no transport)."""
    if fit is None:
        return ["Transport: not measured for this sweep (no world size above 1, GPUs, or a sweep from before "
                "it was measured): each trial's recorded communication is scaled instead.", ""]
    header = ["collective", "per round", "per MB sent", "worst fit error", "1 MB payload"]
    cost = ", ".join(f"W={w}: {s:g} s" for w, s in sorted(fit.probe_s.items()))
    lines = [HEADING, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(fit)]
    return lines + ["", f"Fitted over {len(fit.samples)} probes (medians of repeats); the probe took {cost}.", ""]
