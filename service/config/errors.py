"""ConfigError (one line per problem) and the text its messages are written with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.text import count, one_line

MAX_SHOWN_PROBLEMS = 10  # a config with more problems than this was not written for this tool


class ConfigError(Exception):
    """A config the sweep cannot run. str() is a single line: where, what is wrong, what is allowed
    (and which other fields have problems); ``lines()`` is every problem in full, a line each."""

    def __init__(self, message: str, *, field: str | None = None, source: str | Path | None = None,
                 more: list[tuple[str, str]] | None = None):
        self.problem = one_line(message)
        self.field = field
        self.source = str(source) if source is not None else None
        self.more = list(more or [])  # the other problems: (field, problem)
        summary = ""
        if self.more:
            fields = [f for f, _ in self.more]
            shown = ", ".join(fields[:3]) + (", ..." if len(fields) > 3 else "")
            summary = f" (and {count(len(fields), 'more problem')}: {shown})"
        super().__init__(self._line(field, self.problem + summary))

    def _line(self, field: str | None, problem: str) -> str:
        return ": ".join([p for p in (self.source, field) if p] + [problem])

    def lines(self) -> list[str]:
        """Every problem in full, one line each: at most MAX_SHOWN_PROBLEMS, then a count of the rest."""
        every = [self._line(self.field, self.problem)] + [self._line(f, one_line(p)) for f, p in self.more]
        shown = every[:MAX_SHOWN_PROBLEMS]
        hidden = len(every) - len(shown)
        return shown + ([f"... and {count(hidden, 'more problem')}"] if hidden else [])


class FieldProblem(ValueError):
    """Raised inside validators: `field` is relative to the model being validated.

    pydantic keeps the exception in the error's ctx, so the formatter can append `field` to the
    error's location and report e.g. `search.hooks[2].chunk_size` rather than `search.hooks[2]`.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(message)

    def __reduce__(self):  # pickled (e.g. by Ray): rebuilt from both arguments, not args
        return type(self), (self.field, self.message)


def exception_text(exc: BaseException) -> str:
    text = one_line(str(exc)) or type(exc).__name__
    return text if isinstance(exc, (ValueError, ConfigError)) else f"{type(exc).__name__}: {text}"


def type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a bool", int: "an integer",
            float: "a number", type(None): "nothing (null)"}.get(type(value), type(value).__name__)
