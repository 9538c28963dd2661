"""The contract's clause ids, by section, as the suites use them.

The contract itself (ids and texts) is :mod:`harness.clauses`, rendered as ``CONTRACT.md``;
this module keeps the suites' view of it: ``tests/test_clause_coverage.py`` checks that every id
here is named by some ``@pytest.mark.clause(...)`` in ``suites/`` and that no test names an id
the contract does not have.
"""

from __future__ import annotations

from harness.clauses import ALL_CLAUSES as _ALL
from harness.clauses import SECTIONS as _SECTIONS
from harness.clauses import clauses_of

__all__ = ["ALL_CLAUSES", "SECTIONS", "clauses_of"]

#: section number -> (title, clause ids in contract order)
SECTIONS: dict[int, tuple[str, tuple[str, ...]]] = {s.number: (s.title, s.ids) for s in _SECTIONS}

#: every clause id, in contract order
ALL_CLAUSES: tuple[str, ...] = _ALL
