"""Loading: path or preset name -> YAML (a hardened safe loader) -> SweepConfig, with every
failure as one ConfigError line."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from service.config.errors import ConfigError, exception_text, type_name
from service.config.limits import MAX_FILE_BYTES, MAX_YAML_NODES
from service.config.problems import all_problems
from service.config.schema import SweepConfig

PRESETS_DIR = Path(__file__).resolve().parent.parent.parent / "tune_configs"


def list_presets() -> list[str]:
    """Preset names (file stems in tune_configs/), sorted."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def resolve_config_path(arg: str | Path) -> Path:
    """An existing file, or a preset named by file name (`configs/quant.yaml`, `quant.yaml`, `quant`)."""
    text = str(arg)
    if not text.strip():
        raise ConfigError(f"no config given; give a YAML file or a preset: {', '.join(list_presets())}")
    path = Path(text).expanduser()
    if "\x00" not in text and path.exists():
        return path.resolve()
    stem = path.stem if path.suffix in (".yaml", ".yml") else path.name
    preset = PRESETS_DIR / f"{stem}.yaml"
    if stem and "\x00" not in text and preset.is_file():
        print(f"note: using the preset {display_path(preset)} ({text} is not a file here)", file=sys.stderr)
        return preset.resolve()
    raise ConfigError(f"no such file, and not a preset name; presets: {', '.join(list_presets())}", source=text)


def load_config(arg: str | Path) -> tuple[SweepConfig, Path]:
    """Read, parse and validate a sweep config. Raises ConfigError (one line) and nothing else."""
    try:
        return _load(arg)
    except ConfigError:
        raise
    except Exception as exc:  # a bug of ours must still reach the user as one line, not a traceback
        raise ConfigError(f"could not load the config ({exception_text(exc)})", source=str(arg)) from exc


def _load(arg: str | Path) -> tuple[SweepConfig, Path]:
    path = resolve_config_path(arg)
    shown = display_path(path)
    if path.is_dir():
        raise ConfigError("is a directory; give a YAML file", source=shown)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read it ({exc.strerror or exc})", source=shown) from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"is {len(data)} bytes; a config is at most {MAX_FILE_BYTES}", source=shown)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"is not UTF-8 text (byte {exc.start})", source=shown) from None
    raw = _parse_yaml(text, shown)
    if raw is None:
        raise ConfigError("is empty; a config needs at least name, workload and search", source=shown)
    if not isinstance(raw, dict):
        raise ConfigError(f"the top level must be a mapping (name:, workload:, search:, ...), "
                          f"got {type_name(raw)}", source=shown)
    try:
        cfg = SweepConfig.model_validate(raw)
    except ValidationError as exc:
        (field, problem), *more = all_problems(exc)
        raise ConfigError(problem, field=field or "(top level)", source=shown, more=more) from None
    return cfg, path


# libyaml's safe loader when PyYAML was built with it: a C parser, and it caps nesting depth
# (the pure-Python parser takes seconds to reach a RecursionError on `[[[[...`).
_SafeBase = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _SafeLoaderNoDuplicates(_SafeBase):  # type: ignore[misc, valid-type]
    """A safe loader that refuses a key given twice (plain PyYAML silently keeps the last one)."""


def _construct_mapping(loader: Any, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may be overridden: not a duplicate
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # unhashable key: let the constructor produce its usual error
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_SafeLoaderNoDuplicates.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# PyYAML follows YAML 1.1, where `1.0e6` and `1e-3` are strings (the exponent needs a sign and the
# mantissa a dot). Users write them as numbers (`lr: 1e-3`), so read them as YAML
# 1.2 does.
_SafeLoaderNoDuplicates.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                  |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def _parse_yaml(text: str, shown: str) -> Any:
    try:
        raw = yaml.load(text, Loader=_SafeLoaderNoDuplicates)  # a SafeLoader: no Python objects built
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        what = exc.problem or exc.context or "invalid YAML"
        # the constructor sees well-formed YAML it will not build (a duplicate key, a python tag)
        label = "YAML error" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax error"
        raise ConfigError(f"{label} at {where}: {what}", source=shown) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"YAML syntax error: {exc}", source=shown) from None
    except RecursionError:
        raise ConfigError("YAML nested too deeply", source=shown) from None
    if _count_nodes(raw, MAX_YAML_NODES) > MAX_YAML_NODES:
        raise ConfigError(f"expands to more than {MAX_YAML_NODES} values (YAML aliases?); "
                          "a config is a few dozen", source=shown)
    return raw


def _count_nodes(obj: Any, limit: int) -> int:
    """Values in a parsed YAML tree, aliases counted each time they are used; stops past `limit`."""
    seen, stack = 0, [obj]
    while stack and seen <= limit:
        item = stack.pop()
        seen += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return seen


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def report_section(text: str | None, shown: str = "the sweep's config"):
    """The ``report:`` section of a sweep's config text (the report reads the one the sweep ran
    with, from its parent run): its defaults where the text has none; ConfigError where it is bad."""
    from service.config.sections import RECORDED, ReportConfig

    raw = _parse_yaml(text, shown) if text else None
    section = raw.get("report") if isinstance(raw, dict) else None
    try:
        return ReportConfig.model_validate(section or {}, context={RECORDED: True})
    except ValidationError as exc:
        raise ConfigError(exception_text(exc), source=shown) from None


def plan_cell(text: str | None, report, shown: str = "the sweep's config"):
    """The cell a sweep's per-bucket plan is designed for: ``search.plan``'s (its 'cluster' being
    ``report.cluster``), else ``report.cluster`` (None: no plan is designed); and where it came
    from ('search.plan' or 'report.cluster')."""
    from pydantic import BaseModel, ConfigDict

    from service.config.sections import RECORDED, PlanRound

    class _PlanOnly(BaseModel):  # the search section's plan, its other keys left to the sweep that ran them
        model_config = ConfigDict(extra="ignore")
        plan: PlanRound | None = None

    raw = _parse_yaml(text, shown) if text else None
    search = raw.get("search") if isinstance(raw, dict) else None
    try:
        round_ = _PlanOnly.model_validate(search if isinstance(search, dict) else {}, context={RECORDED: True}).plan
    except ValidationError as exc:
        raise ConfigError(exception_text(exc), source=shown) from None
    if round_ is None:
        return report.cluster, "report.cluster"
    return (report.cluster if round_.cell == "cluster" else round_.cell), "search.plan"
