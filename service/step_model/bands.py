"""The step model's measured error: per hook, (projected - measured) / measured over the held-out
emulated cells bench/projection.py priced and ran (``projection_error.json`` beside this module,
written by that bench; :func:`error_bands` is the one place the report reads it from)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

ERROR_FILE = Path(__file__).with_name("projection_error.json")


@dataclass(frozen=True)
class ErrorBand:
    """(projected - measured) / measured, %, over bench/projection.py's counted cells."""

    low_pct: float
    high_pct: float
    source: str   # "measured for <hook>" | "widest measured: <hook> was not measured"

    def text(self) -> str:
        return f"{self.low_pct:+.0f} to {self.high_pct:+.0f} %"

    def measured_range(self, projected: float) -> tuple[float, float]:
        """The measured values a projection of ``projected`` stands for: (best, worst)."""
        return projected / (1 + self.high_pct / 100), projected / (1 + self.low_pct / 100)


@dataclass(frozen=True)
class ErrorBands:
    by_hook: dict[str, ErrorBand]
    provenance: str   # what was measured, where and when (one line)

    def for_hook(self, hook: str) -> Optional[ErrorBand]:
        """The hook's band; for a hook the bench did not measure, the widest band any hook had."""
        if hook in self.by_hook:
            return self.by_hook[hook]
        if not self.by_hook:
            return None
        return ErrorBand(min(b.low_pct for b in self.by_hook.values()),
                         max(b.high_pct for b in self.by_hook.values()),
                         f"widest measured: {hook} was not measured")


@lru_cache(maxsize=4)
def error_bands(path: Path = ERROR_FILE) -> ErrorBands:
    """The per-hook error bands bench/projection.py wrote (format 1); none when it never ran."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return ErrorBands({}, "the step model's error is unmeasured (run bench/projection.py)")
    if data.get("format") != 1:
        raise ValueError(f"{path}: format {data.get('format')!r}, this reader reads 1")
    bands = {hook: ErrorBand(float(b["low_pct"]), float(b["high_pct"]), f"measured for {hook}")
             for hook, b in data["hooks"].items() if b.get("counted")}
    provenance = (f"{data['source']}, {data['measured'][:10]}: {data['workload']}, basis {data['basis']}, "
                  f"checked at {data['cells']}")
    return ErrorBands(bands, provenance)
