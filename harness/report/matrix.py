"""The coverage matrix: clauses by configuration-axis values, each cell in one state.

Read from ``report.json``'s ``coverage.by_clause`` (:mod:`harness.conformance.output.coverage`): per
clause and axis, the values a passing check of the clause exercised (``covered``), those that
reached its checks only in checks that did not pass (``reached``), and those of the declared
configuration space inside the clause's scope that its checks never drew (``never``). Any
other cell is outside the clause's scope, or on an axis its checks do not report (``""``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["COVERED", "NEVER", "OUTSIDE", "REACHED", "CoverageMatrix", "coverage_matrix"]

COVERED = "covered"
REACHED = "reached"
NEVER = "never"
OUTSIDE = ""


@dataclass(frozen=True)
class CoverageMatrix:
    """``columns``: ``(axis, value)`` in axis order; ``rows``: ``(clause, states)``, one state
    per column."""

    columns: list[tuple[str, str]]
    rows: list[tuple[str, list[str]]]

    def axes(self) -> list[tuple[str, int]]:
        """Each axis and how many columns it spans, in column order."""
        spans: dict[str, int] = {}
        for axis, _ in self.columns:
            spans[axis] = spans.get(axis, 0) + 1
        return list(spans.items())


def _order(value: str) -> tuple[int, int, str]:
    return (0, int(value), "") if value.isdigit() else (1, 0, value)


def _state(cell: dict[str, Any], value: str) -> str:
    if value in cell.get("covered", []):
        return COVERED
    if value in cell.get("reached", []):
        return REACHED
    if value in cell.get("never", []):
        return NEVER
    return OUTSIDE


def coverage_matrix(coverage: dict[str, Any]) -> CoverageMatrix | None:
    """The matrix of a report's ``coverage``; None when no clause's jobs reported axes."""
    table: dict[str, dict[str, dict[str, Any]]] = (coverage or {}).get("by_clause", {})
    if not table:
        return None
    values: dict[str, set[str]] = {a: set(v) for a, v in coverage.get("values", {}).items()}
    for row in table.values():
        for axis, cell in row.items():
            values.setdefault(axis, set()).update(
                [*cell.get("covered", []), *cell.get("reached", []), *cell.get("never", [])]
            )
    columns = [(axis, v) for axis in sorted(values) for v in sorted(values[axis], key=_order)]
    rows = [
        (clause, [_state(row.get(axis, {}), value) for axis, value in columns])
        for clause, row in table.items()
    ]
    return CoverageMatrix(columns, rows)
