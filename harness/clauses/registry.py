"""The clause registry: the types of shardcheck's contract and the lookups everyone shares.

The texts live beside this module, one data module per group of sections
(:mod:`harness.clauses.api_and_training`, :mod:`harness.clauses.checkpoints`); the suites, the
conformance report, the clause-coverage test and ``CONTRACT.md`` all read them from here.
Clause ids are stable: a clause whose meaning changes gets a new id, and ids are never reused.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Clause", "Section", "UnknownClauseError", "build_index"]


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
    """

    id: str
    text: str
    scope: tuple[tuple[str, tuple[str, ...]], ...] = ()


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
    for pattern in patterns:
        hits = [i for i in known if fnmatch.fnmatchcase(i, pattern.strip().upper())]
        if not hits:
            raise UnknownClauseError(
                f"no clause matches {pattern!r}; `pytest --list-clauses` lists them all "
                f"(ids such as API-1, CKPT-RT-3; globs such as CKPT-*)."
            )
        chosen += [h for h in hits if h not in chosen]
    return [i for i in known if i in chosen]
