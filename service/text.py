"""How the service writes numbers and errors for people: one home for byte counts, one-line errors,
quoted values and "did you mean" hints.

Every table, report, plot and message that shows bytes or an error uses these, so the same
metric reads the same everywhere (binary units: KiB = 1024 B).
"""
from __future__ import annotations

import difflib
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


def short_value(value: object, limit: int = 60) -> str:
    """A value as an error message quotes it: its repr on one line, at most ``limit`` characters."""
    text = one_line(repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def did_you_mean(word: str, options) -> str:
    """" (did you mean 'x'?)" for the option closest to a mistyped ``word``, or ""."""
    options = [str(o) for o in options]
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if not close and len(word) >= 3:  # a shortened name: `fp16` for fp16_compress
        close = [o for o in options if word.lower() in o.lower()][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""
