"""The package's import graph, read from the source (no import, no stack): no module imports one
that imports it back, counting imports inside functions (only ``TYPE_CHECKING`` blocks aside),
and the guard's floors hold as ``trl_compat/guard/__init__.py``'s docstring states them."""

from __future__ import annotations

import ast
import pathlib

import trl_compat

import pytest

PACKAGE = pathlib.Path(trl_compat.__file__).parent
LONGEST = 300  # lines; the registry (patches/__init__.py) is the one exception
EXCEPTIONS = ("patches/__init__.py",)
# Arrows known to close a cycle, each with the change that removes it. The training log reads the
# package's __version__ from the root, which imports it: the root's version belongs a floor down.
KNOWN_CYCLE_ARROWS = {("trl_compat._helpers.training_log", "trl_compat")}


def _name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, pathlib.Path] = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, importer: str, level: int, is_package: bool) -> str | None:
    if level:
        base = importer.split(".") if is_package else importer.split(".")[:-1]
        base = base[: len(base) - (level - 1)]
        module = ".".join(base + ([module] if module else []))
    return module if module.split(".")[0] == "trl_compat" else None


def imports_of(name: str) -> set[str]:
    """The trl_compat modules ``name`` imports anywhere in its code but under ``if TYPE_CHECKING:``."""
    path = MODULES[name]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", name, node.level, path.name == "__init__.py")
            if base is not None:
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.add(full if full in MODULES else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    found.discard(name)
    return {m for m in found if m in MODULES}


GRAPH = {name: imports_of(name) for name in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles, each as the modules around it (an arrow up to a package's ``__init__``
    counts: ``from trl_compat import x`` runs the root's code)."""
    edges = graph
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan, recursion depth bounded by the package's size
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def test_the_graph_is_read():
    assert "trl_compat.guard._mode" in GRAPH["trl_compat.guard._install"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_package():
    graph = {name: {t for t in targets if (name, t) not in KNOWN_CYCLE_ARROWS} for name, targets in GRAPH.items()}
    assert cycles(graph) == []


def test_the_known_arrows_are_still_there():
    """A known arrow that is gone leaves the list (so that it cannot come back unnoticed)."""
    assert [(a, b) for a, b in KNOWN_CYCLE_ARROWS if b not in GRAPH[a]] == []


def _guard(name: str) -> str:
    return name[len("trl_compat.guard.") :] if name.startswith("trl_compat.guard.") else name


@pytest.mark.parametrize(
    "low, high",
    [
        ("checks", "observe"),
        ("checks", "_install"),
        ("observe", "_install"),
        ("_mode", "checks"),
        ("_ledger", "checks"),
        ("_run", "checks"),
        ("_engines", "checks"),
    ],
)
def test_the_guard_floors(low, high):
    """A floor never imports one above it (guard/__init__.py's rules)."""
    wrong = [
        (name, target)
        for name, targets in GRAPH.items()
        if _guard(name).split(".")[0] == low
        for target in targets
        if _guard(target).split(".")[0] == high
    ]
    assert wrong == []


def test_nothing_imports_the_guard_from_below_but_its_installer_callers():
    """Nothing inside the guard imports the package's root (``import trl_compat``) or its installer
    from below."""
    below = [n for n in GRAPH if n.startswith("trl_compat.guard.") and _guard(n) != "_install"]
    assert [(n, t) for n in below for t in GRAPH[n] if t in ("trl_compat", "trl_compat.guard._install")] == []


def test_only_the_trainer_finder_walks_the_stack():
    walkers = sorted(
        _name(path) for name, path in MODULES.items() if name.startswith("trl_compat.guard") and "_getframe" in path.read_text()
    )
    assert walkers == ["trl_compat.guard.observe.trainers"]


def test_no_module_over_300_lines_but_the_registry():
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in MODULES.values()
        if (n := len(path.read_text().splitlines())) > LONGEST and str(path.relative_to(PACKAGE)) not in EXCEPTIONS
    }
    assert long == {}
