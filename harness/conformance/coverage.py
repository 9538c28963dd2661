"""Configuration coverage of a run: which pairs of axis values the passing checks exercised.

The suites report, for each job they dispatch, the value its configuration takes on each main
axis (family, sharding layout, precision, wrap kind, world size, checkpoint format, model
kinds; :mod:`suites.lib.shared.axes`); the check's :class:`CheckWatch` keeps them
(``Check.exercised``). A pair of values on two axes is *supported* when some job that ran
(passed or failed: the strategy did not refuse it) had both, and *covered* when a job of a
check that passed had both. The report shows both counts, per pair of axes with the pairs
not covered, and the one-line figure ``pairs covered: N of M supported``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations
from typing import Any

from harness.conformance.checks import Check

__all__ = ["MISSING_SHOWN", "coverage_of", "pairs_of"]

#: pairs not covered listed per pair of axes in the report (the count is always given)
MISSING_SHOWN = 8

Pair = tuple[str, str, str, str]  # (axis, value, other axis, other value), axes in name order


def _order(value: str) -> tuple[int, int, str]:
    """Sort key: numbers (world sizes) by value, before words."""
    return (0, int(value), "") if value.isdigit() else (1, 0, value)


def _pair_order(pair: Pair) -> tuple[Any, ...]:
    return (pair[0], pair[2], _order(pair[1]), _order(pair[3]))


def pairs_of(entry: Mapping[str, Sequence[str]]) -> set[Pair]:
    """Every pair of values on two different axes of one job's configuration."""
    found: set[Pair] = set()
    for first, second in combinations(sorted(entry), 2):
        for a in entry[first]:
            for b in entry[second]:
                found.add((first, a, second, b))
    return found


def coverage_of(checks: Iterable[Check]) -> dict[str, Any]:
    """The run's coverage (``report.json``'s ``coverage``); empty when no job reported axes.

    Returns:
        ``{"pairs_covered": N, "pairs_supported": M, "values": {axis: [values]},
        "by_axes": [{"axes": [a, b], "covered": n, "supported": m, "missing": [[va, vb],
        ...]}]}``; ``missing`` lists at most :data:`MISSING_SHOWN` pairs.
    """
    supported: set[Pair] = set()
    covered: set[Pair] = set()
    values: dict[str, set[str]] = {}
    for check in checks:
        for entry in check.exercised:
            pairs = pairs_of(entry)
            supported |= pairs
            if check.outcome == "passed":
                covered |= pairs
            for axis, seen in entry.items():
                values.setdefault(axis, set()).update(seen)
    if not supported:
        return {}
    by_axes: dict[tuple[str, str], list[Pair]] = {}
    for pair in sorted(supported, key=_pair_order):
        by_axes.setdefault((pair[0], pair[2]), []).append(pair)
    rows = []
    for (first, second), members in by_axes.items():
        missing = [[p[1], p[3]] for p in members if p not in covered]
        rows.append(
            {
                "axes": [first, second],
                "covered": len(members) - len(missing),
                "supported": len(members),
                "missing": missing[:MISSING_SHOWN],
            }
        )
    return {
        "pairs_covered": len(covered),
        "pairs_supported": len(supported),
        "values": {axis: sorted(seen, key=_order) for axis, seen in sorted(values.items())},
        "by_axes": rows,
    }
