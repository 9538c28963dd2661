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
#: state. Everything else a run holds lives on its harness.run.session.HarnessSession.
PROCESS_STATE = {
    "harness.run.session._ACTIVE": "the stack of sessions in force: the one process-wide handle",
    "harness.verdicts.attribution._LATE": "a rank's buffer of the running job's late violations",
    "harness.verdicts.attribution._LOOKED": "the running check's last looked-through failure",
    "harness.entry.sigterm._previous": "the process's SIGTERM handler before the plugin's",
    "harness.entry.sigterm._installed": "whether the process's SIGTERM handler is installed",
    "harness.entry.sigterm._depth": "how many nested pytest sessions installed it",
    "harness.entry.sigterm._received": "a SIGTERM arrived whose exception may have been swallowed",
    "harness.rank.coverage._cov": "the coverage measurement of this (rank) process",
    "harness.rank.coverage._save_failed": "whether this rank already warned of a save",
    "harness.wire.fnref._REF_CACHE": "a cache of resolved function references (no state)",
    "harness.rank.context._FACTORIES": "a rank's cache of loaded strategy factories (no state)",
    "harness.entry.inplay.OPTIONS": "the options the plugins define, the same in every run",
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


#: What sends a job to the ranks, by the module it is imported from: the harness's
#: ``run_on_ranks`` and the suites' ``run`` (``suites/lib/controller/dispatch.py``, which
#: calls it). A ``SessionDriver`` sends the functions its class attributes ``job`` and
#: ``probe`` hold (``suites/lib/controller/session_driver.py``).
SENDERS = {
    "harness": "run_on_ranks",
    "harness.api": "run_on_ranks",
    "suites.lib.controller.dispatch": "run",
}
JOB_ATTRIBUTES = ("job", "probe")


def sent_jobs(source: str) -> list[tuple[int, str, str | None]]:
    """``(line, job, where it comes from)`` for each job a module sends by name: ``"here"``
    for a function the module defines, the module it imports the name from, or ``None`` for
    any other name (a parameter: the module passes on a job it was given)."""
    tree = ast.parse(source)
    origin: dict[str, str] = {}
    senders: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                origin[alias.asname or alias.name] = node.module
                if SENDERS.get(node.module) == alias.name:
                    senders.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in SENDERS:
                    senders.add(f"{alias.asname or alias.name}.{SENDERS[alias.name]}")
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            origin[node.name] = "here"
    jobs: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in senders:
            fn = node.args[0] if node.args else None
            fn = next((k.value for k in node.keywords if k.arg == "fn"), fn)
            jobs += [fn] if fn is not None else []
        elif isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id in JOB_ATTRIBUTES for t in statement.targets
                ):
                    value = statement.value
                    if isinstance(value, ast.Call) and ast.unparse(value.func) == "staticmethod":
                        value = value.args[0]
                    jobs.append(value)
    return sorted((fn.lineno, ast.unparse(fn), origin.get(ast.unparse(fn))) for fn in jobs)


def test_rank_jobs_live_in_suites_lib_ranks() -> None:
    """Every function the suites send to the ranks is defined in ``suites/lib/ranks/``: a
    ``suites/test_*.py`` module keeps the checks (drawing, sending, comparing), and no module
    of ``suites/lib/`` imports one."""
    wrong: list[str] = []
    sent = 0
    paths = sorted((ROOT / "suites").glob("test_*.py"))
    paths += sorted((ROOT / "suites" / "lib" / "controller").glob("*.py"))
    for path in paths:
        for line, job, where in sent_jobs(path.read_text()):
            sent += 1
            if where is None or where.startswith("suites.lib.ranks."):
                continue
            place = "defined in this module" if where == "here" else f"from {where}"
            wrong.append(f"{path.relative_to(ROOT)}:{line}: sends {job} ({place})")
    for name, path in _modules().items():
        if name.startswith("suites.lib"):
            for line, module, imported in _imports(name, path):
                target = f"{module}.{imported}" if imported else module
                if target.startswith("suites.test_"):
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    assert sent > 50  # the suites' jobs were found
    assert wrong == []


def test_the_rank_job_scan_finds_jobs_sent_from_their_test_module() -> None:
    source = (
        "from harness import run_on_ranks as send\n"
        "from suites.lib.controller.dispatch import run\n"
        "from suites.lib.ranks.training import train_rank\n"
        "from elsewhere import helper_rank\n"
        "import harness\n"
        "def _own_rank(ctx): ...\n"
        "def test_a():\n    run(_own_rank, world_size=2)\n    run(train_rank, 1, world_size=2)\n"
        "def test_b(fn):\n    send(fn=helper_rank, world_size=2)\n"
        "    harness.run_on_ranks(_own_rank, world_size=2)\n    run(fn, world_size=2)\n"
        "class Session(Driver):\n    job = staticmethod(_own_rank)\n    probe = train_rank\n"
    )
    assert sent_jobs(source) == [
        (8, "_own_rank", "here"),
        (9, "train_rank", "suites.lib.ranks.training"),
        (11, "helper_rank", "elsewhere"),
        (12, "_own_rank", "here"),
        (13, "fn", None),
        (15, "_own_rank", "here"),
        (16, "train_rank", "suites.lib.ranks.training"),
    ]


def _entry(module: str) -> str:
    """The top-level entry of ``harness/`` a module is in (``harness.pool.rankpool`` ->
    ``harness.pool``; the package itself is ``harness``)."""
    return ".".join(module.split(".")[:2])


def test_harness_entries_import_downward_only() -> None:
    """``harness/`` is laid out by role (docs/architecture.md): its top-level entries import
    one another without a cycle, so each stands above everything it imports."""
    entries: dict[str, set[str]] = {}
    for module, targets in _graph(_modules()).items():
        if module.split(".")[0] != "harness":
            continue
        source = _entry(module)
        inside = {_entry(t) for t in targets if t.split(".")[0] == "harness"}
        entries.setdefault(source, set()).update(inside - {source})
    assert len(entries) >= 15  # the entries were found
    assert _cycles(entries) == []


def test_the_entry_cycle_scan_sees_a_cycle_between_folders() -> None:
    entries = {"harness.a": {"harness.b"}, "harness.b": {"harness.c"}, "harness.c": {"harness.a"}}
    assert _cycles(entries) == [["harness.a", "harness.b", "harness.c"]]
    assert _entry("harness.pool.transports.pipes") == "harness.pool"


#: the parts of ``harness/conformance/``, lowest first: each imports only those before it
CONFORMANCE_PARTS = ("findings", "outcomes", "output")


def _conformance_part(module: str) -> str:
    """The part of ``harness/conformance/`` a module is in, or ``""`` (the plugin's own
    modules, and modules outside ``harness/conformance/``)."""
    names = module.split(".")
    inside = names[:2] == ["harness", "conformance"] and len(names) > 2
    return names[2] if inside and names[2] in CONFORMANCE_PARTS else ""


def conformance_imports_upward(modules: dict[str, Path]) -> list[str]:
    """Each import by a module of a part of ``harness/conformance/`` of a later part, or of the
    plugin's own modules (``harness.conformance``, ``harness.conformance.session``)."""
    wrong = []
    for name, path in modules.items():
        mine = _conformance_part(name)
        if not mine:
            continue
        for line, module, imported in _imports(name, path):
            target = f"{module}.{imported}" if imported else module
            if target.split(".")[:2] != ["harness", "conformance"]:
                continue
            part = _conformance_part(target)
            if not part or CONFORMANCE_PARTS.index(part) > CONFORMANCE_PARTS.index(mine):
                wrong.append(f"{name}:{line}: imports {target}")
    return wrong


def test_conformance_parts_import_one_way() -> None:
    """``harness/conformance/``'s parts stand on each other (docs/architecture.md): ``output``
    reads ``outcomes``, which reads ``findings``; none reads the plugin that drives them."""
    modules = _modules()
    assert len([n for n in modules if _conformance_part(n)]) > 15  # the parts were found
    assert conformance_imports_upward(modules) == []


def test_the_conformance_scan_sees_an_import_upward(tmp_path: Path) -> None:
    source = (
        "from harness.conformance.findings.masking import mask\n"
        "from harness.conformance.outcomes.checks import Check\n"
        "from harness.conformance import session\n"
        "import harness.conformance.output.facts\n"
    )
    (tmp_path / "x.py").write_text(source)
    (tmp_path / "y.py").write_text(source)
    modules = {
        "harness.conformance.findings.x": tmp_path / "x.py",
        "harness.conformance.output.y": tmp_path / "y.py",
    }
    assert conformance_imports_upward(modules) == [
        "harness.conformance.findings.x:2: imports harness.conformance.outcomes.checks.Check",
        "harness.conformance.findings.x:3: imports harness.conformance.session",
        "harness.conformance.findings.x:4: imports harness.conformance.output.facts",
        "harness.conformance.output.y:3: imports harness.conformance.session",
    ]
