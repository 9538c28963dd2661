"""Every clause of the contract (sections 1-6) is named by some suite test, and no suite test
names a clause the contract does not have.

The clause ids come from ``suites/lib/controller/clauses.py`` (the suites' view of
:mod:`harness.clauses`); the declarations are the ``@pytest.mark.clause(...)`` marks of the
test functions in ``suites/test_*.py`` and of their ``pytest.param`` parameter sets, read by
importing those modules (no collection, no ranks).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from suites.lib.controller.clauses import ALL_CLAUSES, SECTIONS

SUITES = Path(__file__).resolve().parents[1] / "suites"


def _marks(obj: Any) -> list[pytest.Mark]:
    """The object's marks, and those of its ``pytest.param(..., marks=...)`` parameter sets."""
    marks = getattr(obj, "pytestmark", [])
    direct = list(marks) if isinstance(marks, (list, tuple)) else [marks]
    from_params = [
        mark
        for parametrize in direct
        if parametrize.name == "parametrize" and len(parametrize.args) > 1
        for value in parametrize.args[1]
        for mark in getattr(value, "marks", ())
    ]
    return direct + from_params


def _tests(module: Any) -> Iterator[tuple[str, list[pytest.Mark]]]:
    """``(name, marks)`` of the module's tests (``Class.method`` for test classes), with the
    marks of the module and of the class included."""
    module_marks = _marks(module)
    for name, obj in vars(module).items():
        if name.startswith("test") and callable(obj):
            yield name, [*module_marks, *_marks(obj)]
        elif name.startswith("Test") and isinstance(obj, type):
            for method, fn in vars(obj).items():
                if method.startswith("test") and callable(fn):
                    yield f"{name}.{method}", [*module_marks, *_marks(obj), *_marks(fn)]


def declared_clauses() -> tuple[dict[str, list[str]], dict[str, str]]:
    """``({clause: [test ids]}, {module: import error})`` over ``suites/test_*.py``."""
    declared: dict[str, list[str]] = {}
    broken: dict[str, str] = {}
    for path in sorted(SUITES.glob("test_*.py")):
        name = f"suites.{path.stem}"
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            broken[name] = f"{type(exc).__name__}: {exc}"
            continue
        for test, marks in _tests(module):
            for mark in marks:
                if mark.name == "clause":
                    for clause in mark.args:
                        declared.setdefault(str(clause), []).append(f"{path.stem}.{test}")
    return declared, broken


def test_suite_modules_import() -> None:
    _, broken = declared_clauses()
    assert not broken, "suite modules that do not import (their clauses are not counted):\n" + (
        "\n".join(f"  {name}: {error}" for name, error in broken.items())
    )


def test_every_clause_of_sections_1_to_6_is_named_by_a_suite_test() -> None:
    declared, _ = declared_clauses()
    lines = []
    for number, (title, ids) in SECTIONS.items():
        missing = [c for c in ids if c not in declared]
        if missing:
            lines.append(f"  section {number} ({title}): {', '.join(missing)}")
    assert not lines, (
        "clauses of the contract that no test in suites/ names with @pytest.mark.clause(...):\n"
        + "\n".join(lines)
    )


def test_suite_tests_name_only_clauses_of_the_spec() -> None:
    declared, _ = declared_clauses()
    unknown = {c: tests for c, tests in declared.items() if c not in ALL_CLAUSES}
    assert not unknown, (
        "@pytest.mark.clause ids that the contract (harness/clauses) does not have: "
        + "; ".join(f"{c} in {', '.join(tests)}" for c, tests in sorted(unknown.items()))
    )
