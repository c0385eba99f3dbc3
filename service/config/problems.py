"""Turning pydantic's validation errors into (field, problem) lines."""

from __future__ import annotations

import re
from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from service.config.errors import FieldProblem, exception_text, type_name
from service.text import did_you_mean, short_value
from service.config.schema import SweepConfig


def all_problems(exc: ValidationError) -> list[tuple[str, str]]:
    """Every (field, problem) of a validation error; an unknown key first: `worklaod:` is one
    typo, though pydantic also reports workload missing."""
    errors = sorted(exc.errors(), key=lambda e: e.get("type") != "extra_forbidden")
    return [(field or "(top level)", problem) for field, problem in map(_describe_error, errors)]


# search.seed is a list or a SeedRange: pydantic names the form it tried in the location
_SEED_FORMS = ("list", "range")


def _without_form(loc: tuple) -> tuple:
    return tuple(p for i, p in enumerate(loc) if not (i and loc[i - 1] == "seed" and p in _SEED_FORMS))


def _describe_error(err: dict[str, Any]) -> tuple[str, str]:
    loc = _without_form(tuple(err.get("loc", ())))
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    cause = ctx.get("error")
    value = err.get("input")
    if isinstance(cause, FieldProblem):
        return _join_path(loc, cause.field), cause.message
    path = _join_path(loc)
    if kind == "missing":
        return path, "missing: this field is required"
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = list(parent.model_fields) if parent else []
        return path or repr(loc[-1]), (f"unknown key{did_you_mean(str(loc[-1]), allowed)}; "
                      f"allowed: {', '.join(allowed)}")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return path, f"must be a mapping of keys, got {type_name(value)} {short_value(value)}"
    if kind in ("too_short", "string_too_short"):
        return path, (f"must not be empty (got {short_value(value)})" if ctx.get("min_length") == 1
                      else f"must have at least {ctx.get('min_length')} items (got {short_value(value)})")
    if kind == "value_error" and cause is not None:
        return path, exception_text(cause)
    msg = str(err.get("msg", "invalid value"))
    msg = re.sub(r"^(Value error|Assertion failed), ", "", msg)
    msg = msg.replace("Input should be", "must be").replace("List should have", "must have")
    if kind in ("int_type", "int_from_float"):
        msg = "must be a whole number"
    return path, f"{msg} (got {short_value(value)})"


def _join_path(loc: tuple, extra: str = "") -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not re.fullmatch(r"[A-Za-z_][\w-]*", str(part)):  # an odd key a user typed: quote it
            out += f"[{str(part)!r}]"
        else:
            out += f".{part}" if out else str(part)
    if extra:
        out += extra if extra.startswith("[") or not out else f".{extra}"
    return out


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The schema model a location points into, for listing its valid keys."""
    current: Any = SweepConfig
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel) and isinstance(part, str):
            field = current.model_fields.get(part)
            if field is None:
                return None
            current = field.annotation
            # an optional section (`network: NetworkConfig | None`), or search.seed's range: its model
            models = [_bare(a) for a in get_args(_bare(current)) if isinstance(_bare(a), type)
                      and issubclass(_bare(a), BaseModel)]
            if get_origin(current) is not list and len(models) == 1:
                current = models[0]
        elif isinstance(part, int) and get_origin(current) is list:
            current = get_args(current)[0]
        else:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _bare(annotation: Any) -> Any:
    """The type inside ``Annotated[type, ...]``."""
    return get_args(annotation)[0] if get_origin(annotation) is Annotated else annotation
