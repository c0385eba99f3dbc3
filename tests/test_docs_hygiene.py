"""The docs name what exists: every repository path and every ``module.function`` that README.md
and docs/*.md put in backticks resolves. Docs drifted where nothing checked them (a renamed
function, a deleted bench still named as current); this reads them the way a newcomer follows them.

What counts, in inline backticks (fenced code blocks are examples, not references):

* a path: ends in a file extension or ``/``, or starts at a top-level folder of the repository.
  It resolves at the repository root, or under service/ (architecture.md's layout names modules
  from there), or, for a bare file name, as any repository file of that name or a name the code
  writes (an artifact such as transport.json, a bench's output). Absolute paths, ~, URLs and
  placeholders (``<name>``, globs) are the user's machine, not the repository. A path under a
  folder .gitignore lists (bench/results/, results/) is output.
* a dotted name starting with hooks., service. or bench. (call parentheses dropped), or
  ``package.module:function`` of those: the module's file exists and defines the name (read
  with ``ast``: nothing is imported or run), following re-exports such as ``hooks.build``.

A line that says what it names was deleted or removed names history, and is not checked.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE_DIRS = ("hooks", "service", "bench", "scripts", "docker", "examples", "tests")
PACKAGES = ("hooks", "service", "bench")
FILE = re.compile(r"\.(py|ya?ml|json|md|sh|toml|txt|j2|csv|png|html|Dockerfile)$")
# Named on purpose although absent, each with why.
ABSENT_ON_PURPOSE = {
    "hooks/clipped.py": "docs/hooks.md's 'Adding a hook' worked example: the file the reader writes",
}


def _inline_code(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every inline code span outside fenced blocks."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            found += [(number, m.group(1).strip()) for m in re.finditer(r"`([^`\n]+)`", line)]
    return found


def _is_path(token: str) -> bool:
    if re.search(r"://|[<>*{}\s()\[\]=,]|^[/~.]", token) or not re.fullmatch(r"[\w./:#-]+", token):
        return False
    top = {p.name for p in ROOT.iterdir()}
    return bool(FILE.search(token) or token.endswith("/") or token.split("/")[0] in top and "/" in token)


@lru_cache(maxsize=1)
def _repo_files() -> tuple[set[str], str]:
    """(the repository's file names, the code's text): what a bare file name may resolve to."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    code = "\n".join((ROOT / f).read_text(errors="replace") for f in files
                     if f.split("/")[0] in CODE_DIRS and f.endswith(".py") and f.split("/")[0] != "tests")
    return {Path(f).name for f in files}, code


def _ignored(path: str) -> bool:
    """Under a folder .gitignore lists (asked as a folder too: ``bench/results/`` matches only those)."""
    return any(subprocess.run(["git", "check-ignore", "-q", "--no-index", p], cwd=ROOT).returncode == 0
               for p in (path, path.rstrip("/") + "/"))


def _path_exists(token: str) -> bool:
    path = token.split("#")[0].split("::")[0]  # an anchor, a pytest node id
    if (ROOT / path).exists() or (ROOT / "service" / path).exists():
        return True
    if "/" not in path.rstrip("/"):
        names, code = _repo_files()
        return path in names or path in code or (Path(sysconfig.get_paths()["stdlib"]) / path).exists()
    site = Path(sysconfig.get_paths()["purelib"])  # a file of a library the docs point into (Ray's)
    return _ignored(path) or any(site.glob(f"*/{path}"))


def _module_file(parts: list[str]) -> tuple[Path, list[str]] | None:
    """The longest prefix of ``parts`` that is a module of the repository, and the names after it."""
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        for file in (base / "__init__.py", base.with_suffix(".py")):
            if file.is_file():
                return file, parts[i:]
    return None


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


def resolves(dotted: str) -> bool:
    """Does ``hooks.cost.hook_collectives`` (or ``pkg.module:function``) name something defined?"""
    found = _module_file(dotted.replace(":", ".").split("."))
    if found is None:
        return False
    file, names = found
    if not names:
        return True
    node = _defines(list(_top_level(ast.parse(file.read_text()))), names[0])
    if isinstance(node, ast.ImportFrom):  # a re-export: follow it to where it is defined
        alias = next(a for a in node.names if (a.asname or a.name) == names[0])
        package = ".".join(file.relative_to(ROOT).with_suffix("").parts[:-1] if file.name != "__init__.py"
                           else file.relative_to(ROOT).parent.parts)
        module = node.module or ""
        if node.level:
            module = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([module] if module else []))
        return resolves(".".join([module, alias.name, *names[1:]]))
    if isinstance(node, ast.ClassDef) and len(names) > 1:  # a method or class attribute
        return _defines(node.body, names[1]) is not None
    return node is not None and (len(names) == 1 or isinstance(node, ast.Import))


def _references():
    """(doc, line number, code span) of every reference, but on a line that says what it names was
    deleted or removed (history, on purpose)."""
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        for line_no, token in _inline_code(doc.read_text()):
            if not re.search(r"\b(deleted|removed)\b", lines[line_no - 1]):
                yield doc, line_no, token


def test_every_path_a_doc_names_exists():
    missing = []
    for doc, line_no, token in _references():
        if not _is_path(token) or token in ABSENT_ON_PURPOSE:
            continue
        if not _path_exists(token):
            missing.append(f"{doc.relative_to(ROOT)}:{line_no} `{token}`")
    assert not missing, "paths the docs name that do not exist:\n" + "\n".join(missing)


def test_every_module_function_a_doc_names_exists():
    missing = []
    for doc, line_no, token in _references():
        name = re.sub(r"\(.*$", "", token)
        if not re.fullmatch(rf"({'|'.join(PACKAGES)})(\.\w+)+(:\w+)?", name) or FILE.search(name):
            continue
        if not resolves(name):
            missing.append(f"{doc.relative_to(ROOT)}:{line_no} `{token}`")
    assert not missing, "names the docs give that the code does not define:\n" + "\n".join(missing)


def test_the_checks_catch_a_planted_drift():
    assert resolves("hooks.build") and resolves("service.step_model.price.price_cell")
    assert resolves("service.step_model.trial.TrialTimeline.price") and resolves("hooks.cost.DEFAULT_LATENCY_S")
    assert not resolves("hooks.cost.no_such_function") and not resolves("service.no_such_module.f")
    assert not resolves("service.step_model.trial.TrialTimeline.no_such_method")
    assert _is_path("bench/network.py") and not _path_exists("bench/network.py")
    assert not _is_path("fp16/bf16_compress") and not _is_path("~/.cache/x") and not _is_path("s3://B/P")
    assert _path_exists("transport.json") and _path_exists("train/ray_entry.py") and sys.version_info >= (3, 10)
