"""Configuration coverage of a run: which pairs of axis values the passing checks exercised.

The suites report, for each job they dispatch, the value its configuration takes on each main
axis (family, sharding layout, precision, wrap kind, world size, checkpoint format, model
kinds; :mod:`suites.lib.shared.axes`); the check's :class:`CheckWatch` keeps them
(``Check.exercised``). A pair of values on two axes is *supported* when some job that ran
(passed or failed: the strategy did not refuse it) had both, and *covered* when a job of a
check that passed had both. The report shows both counts, per pair of axes with the pairs
not covered, and the one-line figure ``pairs covered: N of M supported``.

A suite may also *declare* the configuration space (``HarnessSession.note_universe``: every
pair of values some valid configuration takes; the suites' pairwise cover does). The report
then counts the declared pairs and lists those that never reached the ranks, so a value no
check drew shows up as a gap instead of falling out of both numbers.

Per clause, the report lists which value of each axis reached a check of that clause and
which a passing check of it exercised (``by_clause``), and, with a declared space, the values
of each axis the clause's checks never reached.

The jobs also report the arguments they passed to the contract's methods
(:mod:`harness.clauses.arguments`: ``norm_type``, ``strict``, ...). An argument is chosen per
call, not per configuration: its values are listed like an axis's, per clause too, but are
left out of the pairs (the pairwise figure stays one of configurations), and the values a
clause's checks never passed are those of its scope (the contract declares them, not the
suites' space). The axes of the contract's words that only some models meet
(:mod:`harness.clauses.words`: a subclass of a listed class, a same-named class from another
module) are counted the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations
from typing import Any

from harness.clauses import ARGUMENT_AXES, CLAUSES, WORD_AXES
from harness.conformance.outcomes.checks import Check

__all__ = [
    "MISSING_SHOWN",
    "SCOPED_AXES",
    "by_clause",
    "coverage_of",
    "in_scope",
    "pairs_of",
    "values_of",
]

#: pairs not covered listed per pair of axes in the report (the count is always given)
MISSING_SHOWN = 8

Pair = tuple[str, str, str, str]  # (axis, value, other axis, other value), axes in name order

#: axes counted per call or per model, not per configuration: the arguments of the contract's
#: methods and the contract's words (values listed, left out of the pairs, never reached only
#: inside a scope that names them)
SCOPED_AXES = ARGUMENT_AXES | WORD_AXES


def _order(value: str) -> tuple[int, int, str]:
    """Sort key: numbers (world sizes) by value, before words."""
    return (0, int(value), "") if value.isdigit() else (1, 0, value)


def _pair_order(pair: Pair) -> tuple[Any, ...]:
    return (pair[0], pair[2], _order(pair[1]), _order(pair[3]))


def pairs_of(entry: Mapping[str, Sequence[str]]) -> set[Pair]:
    """Every pair of values on two different axes of one job's configuration (arguments of
    the contract's methods and the contract's words left out: :data:`SCOPED_AXES`)."""
    found: set[Pair] = set()
    axes = sorted(axis for axis in entry if axis not in SCOPED_AXES)
    for first, second in combinations(axes, 2):
        for a in entry[first]:
            for b in entry[second]:
                found.add((first, a, second, b))
    return found


def values_of(pairs: Iterable[Pair]) -> dict[str, set[str]]:
    """The values each axis takes in ``pairs``."""
    found: dict[str, set[str]] = {}
    for first, a, second, b in pairs:
        found.setdefault(first, set()).add(a)
        found.setdefault(second, set()).add(b)
    return found


def _sorted_values(values: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    return {axis: sorted(seen, key=_order) for axis, seen in sorted(values.items())}


def in_scope(universe: Iterable[Pair], scope: Mapping[str, Sequence[str]]) -> dict[str, set[str]]:
    """The values each axis takes inside ``scope`` (allowed values per axis; an axis it does
    not name is free): a value is inside when it is allowed on its own axis and, on every
    other scoped axis, some pair of ``universe`` puts it beside an allowed value (a
    model-parallel-only value is outside a scope of ``family: fsdp``). An argument or word
    axis of the scope (:data:`SCOPED_AXES`) restricts no other axis, and the values inside it
    are the scope's own: every configuration takes every argument's values. An
    axis whose allowed values include all the values ``universe`` has for it restricts nothing
    either (every clause names its families: those of a clause of every family are free)."""
    arguments = {axis: set(allowed) for axis, allowed in scope.items() if axis in SCOPED_AXES}
    beside: dict[tuple[str, str], dict[str, set[str]]] = {}
    taken: dict[str, set[str]] = {}
    for first, a, second, b in universe:
        beside.setdefault((first, a), {}).setdefault(second, set()).add(b)
        beside.setdefault((second, b), {}).setdefault(first, set()).add(a)
        taken.setdefault(first, set()).add(a)
        taken.setdefault(second, set()).add(b)
    scope = {
        axis: allowed
        for axis, allowed in scope.items()
        if axis not in arguments and not (axis in taken and taken[axis] <= set(allowed))
    }
    found: dict[str, set[str]] = {}
    for (axis, value), others in beside.items():
        if axis in scope and value not in scope[axis]:
            continue
        if all(
            others.get(other, set()) & set(allowed)
            for other, allowed in scope.items()
            if other != axis
        ):
            found.setdefault(axis, set()).add(value)
    return found | arguments


def by_clause(checks: Iterable[Check], universe: Iterable[Pair] = ()) -> dict[str, Any]:
    """Per clause and axis: the values that reached a check of the clause, those a passing
    check of it exercised, and (with a declared ``universe``; for the arguments and words its
    scope names, always) those of the clause's scope (:attr:`harness.clauses.Clause.scope`) it
    never reached.

    Returns:
        ``{clause: {axis: {"covered": [...], "reached": [...], "never": [...]}}}``; an axis
        none of the clause's jobs reported is absent.
    """
    reached: dict[str, dict[str, set[str]]] = {}
    covered: dict[str, dict[str, set[str]]] = {}
    for check in checks:
        for clause in check.clauses:
            for entry in check.exercised:
                for axis, seen in entry.items():
                    reached.setdefault(clause, {}).setdefault(axis, set()).update(seen)
                    if check.outcome == "passed":
                        covered.setdefault(clause, {}).setdefault(axis, set()).update(seen)
    universe = set(universe)
    table: dict[str, Any] = {}
    for clause in sorted(reached):
        known = CLAUSES.get(clause)
        declared = in_scope(universe, dict(known.scope) if known is not None else {})
        row: dict[str, Any] = {}
        for axis, values_reached in sorted(reached[clause].items()):
            row[axis] = {
                "covered": sorted(covered.get(clause, {}).get(axis, set()), key=_order),
                "reached": sorted(values_reached, key=_order),
                "never": sorted(declared.get(axis, set()) - values_reached, key=_order),
            }
        table[clause] = row
    return table


def coverage_of(checks: Iterable[Check], universe: Iterable[Pair] = ()) -> dict[str, Any]:
    """The run's coverage (``report.json``'s ``coverage``); empty when no job reported axes.

    Args:
        checks: the run's checks.
        universe: the declared configuration space's pairs (empty: none declared).

    Returns:
        ``{"pairs_covered": N, "pairs_supported": M, "pairs_declared": D, "values": {axis:
        [values]}, "by_axes": [{"axes": [a, b], "covered": n, "supported": m, "missing":
        [[va, vb], ...]}], "never_reached": [[a, va, b, vb], ...], "by_clause": {...}}``;
        ``missing`` and ``never_reached`` list at most :data:`MISSING_SHOWN` pairs (per pair
        of axes / in all); ``pairs_declared`` is 0 without a declared space.
    """
    checks = list(checks)
    declared = set(universe)
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
    if not values:  # no job reported its axes (one that reported arguments only has values)
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
    never = sorted(declared - supported, key=_pair_order)
    return {
        "pairs_covered": len(covered),
        "pairs_supported": len(supported),
        "pairs_declared": len(declared),
        "never_reached": [list(p) for p in never[:MISSING_SHOWN]],
        "never_reached_count": len(never),
        "values": _sorted_values(values),
        "by_axes": rows,
        "by_clause": by_clause(checks, declared),
    }
