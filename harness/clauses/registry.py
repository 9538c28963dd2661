"""The clause registry: the types of shardcheck's contract and the lookups everyone shares.

The texts live beside this module, one data module per group of sections
(:mod:`harness.clauses.api_and_training`, :mod:`harness.clauses.checkpoints`); the suites, the
conformance report, the clause-coverage test and ``CONTRACT.md`` all read them from here.
Clause ids are stable: a clause whose meaning changes gets a new id, and ids are never reused.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "FAMILIES",
    "Clause",
    "Section",
    "UnknownClauseError",
    "build_index",
    "closest_ids",
    "match_ids",
]

#: The strategy families the contract covers (``harness.contract.FAMILIES``, which this light
#: module cannot import: ``tests/test_contract.py`` keeps the two equal).
FAMILIES: tuple[str, ...] = ("fsdp", "model_parallel", "fsdp2")


class UnknownClauseError(KeyError):
    """A clause id (or pattern) that the contract does not have."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


@dataclass(frozen=True)
class Clause:
    """One requirement a conforming strategy meets.

    Attributes:
        id: the stable id, e.g. ``"CKPT-RT-3"``.
        text: what the strategy must do, in one paragraph (Markdown inline code allowed).
        scope: the configurations the clause speaks of, as allowed values per coverage axis
            (``family``, ``precision``, ``sharding``); an axis not named is unrestricted.
            The per-clause coverage counts a value as never reached only inside the scope.
            The scope also names the arguments of contract methods the clause speaks of
            (:mod:`harness.clauses.arguments`: ``norm_type``, ``strict``, ...) with their
            values: those are the argument values its checks must pass, and an argument it
            does not name is none of its business. Every scope names the ``family`` axis
            first: the families the clause applies to (a clause written without one applies
            to every family of :data:`FAMILIES`, and its scope is completed so). A clause
            none of whose families the strategy offers reads ``not applicable`` in the report.
    """

    id: str
    text: str
    scope: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        named = dict(self.scope).get("family")
        if named is None:
            scope = (("family", FAMILIES), *self.scope)
        else:
            unknown = sorted(set(named) - set(FAMILIES))
            if unknown:
                raise ValueError(
                    f"clause {self.id!r}: its scope names the families {unknown}, which the "
                    f"contract does not cover; use those of {', '.join(FAMILIES)}."
                )
            rest = tuple((axis, v) for axis, v in self.scope if axis != "family")
            scope = (("family", tuple(f for f in FAMILIES if f in named)), *rest)
        object.__setattr__(self, "scope", scope)

    @property
    def families(self) -> tuple[str, ...]:
        """The families the clause applies to, in the order of :data:`FAMILIES`."""
        return dict(self.scope)["family"]


@dataclass(frozen=True)
class Section:
    """A section of the contract.

    Attributes:
        number: 1-based section number.
        title: the section's heading.
        clauses: its clauses in contract order.
        intro: an optional paragraph shown before the clauses.
    """

    number: int
    title: str
    clauses: tuple[Clause, ...]
    intro: str = ""

    @property
    def ids(self) -> tuple[str, ...]:
        """The ids of this section's clauses, in order."""
        return tuple(c.id for c in self.clauses)


def build_index(sections: Iterable[Section]) -> dict[str, Clause]:
    """``{id: Clause}`` over the sections, in contract order.

    Raises:
        ValueError: an id appears twice (ids are unique across the whole contract).
    """
    index: dict[str, Clause] = {}
    for section in sections:
        for clause in section.clauses:
            if clause.id in index:
                raise ValueError(
                    f"clause id {clause.id!r} appears twice in the contract (section "
                    f"{section.number}); give the new clause a new id."
                )
            index[clause.id] = clause
    return index


def match_ids(patterns: Iterable[str], ids: Iterable[str]) -> list[str]:
    """The ids matched by any of the patterns (exact ids or globs such as ``CKPT-*``), in order.

    Raises:
        UnknownClauseError: a pattern matches no id.
    """
    known = list(ids)
    chosen: list[str] = []
    missing: list[str] = []
    for pattern in patterns:
        hits = [i for i in known if fnmatch.fnmatchcase(i, pattern.strip().upper())]
        if not hits:
            missing.append(pattern.strip())
        chosen += [h for h in hits if h not in chosen]
    if missing:
        named = " or ".join(_with_closest(p, known) for p in missing)
        raise UnknownClauseError(
            f"no clause matches {named}; see `pytest --list-clauses` for every id "
            "(such as API-1, CKPT-RT-3; globs such as CKPT-* work too)."
        )
    return [i for i in known if i in chosen]


def closest_ids(pattern: str, ids: Iterable[str], n: int = 3) -> list[str]:
    """The ids nearest an unmatched ``pattern`` (difflib); for a glob, the nearest family
    globs (``CKPT-RT-*``, ``CKPT-*``). Empty when nothing is close."""
    known = list(ids)
    wanted = pattern.strip().upper()
    candidates = known
    if any(c in wanted for c in "*?["):
        parts = [i.split("-") for i in known]
        candidates = sorted({"-".join(p[:k]) + "-*" for p in parts for k in range(1, len(p))})
    return difflib.get_close_matches(wanted, candidates, n=n, cutoff=0.6)


def _with_closest(pattern: str, ids: list[str]) -> str:
    near = closest_ids(pattern, ids)
    return f"{pattern!r} (closest: {', '.join(near)})" if near else repr(pattern)
