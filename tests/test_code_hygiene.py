"""Static checks of hooks/ and service/ (issue 13, item 6: dead and drifting code found by
reading). Each check is one the code once failed: a function nobody calls, a second module
that imports MLflow, a string statement that documents nothing, a fact spelled in two places."""
from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("hooks", "service")
# Where a name may be used: the code, its tests, benches, examples and the docs' scripts.
USERS = ("hooks", "service", "tests", "bench", "examples", "docs", "scripts")


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def _all_source() -> dict[Path, str]:
    return {p: p.read_text() for d in USERS for p in (ROOT / d).rglob("*.py")}


def test_only_tracking_imports_mlflow():
    offenders = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert all(o.startswith("service/tracking/") for o in offenders), offenders


def test_every_module_level_function_and_class_has_a_user():
    # each whole word counted once over every source: a name's count is that of \bname\b
    # (47 s as one regex per name over every source, inside the suite)
    words = Counter(w for text in _all_source().values() for w in re.findall(r"\w+", text))
    unused = []
    for path, tree in _modules():
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if words[node.name] <= 1:  # only its own definition
                unused.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not unused, f"defined but never used: {unused}"


def test_no_string_statement_besides_docstrings():
    """A bare string in the middle of a module is neither a docstring nor a comment."""
    stray = []
    for path, tree in _modules():
        bodies = [tree.body] + [n.body for n in ast.walk(tree)
                                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        for body in bodies:
            for stmt in body[1:]:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                        and isinstance(stmt.value.value, str):
                    stray.append(f"{path.relative_to(ROOT)}:{stmt.lineno}")
    assert not stray, stray


def test_the_parent_run_tag_is_spelled_once():
    package = ROOT / "service" / "tracking"
    spelled = sum(p.read_text().count('"mlflow.parentRunId"') for p in package.rglob("*.py"))
    assert spelled == 1 and "PARENT_TAG" in (package / "store.py").read_text()
    others = [p for p in (ROOT / "service").rglob("*.py")
              if package not in p.parents and "mlflow.parentRunId" in p.read_text()]
    assert not others, others


# Packages held to the size and layering rules (issue 25): no module over 450 lines, no function
# over 60, no import cycle between their modules (function-local imports included).
STRUCTURED = ("hooks", "service")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 450, 60


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, tree: ast.AST, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports anywhere in its body (function-local included)."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}  # `from . import x` imports module x
    return {m for m in out if m in known} - {_module_name(path)}


def _import_graph() -> dict[str, set[str]]:
    """module -> the structured modules it imports (function-local imports included). A package's
    __init__ may gather its modules; an import of a module also runs its package's __init__,
    which is not an edge back to it."""
    modules = {_module_name(p): (p, t) for p, t in _modules() if p.relative_to(ROOT).parts[0] in STRUCTURED}
    graph = {name: _imported(p, t, set(modules)) for name, (p, t) in modules.items()}
    return {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every cycle a depth-first walk of ``graph`` meets, as "a -> b -> a"."""
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                found.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def package_of(module: str) -> str:
    """The layer a module belongs to: hooks, or service's package (service.train, service.report,
    ...) or top-level module (service.text, ...)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "service" else parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto packages (:func:`package_of`), imports within one dropped."""
    out: dict[str, set[str]] = {}
    for module, deps in graph.items():
        mine = package_of(module)
        out.setdefault(mine, set()).update(package_of(d) for d in deps if package_of(d) != mine)
    return out


def test_no_import_cycle_in_the_structured_packages():
    assert not cycles(_import_graph())


def test_no_import_cycle_between_packages():
    """A cycle between packages (service.report importing service.sweep importing service.report)
    is a layer that is not one, even when no two modules import each other."""
    assert not cycles(package_graph(_import_graph()))


def test_the_cycle_checks_fail_on_a_planted_cycle():
    modules = {"service.a.x": {"service.b.y"}, "service.b.y": set(), "service.b.z": {"service.a.w"},
               "service.a.w": set(), "hooks.q": set()}
    assert not cycles(modules)  # no module cycle ...
    assert cycles(package_graph(modules)) == ["service.a -> service.b -> service.a"]  # ... but a package cycle
    modules["hooks.q"] = {"hooks.q2"}
    modules["hooks.q2"] = {"hooks.q"}
    assert cycles(modules) == ["hooks.q -> hooks.q2 -> hooks.q"]
    assert package_of("service.text") == "service.text" and package_of("hooks.state") == "hooks"


def test_modules_and_functions_fit_on_a_screen():
    too_long = []
    for path, tree in _modules():
        if path.relative_to(ROOT).parts[0] not in STRUCTURED:
            continue
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(ROOT)}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert not too_long, too_long


DRAWING_STYLES = ROOT / "service" / "report" / "hook_styles.py"


def test_no_hook_name_is_spelled_in_service_code():
    """What a hook is (chunked, 16-bit, its chunk size's name) is read from its HookSpec: a hook's
    name or its chunk-size parameter as a string literal in service/ is a second home for a
    hook fact (docstrings aside; the presets in tune_configs/ name hooks, as users do). One module
    is allowed: how the report draws each hook is a presentation fact with its one home there."""
    import hooks
    from hooks.spec import CHUNK_SIZE

    from service.config import SweepConfig

    # a config key spelled like a hook (search.plan, the plan hook) is the config's, not a hook fact
    keys = {key for field in SweepConfig.model_fields.values()
            for key in getattr(field.annotation, "model_fields", {})}
    names = (set(hooks.available()) - keys) | {CHUNK_SIZE}
    spelled = []
    for path, tree in _modules():
        if path.relative_to(ROOT).parts[0] != "service" or path == DRAWING_STYLES:
            continue
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        spelled += [f"{path.relative_to(ROOT)}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names
                    and id(n) not in docstrings]
    assert not spelled, spelled


MAX_PARAMETERS = 8


def too_many_parameters(path: str, tree: ast.AST) -> list[str]:
    """Functions of ``tree`` with more than MAX_PARAMETERS parameters (self and cls aside; *args
    and **kwargs count one each): a context object carries them instead."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            count = len(names) + (a.vararg is not None) + (a.kwarg is not None) - (names[:1] in (["self"], ["cls"]))
            if count > MAX_PARAMETERS:
                out.append(f"{path}:{node.lineno} {node.name}: {count} parameters")
    return out


def test_no_function_takes_more_than_eight_parameters():
    found = [f for path, tree in _modules() for f in too_many_parameters(str(path.relative_to(ROOT)), tree)]
    assert not found, found


def test_the_parameter_check_fails_on_a_planted_function():
    planted = ast.parse("def f(a, b, c, d, e, f, g, h, i): pass\n"
                        "class C:\n    def m(self, a, b, c, d, e, f, g, h): pass\n"
                        "def k(a, *rest, b, c, d, e, f, g, **more): pass\n")
    assert too_many_parameters("x.py", planted) == ["x.py:1 f: 9 parameters", "x.py:4 k: 9 parameters"]


# Code says why, not which issue asked for it: the issue tracker is history, a comment is read
# with the code as it is (docs may keep history where it explains a measurement).
ISSUE_REFERENCE = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)


def issue_references(path: str, text: str) -> list[str]:
    return [f"{path}:{text.count(chr(10), 0, m.start()) + 1} {m.group(0)!r}" for m in ISSUE_REFERENCE.finditer(text)]


def test_no_issue_number_in_code():
    found = [r for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
             for r in issue_references(str(p.relative_to(ROOT)), p.read_text())]
    assert not found, found


def test_the_issue_check_fails_on_a_planted_reference():
    text = '"""Doc."""\nx = 1  # the rate (issue 24, item 1)\ny = 2  # see Issue #7\nz = "issues"\n'
    assert issue_references("m.py", text) == ["m.py:2 'issue 24'", "m.py:3 'Issue #7'"]


MAX_TOP_LEVEL_MODULES = 6


def too_many_loose_modules(directory: Path) -> list[str]:
    """The modules beside the packages of ``directory``, when more than MAX_TOP_LEVEL_MODULES."""
    loose = sorted(p.name for p in directory.glob("*.py"))
    return loose if len(loose) > MAX_TOP_LEVEL_MODULES else []


def test_service_shows_its_layers_as_packages():
    """Besides its packages, service/ keeps only what several layers share (text, uris, hook
    facts, the python -m service.submit entry point): a loose module is a layer hidden."""
    assert not too_many_loose_modules(ROOT / "service")


def test_the_layout_check_fails_on_planted_loose_modules(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    for i in range(MAX_TOP_LEVEL_MODULES):
        (tmp_path / f"m{i}.py").write_text("")
    assert not too_many_loose_modules(tmp_path)
    (tmp_path / "one_more.py").write_text("")
    assert len(too_many_loose_modules(tmp_path)) == MAX_TOP_LEVEL_MODULES + 1



def test_the_answer_is_decided_below_the_report_and_the_sweep():
    """service.answer decides (the one rule, the pricing, the plan's design, answer.json); the
    report renders it and the sweep's plan round designs from it: nothing the plan round reaches
    climbs into service.report, and service.answer imports neither."""
    graph = _import_graph()
    reached, todo = set(), ["service.sweep.plan_round"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += sorted(graph.get(module, ()))
    assert not [m for m in reached if package_of(m) == "service.report"], sorted(reached)
    answer = package_graph(graph)["service.answer"]
    assert not answer & {"service.report", "service.sweep"}, answer
