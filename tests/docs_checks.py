"""The docs hygiene checks (tests/test_docs_hygiene.py runs them): what README.md and docs/*.md
say must be true of the tree they sit in. Each check takes one markdown file and the repository
root whose code it is checked against, and returns its problems as ``doc:line: what`` lines.

* commands: every ``python -m service...`` (``.venv/bin/python``, ``python3`` too) and every
  ``make TARGET`` in a shell fence (or an untyped one, or an inline code span) parses: the
  module's own ``main`` is called with the doc's argv and stopped right after argparse parsed it
  (a renamed or removed flag fails, nothing starts); a parsed ``config`` is then loaded and its
  trials expanded, as ``--dry-run`` does. ``make X`` must be a Makefile target. A repository
  script (``python bench/overhead.py --rounds 1``) must exist and, where it has a guarded
  ``main``, parse the same way; ``python -m pytest FILE`` must name existing files.
* yaml: every ```yaml block is a sweep config that loads, or says it is a fragment of one and
  loads deep-merged into it (see FRAGMENT). A Kubernetes manifest (``apiVersion`` and ``kind``
  in every document) is not a sweep config and is skipped.
* test citations: every ``tests/<file>.py::name`` (``::Class::method``, ``[param-id]``) is a
  def or class of that file.
* history: no run log in a user's guide (dates, clock times, sessions, stops, issue numbers,
  commit hashes, who ran what): see HISTORY.
* paths and names: every path and ``package.module.name`` in inline backticks exists.

Run over another checkout: ``python tests/docs_checks.py /work/wt-docs`` (its code is imported
from there; a second root checks the first's docs against that tree's code), every problem
grouped by check and document.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import importlib
import importlib.util
import io
import re
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def docs(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _where(doc: Path, root: Path, line: int) -> str:
    try:
        name = doc.relative_to(root)
    except ValueError:
        name = doc
    return f"{name}:{line}"


# --- markdown: fenced blocks and inline code ------------------------------------------------

FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")


@dataclass(frozen=True)
class Block:
    lang: str
    line: int  # the line number of the block's first content line
    lines: list[str]
    before: str  # the nearest non-blank line above the opening fence


def blocks(text: str) -> list[Block]:
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, start = m.group(1), i + 1
        end = next((j for j in range(start, len(lines))
                    if lines[j].strip().startswith(fence) and not lines[j].strip().lstrip(fence[0])), len(lines))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        out.append(Block(m.group(2).lower(), start + 1, lines[start:end], before.strip()))
        i = end + 1
    return out


def inline_code(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every inline code span outside fenced blocks."""
    found, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m and (fence is None or line.strip().startswith(fence) and not line.strip().lstrip(fence[0])):
            fence = m.group(1) if fence is None else None
            continue
        if fence is None:
            found += [(number, m.group(1).strip()) for m in re.finditer(r"`([^`\n]+)`", line)]
    return found


# --- commands ---------------------------------------------------------------------------------

SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
# Untyped fences hold commands and trees alike: there only a line that starts with a command is one.
COMMAND_LANGS = SHELL_LANGS | {""}
PYTHONS = re.compile(r"^(?:\S*/)?python3?(?:\.\d+)?$")
PREFIXES = {"$", "sudo", "env", "time", "nohup", "exec"}
# Skipped, not checked: the user fills these in (a `<run id>`, an elided `...` or `…`).
PLACEHOLDER_TEXT = re.compile(r"<\w[^<>\n]*>")  # `<run id>`; not `< file`, `<<EOF`
PLACEHOLDER = re.compile(r"@PLACEHOLDER@|^\.\.\.$|…")
# A config given as its argument's name (`python -m service.sweep CONFIG`) parses; it is not loaded.
NAMED_ARGUMENT = re.compile(r"[A-Z][A-Z_]*")


def _strip_comment(line: str) -> str:
    """The line without its shell comment: a ``#`` at a word's start, outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def shell_lines(block: Block) -> list[tuple[int, str]]:
    """(line number, logical line) of a shell block: continuations joined, comments and
    here-document bodies dropped."""
    out, pending, start, heredoc = [], "", 0, None
    for offset, raw in enumerate(block.lines):
        if heredoc:
            heredoc = None if raw.strip() == heredoc else heredoc
            continue
        line = _strip_comment(raw).rstrip()
        if not pending:
            start = block.line + offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        m = re.search(r"<<-?\s*['\"]?(\w+)", pending)
        heredoc = m.group(1) if m else None
        if pending.strip():
            out.append((start, pending.strip()))
        pending = ""
    return out


def _segments(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at ``;``, ``&&``, ``||``, ``|``, ``&``), each
    cut at its first redirection; [] where the line does not tokenise (an open quote)."""
    line = PLACEHOLDER_TEXT.sub("@PLACEHOLDER@", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, ""
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    out, current = [], []
    for token in tokens + [";"]:
        if token and set(token) <= set(";&|"):
            cut = next((i for i, t in enumerate(current) if re.match(r"^\d?[<>]", t)), len(current))
            if current[:cut]:
                out.append(current[:cut])
            current = []
        else:
            current.append(token)
    return out


@dataclass(frozen=True)
class Command:
    kind: str  # "module" (python -m service...), "script" (python bench/x.py), "pytest" or "make"
    name: str  # the module, the script's path, "pytest" or "make"
    argv: list[str]


def command(tokens: list[str], anywhere: bool) -> Command | None:
    """The checked command ``tokens`` run, if any. ``anywhere``: also one that another command
    runs (``ray job submit ... -- python -m service.sweep X``, ``docker compose run S python ...``)."""
    i = 0
    while i < len(tokens) and (tokens[i] in PREFIXES or re.fullmatch(r"\w+=\S*", tokens[i])
                               or i and tokens[i - 1] == "sudo" and tokens[i].startswith("-")):
        i += 1
    tokens = tokens[i:]
    if tokens[:1] == ["make"]:
        return Command("make", "make", tokens[1:])
    starts = range(len(tokens)) if anywhere else range(min(1, len(tokens)))
    for i in starts:
        if not PYTHONS.match(tokens[i]) or len(tokens) < i + 2:
            continue
        if tokens[i + 1] == "-m" and len(tokens) > i + 2 and re.fullmatch(r"service(\.\w+)*", tokens[i + 2]):
            return Command("module", tokens[i + 2], tokens[i + 3:])
        if tokens[i + 1:i + 3] == ["-m", "pytest"]:
            return Command("pytest", "pytest", tokens[i + 3:])
        if re.fullmatch(r"[\w-]+(/[\w.-]+)*\.py", tokens[i + 1]):  # a script of the repository
            return Command("script", tokens[i + 1], tokens[i + 2:])
    return None


def commands(text: str) -> list[tuple[int, Command]]:
    """(line number, command) of every checked command of a markdown text: in shell and untyped
    fences, and inline code spans that are a whole command with its arguments."""
    found = []
    for block in blocks(text):
        if block.lang in COMMAND_LANGS:
            for number, line in shell_lines(block):
                found += [(number, c) for tokens in _segments(line)
                          if (c := command(tokens, anywhere=block.lang in SHELL_LANGS))]
    for number, span in inline_code(text):
        segments = _segments(span)
        c = command(segments[0], anywhere=False) if len(segments) == 1 else None
        if c and (c.argv or c.kind == "make"):  # `python -m service.probe` alone names the program
            found.append((number, c))
    return found


@lru_cache(maxsize=None)
def make_targets(root: Path) -> frozenset[str]:
    makefile = root / "Makefile"
    if not makefile.is_file():
        return frozenset()
    targets = set()
    for line in makefile.read_text().splitlines():
        m = re.match(r"^([\w.%/-]+(?:[ \t]+[\w.%/-]+)*)[ \t]*::?(?!=)", line)
        if m:
            targets |= set(m.group(1).split()) - {".PHONY", ".DEFAULT_GOAL", ".SUFFIXES"}
    return frozenset(targets)


def _make_problem(argv: list[str], root: Path) -> str | None:
    if any(a in ("-C", "-f", "--directory", "--file") or a.startswith(("-C", "-f")) for a in argv):
        return None  # another directory's or file's targets: not this Makefile's
    targets = [a for a in argv if not a.startswith("-") and "=" not in a]
    missing = [t for t in targets if t not in make_targets(root)]
    if not (root / "Makefile").is_file():
        return "no Makefile"
    return f"no Makefile target {', '.join(missing)}" if missing else None


class _Parsed(Exception):
    def __init__(self, namespace):
        self.namespace = namespace


@contextlib.contextmanager
def _stop_after_parsing():
    """Within it, the first top-level ``parse_args``/``parse_known_args`` raises _Parsed with its
    namespace once argparse accepted the argv (SystemExit as usual when it did not)."""
    parse_args, parse_known = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    depth = [0]

    def stopping(original):
        def wrapped(self, *args, **kwargs):
            depth[0] += 1
            try:
                result = original(self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:  # the CLI's own call, not argparse's inner one (subparsers, parse_args)
                raise _Parsed(result)
            return result
        return wrapped

    argparse.ArgumentParser.parse_args = stopping(parse_args)
    argparse.ArgumentParser.parse_known_args = stopping(parse_known)
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = parse_args, parse_known


def script_entry_point(path: Path):
    """A script's ``main``, called as ``python path ARGS`` would (``sys.argv`` set where it takes
    no argv): only where the file defines one and runs it behind ``if __name__ == "__main__"``,
    so importing it starts nothing. None: no such main."""
    tree = ast.parse(path.read_text())
    main = _defines(tree.body, "main")
    guarded = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
    if not isinstance(main, ast.FunctionDef) or not guarded:
        return None
    spec = importlib.util.spec_from_file_location(f"_docs_script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)

    def as_run(argv):  # its folder first on sys.path, as `python path` has it (bench's `import _common`)
        saved = sys.argv, list(sys.path)
        sys.argv, sys.path[:0] = [str(path), *argv], [str(path.parent)]
        try:
            spec.loader.exec_module(module)
            return module.main(argv) if main.args.args else module.main()
        finally:
            sys.argv, sys.path[:] = saved
    return as_run


def entry_point(module: str):
    """The ``main`` that ``python -m module`` calls: the module's own, or the one its
    ``__main__.py`` (or the module, behind ``if __name__ == "__main__"``) imports. Found by
    reading the file: nothing that runs on import runs. None: no such module or no main."""
    try:
        spec = importlib.util.find_spec(module)
    except ImportError:
        return None
    if spec is None or spec.origin is None:
        return None
    file = Path(spec.origin)
    if spec.submodule_search_locations is not None:
        file = file.parent / "__main__.py"
        if not file.is_file():
            return None
    else:
        for node in ast.parse(file.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name == "main":
                return importlib.import_module(module).main
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == "main" for a in node.names):
            return importlib.import_module(node.module).main
    return None


def parse_command(module: str, argv: list[str], main=None) -> tuple[argparse.Namespace | None, str | None]:
    """(what the module's CLI (or ``main``) parsed from argv, None) or (None, why it does not
    parse); None, None: it printed help or its version and exits 0."""
    main = main or entry_point(module)
    if main is None:
        return None, f"no module {module} with a main to run"
    err = io.StringIO()
    with _stop_after_parsing(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except _Parsed as parsed:
            return parsed.namespace, None
        except SystemExit as exc:
            if exc.code in (0, None):
                return None, None
            lines = [line for line in err.getvalue().splitlines() if line.strip()]
            return None, lines[-1] if lines else f"exits {exc.code}"
    return None, f"{module}'s main returned without parsing its arguments"


def config_problems(arg: str, root: Path) -> list[str]:
    """Why the config ``arg`` (a path from the repository root, or a preset's name) does not load
    and expand into trials, as ``--dry-run`` would: [] where it does."""
    from service.config import ConfigError, load_config

    path = root / arg
    with contextlib.redirect_stderr(io.StringIO()):  # "note: using the preset ..."
        try:
            cfg, _ = load_config(path if path.exists() else arg)
            cfg.trials()
        except ConfigError as exc:
            return exc.lines()
    return []


def _script_problems(cmd: Command, root: Path) -> list[str]:
    """pytest: the test files it names exist. A script: it exists, and where it has a guarded
    ``main`` its argparse parser accepts the argv (a bench's flags). Only paths in a folder of
    the repository (bench/, tests/, ...) are the repository's: ``python my_train.py`` is the user's."""
    def ours(path: str) -> bool:
        return "/" in path and (root / path.split("/")[0]).is_dir()

    if cmd.kind == "pytest":
        files = [a.split("::")[0] for a in cmd.argv if a.split("::")[0].endswith(".py")]
        return [f"no such file {f}" for f in files if ours(f) and not (root / f).is_file()]
    path = root / cmd.name
    if not ours(cmd.name):
        return []
    if not path.is_file():
        return [f"no such script {cmd.name}"]
    main = script_entry_point(path)
    if main is None:
        return []
    _, why = parse_command(cmd.name, cmd.argv, main)
    return [why] if why else []


def check_commands(doc: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for number, cmd in commands(doc.read_text()):
        where = _where(doc, root, number)
        shown = shlex.join({"module": ["python", "-m"], "pytest": ["python", "-m"], "script": ["python"]}
                           .get(cmd.kind, []) + [cmd.name, *cmd.argv])
        if any(PLACEHOLDER.search(a) for a in cmd.argv):
            continue  # the user fills it in
        if cmd.kind == "make":
            why = _make_problem(cmd.argv, root)
            problems += [f"{where}: `{shown}`: {why}"] if why else []
            continue
        if cmd.kind in ("script", "pytest"):
            problems += [f"{where}: `{shown}`: {why}" for why in _script_problems(cmd, root)]
            continue
        namespace, why = parse_command(cmd.name, cmd.argv)
        if why:
            problems.append(f"{where}: `{shown}`: {why}")
        elif isinstance(config := getattr(namespace, "config", None), str) and not NAMED_ARGUMENT.fullmatch(config):
            problems += [f"{where}: `{shown}`: config: {line}" for line in config_problems(config, root)]
    return problems


# --- YAML blocks ------------------------------------------------------------------------------

# A block that is part of a config says which, on the line above its fence (invisible on the
# rendered page) or as its own first line; it is checked deep-merged into that config (mappings
# merged key by key, anything else replaced):
#     <!-- fragment: tune_configs/quant.yaml -->         # fragment of tune_configs/quant.yaml
FRAGMENT_ABOVE = re.compile(r"^<!--\s*fragment(?:\s+of)?:?\s+(\S+?)\s*-->$")
FRAGMENT_FIRST = re.compile(r"^#\s*fragment(?:\s+of)?:?\s+(\S+)\s*$")
YAML_LANGS = {"yaml", "yml"}


def fragment_of(block: Block) -> str | None:
    m = FRAGMENT_ABOVE.match(block.before) or FRAGMENT_FIRST.match(block.lines[0].strip() if block.lines else "")
    return m.group(1) if m else None


def deep_merge(base, over):
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: deep_merge(base[k], v) if k in base else v for k, v in over.items()}}
    return over


def _is_kubernetes(text: str) -> bool:
    import yaml

    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError:
        return False
    return bool(documents) and all(isinstance(d, dict) and {"apiVersion", "kind"} <= d.keys() for d in documents)


def yaml_problems(text: str, fragment: str | None, root: Path) -> list[str]:
    """Why a YAML block (of a config, or a fragment of the config ``fragment`` names) does not
    load through the config loader and expand into trials; [] where it does."""
    import yaml

    from service.config import ConfigError
    from service.config.loading import _parse_yaml, resolve_config_path

    try:
        if fragment is not None:
            base = root / fragment
            with contextlib.redirect_stderr(io.StringIO()):  # "note: using the preset ..."
                base = base if base.is_file() else resolve_config_path(fragment)
            merged = deep_merge(_parse_yaml(base.read_text(), str(base)), _parse_yaml(text, "the block"))
            text = yaml.safe_dump(merged, sort_keys=False)
    except ConfigError as exc:
        return exc.lines()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "block.yaml"
        path.write_text(text)
        return [line.replace(str(path), "the block") for line in config_problems(str(path), root)]


def check_yaml(doc: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for block in blocks(doc.read_text()):
        if block.lang not in YAML_LANGS:
            continue
        text, fragment = "\n".join(block.lines) + "\n", fragment_of(block)
        if fragment is None and _is_kubernetes(text):
            continue  # a Kubernetes manifest, not a sweep config
        found = yaml_problems(text, fragment, root)
        if found:
            what = (f"merged into {fragment}" if fragment else "(a config)" if re.search(r"(?m)^name:", text) else
                    "(a fragment? say of which config: `<!-- fragment: tune_configs/NAME.yaml -->` above its fence)")
            problems.append(f"{_where(doc, root, block.line)}: yaml block {what}: {'; '.join(found)}")
    return problems


# --- cited tests ------------------------------------------------------------------------------

# tests/test_x.py::test_y, tests/test_x.py::TestZ::test_y, with a parametrize id [...] or not
TEST_CITATION = re.compile(r"(?<![\w/.-])(tests/[\w/]+\.py)((?:::\w+)+)(?:\[[^\]\n]*\])?")


def _top_level(tree: ast.Module):
    """The module's top-level statements, those under if/try included (TYPE_CHECKING, fallbacks)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.If, ast.Try)):
            todo += node.body + node.orelse + getattr(node, "finalbody", []) + \
                [s for h in getattr(node, "handlers", []) for s in h.body]
        else:
            yield node


def _defines(body, name: str):
    """The statement of ``body`` that binds ``name`` (None: none does)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            return node
    return None


def cited_test_exists(file: Path, names: list[str]) -> bool:
    """Does ``file`` define ``names[0]`` (a test function or class) and, inside that class, the rest?"""
    if not file.is_file():
        return False
    body = list(_top_level(ast.parse(file.read_text())))
    for name in names:
        node = _defines(body, name)
        if node is None:
            return False
        body = node.body if isinstance(node, ast.ClassDef) else []
    return True




def _missing_test(file: Path, name: str) -> str:
    if not file.is_file():
        return "no such file"
    defined = [n.name for n in ast.walk(ast.parse(file.read_text()))
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    near = difflib.get_close_matches(name, defined, n=1, cutoff=0.6)
    return "no such test" + (f" (did you mean {near[0]}?)" if near else "")


def check_test_citations(doc: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        for m in TEST_CITATION.finditer(line):
            file, names = root / m.group(1), m.group(2).split("::")[1:]
            if not cited_test_exists(file, names):
                problems.append(f"{_where(doc, root, number)}: `{m.group(0)}`: {_missing_test(file, names[-1])}")
    return problems


# --- history prose ----------------------------------------------------------------------------

_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
          r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
# What a user's guide does not say: when something was run, by whom, in which session, under
# which issue or commit. Each pattern is the narrowest form the docs used, so a user doc's own
# words pass: a date inside a file name or anchor (results_2026-12-05.json), a version (2.60.0),
# a Ray "session directory", "the next time you run it", "stop 2 workers", an upstream
# project's issue ("Ray issue 1234"), a hex colour (#1f77b4).
HISTORY = {
    "a date": re.compile(r"(?<![\w/.:-])20\d\d-[01]\d-[0-3]\d(?![\w/-]|\.\w)"
                         rf"|\b{_MONTH}\.? (?:\d{{1,2}}(?:st|nd|rd|th)?(?:,? 20\d\d)?|20\d\d)\b"),
    "a clock time": re.compile(r"(?<![\w:])\d{1,2}:\d\d(?::\d\d)?\s*(?:[–-]\s*\d{1,2}:\d\d\s*)?UTC\b"
                               r"|(?<![\w:])\d{1,2}:\d\d\s*[–-]\s*\d{1,2}:\d\d(?![\w:])"),
    "a session": re.compile(r"\b(?:this|that|next|earlier|previous|last|later|other|another|same|one)(?:'s)?"
                            r"\s+sessions?(?:'s)?\b|\bthe session(?:'s)?\b(?!\s+(?:dir|directory|folder|name|id|logs?)\b)",
                            re.IGNORECASE),
    "next time": re.compile(r"\bnext time\b(?!\s+(?:you|your|a|an|the|it|that|this|they|someone|one)\b)",
                            re.IGNORECASE),
    "a stop number": re.compile(r"\b[Ss]tops? \d+\b(?!\s+(?:ranks?|workers?|trials?|processes|steps?|s|ms|min"
                                r"|seconds?|minutes?|nodes?|hosts?|jobs?|runs?|times?)\b)"),
    "an issue number": re.compile(r"(?<!\w)(?<!Ray )(?<!PyTorch )(?<!torch )(?<!MLflow )(?<!upstream )"
                                  r"[Ii]ssues? #?\d+\b"),
    "a commit hash": re.compile(r"(?<![\w/.:#-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}(?![\w/-])"),
    "who ran it": re.compile(r"\b(?:another|other|the other|the)\s+engineer(?:s|'s|s')?\b", re.IGNORECASE),
}
# Fenced example output (```text) may show the timestamps a program prints.
OUTPUT_LANGS = {"text", "log", "output"}


def history(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, the words) of every history phrase of a markdown text."""
    output_lines = {b.line + i for b in blocks(text) if b.lang in OUTPUT_LANGS for i in range(len(b.lines))}
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in HISTORY.items():
            if number in output_lines and what in ("a date", "a clock time"):
                continue
            found += [(number, what, m.group(0)) for m in pattern.finditer(line)]
    return found


def check_history(doc: Path, root: Path = ROOT) -> list[str]:
    return [f"{_where(doc, root, number)}: {what}: {words!r} (git keeps the history)"
            for number, what, words in history(doc.read_text())]


# --- paths and names in inline code -----------------------------------------------------------

CODE_DIRS = ("hooks", "service", "bench", "scripts", "docker", "examples")
PACKAGES = ("hooks", "service", "bench")
FILE = re.compile(r"\.(py|ya?ml|json|md|sh|toml|txt|j2|csv|png|html|Dockerfile)$")
# Named on purpose although absent, each with why.
ABSENT_ON_PURPOSE = {
    "hooks/clipped.py": "docs/hooks.md's 'Adding a hook' worked example: the file the reader writes",
}


def is_path(token: str, root: Path = ROOT) -> bool:
    """A path: ends in a file extension or ``/``, or starts at a top-level folder of the
    repository. Absolute paths, ~, URLs and placeholders (``<name>``, globs) are the user's
    machine, not the repository."""
    if re.search(r"://|[<>*{}\s()\[\]=,]|^[/~.]", token) or not re.fullmatch(r"[\w./:#-]+", token):
        return False
    top = {p.name for p in root.iterdir()}
    return bool(FILE.search(token) or token.endswith("/") or token.split("/")[0] in top and "/" in token)


@lru_cache(maxsize=None)
def repo_files(root: Path) -> frozenset[str]:
    return frozenset(subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                                    check=True).stdout.split())


@lru_cache(maxsize=None)
def written_names(root: Path) -> frozenset[str]:
    """The file names the code spells as a whole string literal (``"transport.json"``,
    ``"results/summary.csv"`` -> summary.csv) or a bench writes (``write_json("overhead", ...)``):
    the artifacts a bare file name in the docs may be. A name that only appears in a comment, a
    docstring or inside a longer string is not one."""
    names = set()
    for file in repo_files(root):
        if file.split("/")[0] in CODE_DIRS and file.endswith(".py"):
            for node in ast.walk(ast.parse((root / file).read_text(errors="replace"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and FILE.search(node.value) \
                        and re.fullmatch(r"[\w./-]+", node.value):
                    names.add(node.value.rsplit("/", 1)[-1])
                elif _bench_output(node):
                    names.add(f"{node.args[0].value}.json")
    return frozenset(names)


def _bench_output(node: ast.AST) -> bool:
    """``write_json("overhead", ...)``: a bench's bench/results/overhead.json (bench/_common.py)."""
    return (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "write_json"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


def _ignored(path: str, root: Path) -> bool:
    """Under a folder .gitignore lists (asked as a folder too: ``bench/results/`` matches only those)."""
    return any(subprocess.run(["git", "check-ignore", "-q", "--no-index", p], cwd=root).returncode == 0
               for p in (path, path.rstrip("/") + "/"))


def path_exists(token: str, root: Path = ROOT) -> bool:
    """At the repository root, or under service/ (architecture.md's layout names modules from
    there); a bare file name: a repository file's name, an artifact the code writes, or a file of
    Python's standard library; a path under a folder .gitignore lists (bench/results/) is output;
    else a file of an installed library the docs point into (Ray's)."""
    path = token.split("#")[0].split("::")[0]  # an anchor, a pytest node id
    if (root / path).exists() or (root / "service" / path).exists():
        return True
    if "/" not in path.rstrip("/"):
        return (path in {Path(f).name for f in repo_files(root)} or path in written_names(root)
                or (Path(sysconfig.get_paths()["stdlib"]) / path).exists())
    site = Path(sysconfig.get_paths()["purelib"])
    return _ignored(path, root) or any(site.glob(f"*/{path}"))


def _module_file(parts: list[str], root: Path) -> tuple[Path, list[str]] | None:
    """The longest prefix of ``parts`` that is a module of the repository, and the names after it."""
    for i in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:i])
        for file in (base / "__init__.py", base.with_suffix(".py")):
            if file.is_file():
                return file, parts[i:]
    return None


def resolves(dotted: str, root: Path = ROOT) -> bool:
    """Does ``hooks.cost.hook_collectives`` (or ``pkg.module:function``) name something defined?
    Read with ``ast`` (nothing imported), following re-exports such as ``hooks.build``."""
    found = _module_file(dotted.replace(":", ".").split("."), root)
    if found is None:
        return False
    file, names = found
    if not names:
        return True
    node = _defines(list(_top_level(ast.parse(file.read_text()))), names[0])
    if isinstance(node, ast.ImportFrom):  # a re-export: follow it to where it is defined
        alias = next(a for a in node.names if (a.asname or a.name) == names[0])
        package = ".".join(file.relative_to(root).with_suffix("").parts[:-1] if file.name != "__init__.py"
                           else file.relative_to(root).parent.parts)
        module = node.module or ""
        if node.level:
            module = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([module] if module else []))
        return resolves(".".join([module, alias.name, *names[1:]]), root)
    if isinstance(node, ast.ClassDef) and len(names) > 1:  # a method or class attribute
        return _defines(node.body, names[1]) is not None
    return node is not None and (len(names) == 1 or isinstance(node, ast.Import))


def check_paths(doc: Path, root: Path = ROOT) -> list[str]:
    return [f"{_where(doc, root, number)}: `{token}`: no such path"
            for number, token in inline_code(doc.read_text())
            if is_path(token, root) and token not in ABSENT_ON_PURPOSE and not path_exists(token, root)]


def check_names(doc: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for number, token in inline_code(doc.read_text()):
        name = re.sub(r"\(.*$", "", token)
        if re.fullmatch(rf"({'|'.join(PACKAGES)})(\.\w+)+(:\w+)?", name) and not FILE.search(name) \
                and not resolves(name, root):
            problems.append(f"{_where(doc, root, number)}: `{token}`: not defined by the code")
    return problems


# --- all of them ------------------------------------------------------------------------------

CHECKS = {
    "commands": check_commands,
    "yaml blocks": check_yaml,
    "cited tests": check_test_citations,
    "history prose": check_history,
    "paths": check_paths,
    "names": check_names,
}


def all_problems(root: Path = ROOT, code: Path | None = None) -> dict[str, list[str]]:
    """Every check over README.md and docs/*.md of ``root``, against the code of ``code``
    (default: the same tree): {check: problems}, each ``doc:line: what``."""
    code = code or root
    return {name: [p.replace(f"{root}/", "", 1) for doc in docs(root) for p in check(doc, code)]
            for name, check in CHECKS.items()}


def main(argv: list[str]) -> int:
    """``python tests/docs_checks.py [DOCS_ROOT [CODE_ROOT]]``: a docs branch's docs can be
    checked against the code they are to be merged with."""
    root = Path(argv[0]).resolve() if argv else ROOT
    code = Path(argv[1]).resolve() if len(argv) > 1 else root
    sys.path.insert(0, str(code))  # that tree's code: its CLIs and config loader
    found = all_problems(root, code)
    for name, problems in found.items():
        print(f"== {name}: {len(problems)}")
        for p in problems:
            print(f"  {p}")
    return 1 if any(found.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
