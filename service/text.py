"""How the service writes numbers and errors for people: one home for byte counts and one-line errors.

Every table, report, plot and message that shows bytes or an error uses these, so the same
metric reads the same everywhere (binary units: KiB = 1024 B).
"""
from __future__ import annotations

import math

_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def byte_unit(values) -> tuple[int, str]:
    """``(size, name)`` of the largest binary unit that the largest of ``values`` reaches (B if none)."""
    top = max((abs(v) for v in values if v is not None and math.isfinite(v)), default=0)
    for name, size in _UNITS:
        if top >= size:
            return size, name
    return 1, "B"


def format_bytes(value: float | None, missing: str = "-") -> str:
    """``value`` bytes as "512 B", "1.5 KiB", "34.0 MiB", "2.1 GiB"; ``missing`` for None or NaN."""
    if value is None or not math.isfinite(value):
        return missing
    size, name = byte_unit([value])
    return f"{value:.0f} B" if size == 1 else f"{value / size:.1f} {name}"


def one_line(err: BaseException | str, *, with_type: bool = True, every_line: bool = False) -> str:
    """An error (or any text) on one line: whitespace collapsed; an exception as "Type: message".

    An exception keeps its message's first line (later lines are detail: Ray's remote
    tracebacks, pydantic's listings); a message that is itself a traceback keeps its last line
    ("ValueError: ..."), which is what failed. ``with_type=False`` drops the type name (for errors whose message says it all).
    ``every_line=True`` keeps every line of the message, joined (a user's code, whose message
    is all the user has to go on: a workload that fails to import or to run).
    """
    if not isinstance(err, BaseException):
        return " ".join(str(err).split())
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    if every_line:
        lines = [" ".join(lines)] if lines else []
    elif lines and lines[0].startswith("Traceback"):
        return lines[-1]
    text = " ".join(lines[0].split()) if lines else ""
    if not with_type:
        return text or type(err).__name__
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def count(n: int, noun: str) -> str:
    """"1 trial", "3 trials"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
