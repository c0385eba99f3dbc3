"""The step model's measured error: (projected - measured) / measured over the held-out emulated
cells bench/projection.py priced and ran, per hook, error-feedback setting and world size
(``projection_error_cluster.json`` beside this module, written by that bench on an emulated
cluster from the raw cells it commits beside it, ``projection_cells_cluster.json``;
:func:`error_bands` is the one place the report reads it from).

A cell at world size W takes the band measured for its configuration (hook, error-feedback
setting, parallelism and, under fsdp, the parameter all-gather's format) at the checked W nearest to W (in log2: the world size doubles from cell to cell); above the
largest checked W it says so (``ErrorBand.beyond``): nothing measured says the error stays there.
Every band the report prints, absolute or of a ratio, is printed by :func:`band_text`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from hooks.registry import available

# The report's bands: held out through the report's own cluster path (a share of a core per rank,
# W = 2's transport scaled by the ring) on emulated hosts that own their CPU: bench/projection.py
# --host-cpus. The bands of this machine's shape (W ranks on its 2 cores) stay beside them for the
# bench (SHAPE_ERROR_FILE): the report prices no cell that way.
ERROR_FILE = Path(__file__).with_name("projection_error_cluster.json")
RAW_FILE = Path(__file__).with_name("projection_cells_cluster.json")
SHAPE_ERROR_FILE = Path(__file__).with_name("projection_error.json")
FORMAT = 2  # bands keyed by hook, error feedback and W; format 1 (by hook only) is still read
DDP, FSDP = "ddp", "fsdp"
# A band, cell row or pair side measured under fsdp says so (``parallelism``: fsdp, ``all_gather``:
# its format); one without those fields (every file from before fsdp was measured) is ddp's.
DEFAULT_ALL_GATHER = "fp32"


def sharding_of(parallelism: Optional[str], all_gather: Optional[str] = None) -> tuple[str, Optional[str]]:
    """(parallelism, all-gather format) as bands are keyed: ("ddp", None) for a DDP trial (it
    gathers no parameters, whatever its params say), ("fsdp", format) for an fsdp one (fp32,
    FSDP's own, where not given)."""
    if (parallelism or DDP) != FSDP:
        return DDP, None
    return FSDP, all_gather or DEFAULT_ALL_GATHER


def sharding_fields(parallelism: Optional[str], all_gather: Optional[str] = None) -> dict:
    """What a band, cell row or pair side written by the bench carries of its sharding: nothing
    for ddp (the files stay as they were), ``{"parallelism": "fsdp", "all_gather": format}`` for fsdp."""
    par, gather = sharding_of(parallelism, all_gather)
    return {} if par == DDP else {"parallelism": par, "all_gather": gather}


def sharding_in(d: dict, prefix: str = "") -> tuple[str, Optional[str]]:
    """A band's, row's or pair side's (``prefix``: "a_" or "b_") sharding as :func:`sharding_of` keys it."""
    return sharding_of(d.get(f"{prefix}parallelism"), d.get(f"{prefix}all_gather"))


def error_feedback_of(hook: str, params: dict) -> Optional[bool]:
    """The hook's error-feedback setting in a run with ``params`` (its default where not given);
    None for a hook that has no such setting."""
    defaults = available()[hook].params if hook in available() else {}
    if "error_feedback" not in defaults:
        return None
    return bool(params.get("error_feedback", defaults["error_feedback"]))


def label(hook: str, error_feedback: Optional[bool], parallelism: Optional[str] = None,
          all_gather: Optional[str] = None) -> str:
    """'topk with error feedback off'; the hook alone where it has no such setting; under fsdp
    'quantized_allreduce with error feedback off under fsdp, uint8 all-gather'."""
    text = hook if error_feedback is None else f"{hook} with error feedback {'on' if error_feedback else 'off'}"
    par, gather = sharding_of(parallelism, all_gather)
    return text if par == DDP else f"{text} under fsdp, {gather} all-gather"


def pct_range(low: float, high: float) -> str:
    """'-8 to +5 %'; one value where the two round to the same whole percent ('-18 %' for -17.9
    to -17.8: a band of two cells that agree, and a step is not projected closer than a percent)."""
    if round(low) == round(high):
        return f"{round(low):+d} %"
    return f"{round(low):+d} to {round(high):+d} %"


def where_checked(checked_w: Optional[int], beyond: bool = False, beyond_at: tuple[int, ...] = ()) -> str:
    """Where a band was checked: 'checked at W = 8', 'checked at W = 8, used beyond it' (at W =
    16, 32: the cells above it that use it, where known); empty when the W is not known."""
    if checked_w is None:
        return ""
    text = f"checked at W = {checked_w}"
    if beyond_at:
        return text + f", used beyond it at W = {', '.join(str(w) for w in beyond_at)}"
    return text + (", used beyond it" if beyond else "")


def band_text(low: float, high: float, checked_w: Optional[int] = None, beyond: bool = False,
              beyond_at: tuple[int, ...] = ()) -> str:
    """The one way the report prints a band: its range and where it was checked, '-8 to +5 %
    (checked at W = 2)', '-18 % (checked at W = 8, used beyond it at W = 16, 32)'."""
    where = where_checked(checked_w, beyond, beyond_at)
    return f"{pct_range(low, high)} ({where})" if where else pct_range(low, high)


def nearest_checked(checked: list[int], world_size: int) -> int:
    """The checked W nearest ``world_size`` in log2 (the world size doubles from cell to cell);
    of two as near, the larger."""
    return min(checked, key=lambda w: (abs(math.log2(w) - math.log2(max(world_size, 1))), -w))


@dataclass(frozen=True)
class ErrorBand:
    """(projected - measured) / measured, %, over bench/projection.py's counted cells at
    ``checked_w``; ``beyond``: the cell it is printed beside has more ranks than any checked."""

    low_pct: float
    high_pct: float
    source: str   # "measured for <hook ...>" | "widest measured: <hook ...> was not measured"
    checked_w: Optional[int] = None
    beyond: bool = False

    def text(self) -> str:
        return pct_range(self.low_pct, self.high_pct)

    def where(self) -> str:
        """'checked at W = 2', 'checked at W = 8, used beyond it' (empty when the W is not known)."""
        return where_checked(self.checked_w, self.beyond)

    def described(self) -> str:
        """'-7 to +4 % (checked at W = 8, used beyond it)': :func:`band_text`."""
        return band_text(self.low_pct, self.high_pct, self.checked_w, self.beyond)

    def measured_range(self, projected: float) -> tuple[float, float]:
        """The measured values a projection of ``projected`` stands for: (best, worst)."""
        return projected / (1 + self.high_pct / 100), projected / (1 + self.low_pct / 100)


@dataclass(frozen=True)
class MeasuredBand:
    """One band as the bench measured it: a hook, its error-feedback setting (None: it has
    none), the world size of its counted cells; ``parallelism`` and ``all_gather`` as
    :func:`sharding_of` keys them (ddp, None: DDP's)."""

    hook: str
    error_feedback: Optional[bool]
    world_size: int
    low_pct: float
    high_pct: float
    parallelism: str = DDP
    all_gather: Optional[str] = None

    @property
    def configuration(self) -> tuple:
        return (self.hook, self.error_feedback, *sharding_of(self.parallelism, self.all_gather))


@dataclass(frozen=True)
class ErrorBands:
    measured: tuple[MeasuredBand, ...]
    provenance: str   # what was measured, where and when (one line)

    def for_cell(self, hook: str, error_feedback: Optional[bool], world_size: int, parallelism: Optional[str] = None,
                 all_gather: Optional[str] = None) -> Optional[ErrorBand]:
        """The band of ``hook`` with ``error_feedback`` under ``parallelism`` (ddp where None; an
        fsdp trial's with its ``all_gather`` format, fp32 where None) at the checked W nearest
        ``world_size``; for a configuration the bench did not measure, the widest band any had there."""
        if not self.measured:
            return None
        want = (hook, error_feedback, *sharding_of(parallelism, all_gather))
        mine = [m for m in self.measured if m.configuration == want]
        pool = mine or list(self.measured)
        named = label(*want)
        source = f"measured for {named}" if mine else f"widest measured: {named} was not measured"
        checked = sorted({m.world_size for m in pool})
        nearest = nearest_checked(checked, world_size)
        at = [m for m in pool if m.world_size == nearest]
        return ErrorBand(min(m.low_pct for m in at), max(m.high_pct for m in at), source, nearest,
                         world_size > checked[-1])

    @property
    def checked_world_sizes(self) -> list[int]:
        return sorted({m.world_size for m in self.measured})


def _bands_v1(data: dict) -> tuple[MeasuredBand, ...]:
    """Format 1 (by hook name): the bench counted W = 2 only, error feedback on where a hook has it."""
    return tuple(MeasuredBand(hook, error_feedback_of(hook, {"error_feedback": True}), 2,
                              float(b["low_pct"]), float(b["high_pct"]))
                 for hook, b in data["hooks"].items() if b.get("counted"))


def _bands_v2(data: dict) -> tuple[MeasuredBand, ...]:
    """Format 2: a band without ``parallelism`` (every one from before fsdp was measured) is ddp's."""
    return tuple(MeasuredBand(b["hook"], b["error_feedback"], int(b["world_size"]),
                              float(b["low_pct"]), float(b["high_pct"]), *sharding_in(b))
                 for b in data["bands"] if b.get("counted"))


@lru_cache(maxsize=4)
def error_bands(path: Path = ERROR_FILE) -> ErrorBands:
    """The error bands bench/projection.py wrote (format 2, or 1); none when it never ran."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return ErrorBands((), "the step model's error is unmeasured (run bench/projection.py)")
    readers = {1: _bands_v1, 2: _bands_v2}
    if data.get("format") not in readers:
        raise ValueError(f"{path}: format {data.get('format')!r}, this reader reads {sorted(readers)}")
    provenance = (f"{data['source']}, {data['measured'][:10]}: {data['workload']}, basis {data['basis']}, "
                  f"checked at {data['cells']}")
    return ErrorBands(readers[data["format"]](data), provenance)
