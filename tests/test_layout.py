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


#: Module-level names in harness/ that functions may write, each with why it is not session
#: state. Everything else a run holds lives on its harness.session.HarnessSession.
PROCESS_STATE = {
    "harness.session._ACTIVE": "the stack of sessions in force: the one process-wide handle",
    "harness.attribution._LATE": "a rank's buffer of the running job's late violations",
    "harness.sigterm._previous": "the process's SIGTERM handler before the plugin's",
    "harness.sigterm._installed": "whether the process's SIGTERM handler is installed",
    "harness.sigterm._depth": "how many nested pytest sessions installed it",
    "harness.sigterm._received": "a SIGTERM arrived whose exception may have been swallowed",
    "harness.rankcoverage.rank._cov": "the coverage measurement of this (rank) process",
    "harness.rankcoverage.rank._save_failed": "whether this rank already warned of a save",
    "harness.fnref._REF_CACHE": "a cache of resolved function references (no state)",
    "harness.context._FACTORIES": "a rank's cache of loaded strategy factories (no state)",
    "harness.inplay.OPTIONS": "the options the plugins define, the same in every run (no state)",
}
_MUTATORS = {
    "append",
    "extend",
    "insert",
    "remove",
    "pop",
    "popitem",
    "clear",
    "add",
    "discard",
    "update",
    "setdefault",
}


def _written_module_names(tree: ast.Module) -> set[str]:
    """Module-level names that a function declares ``global``, mutates with a container
    method, assigns an item or attribute of, or deletes an item of."""
    module_names = {
        target.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    written: set[str] = set()
    functions = [
        n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    for function in functions:
        for node in ast.walk(function):
            if isinstance(node, ast.Global):
                written.update(node.names)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                base = node.func.value
                if isinstance(base, ast.Name) and node.func.attr in _MUTATORS:
                    written.add(base.id)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = (
                    node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                )
                for target in targets:
                    if isinstance(target, (ast.Subscript, ast.Attribute)) and isinstance(
                        target.value, ast.Name
                    ):
                        written.add(target.value.id)
    return written & module_names


def module_state(name: str, source: str) -> set[str]:
    """The dotted names of the module-level names that functions of ``name`` write."""
    return {f"{name}.{n}" for n in _written_module_names(ast.parse(source))}


def test_no_module_level_session_state_in_harness() -> None:
    """What a run holds (settings, pools, job ids, refusals, warnings, late violations, the
    running check) lives on its session object, not in module globals."""
    state: set[str] = set()
    for name, path in _modules().items():
        if name.startswith("harness"):
            state |= module_state(name, path.read_text())
    assert sorted(state - set(PROCESS_STATE)) == []
    assert sorted(set(PROCESS_STATE) - state) == []  # the list names only what exists


def test_the_state_scan_finds_globals_a_function_writes() -> None:
    source = (
        "_config = None\n_pools = {}\n_seen = []\nLIMIT = {'ci': 1}\n"
        "def configure(x):\n    global _config\n    _config = x\n"
        "def pool(n):\n    _pools[n] = object()\n"
        "def note(v):\n    _seen.append(v)\n"
        "def read():\n    return LIMIT['ci']\n"
    )
    assert module_state("m", source) == {"m._config", "m._pools", "m._seen"}
