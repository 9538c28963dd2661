"""The package layout holds: no import cycles, and ``suites/`` keeps its two sides apart.

Read statically from every import statement (top level, inside functions, under
``TYPE_CHECKING``), so an import that runs only on some path still counts.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "suites", "reference_impl")
SIDES = ("controller", "ranks", "shared")


def _modules() -> dict[str, Path]:
    """Every module of the three packages by dotted name (a package by its own name)."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path) -> Iterator[tuple[int, str, str | None]]:
    """``(line, module, imported name or None)`` for each import in the module ``name``."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                prefix = package[: len(package) - node.level + 1]
                base = ".".join(prefix + ([node.module] if node.module else []))
            for alias in node.names:
                yield node.lineno, base, alias.name


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for _, module, imported in _imports(name, path):
            submodule = f"{module}.{imported}" if imported else module
            if submodule in modules:
                targets.add(submodule)
            elif module in modules:
                targets.add(module)
        targets.discard(name)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_cycles_between_modules() -> None:
    graph = _graph(_modules())
    assert len(graph) > 100  # the packages were found
    assert _cycles(graph) == []


def _side(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["suites", "lib"] and len(parts) > 2 else None


def test_suites_sides_import_only_what_their_side_may() -> None:
    """``shared`` imports neither side; ``controller`` and ``ranks`` never import each other;
    nothing imports a private (``_name``) suites module or name."""
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        if name.startswith("suites") and path.stem.startswith("_") and path.stem != "__init__":
            wrong.append(f"{path.relative_to(ROOT)}: a private module in suites/")
        me = _side(name)
        for line, module, imported in _imports(name, path):
            if not module.startswith("suites"):
                continue
            where = f"{path.relative_to(ROOT)}:{line}"
            if any(p.startswith("_") for p in module.split(".")) or (imported or "").startswith(
                "_"
            ):
                wrong.append(f"{where}: imports private {module} {imported or ''}".rstrip())
            target = f"{module}.{imported}" if module == "suites.lib" and imported else module
            other = _side(target)
            if me == "shared" and other in ("controller", "ranks"):
                wrong.append(f"{where}: shared code imports the {other} side ({module})")
            if {me, other} == {"controller", "ranks"}:
                wrong.append(f"{where}: the {me} side imports the {other} side ({module})")
    assert wrong == []


def test_suites_helpers_live_on_one_side() -> None:
    lib = ROOT / "suites" / "lib"
    top = sorted(p.name for p in lib.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert top == sorted(SIDES)
    stray = [p.name for p in (ROOT / "suites").glob("*.py") if not p.name.startswith("test_")]
    assert sorted(stray) == ["__init__.py"], stray
