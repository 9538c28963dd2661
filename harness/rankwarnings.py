"""Warnings from the ranks, each distinct one shown once with counts at the end of the run.

A rank job's warnings would otherwise be attached to every test report, per rank and per job
(the same few torch deprecations thousands of times). The session's :class:`RankWarnings`
(``HarnessSession.warnings``) counts each distinct ``(category, message, location)`` across
ranks and jobs; the plugin prints them in one "rank warnings summary" after the tests
(:func:`write_summary`), as pytest does for its own warnings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.outcomes import Outcome

__all__ = ["RankWarnings", "write_summary"]

Key = tuple[str, str, str, int]


@dataclass
class _Seen:
    count: int = 0
    ranks: set[int] = field(default_factory=set)
    jobs: int = 0


@dataclass
class RankWarnings:
    """Distinct rank warnings, in the order first seen, with how often they came."""

    seen: dict[Key, _Seen] = field(default_factory=dict)

    def add(self, outcomes: Sequence[Outcome]) -> None:
        """Count the warnings of one job (every rank)."""
        in_job: set[Key] = set()
        for o in outcomes:
            for key in o.warning_records:
                entry = self.seen.setdefault(key, _Seen())
                entry.count += 1
                entry.ranks.add(o.rank)
                in_job.add(key)
        for key in in_job:
            self.seen[key].jobs += 1

    def clear(self) -> None:
        """Forget everything (a new session)."""
        self.seen.clear()

    def lines(self) -> list[str]:
        """The summary: one block per distinct warning, most frequent first."""
        out: list[str] = []
        ordered = sorted(self.seen.items(), key=lambda kv: -kv[1].count)
        for (category, message, filename, lineno), s in ordered:
            ranks = ", ".join(map(str, sorted(s.ranks)))
            out.append(f"{filename}:{lineno}: {category}: {_first_line(message)}")
            out.append(f"  {s.count}x, on rank(s) {ranks}, in {s.jobs} job(s)")
        return out


def _first_line(message: str) -> str:
    lines = message.strip().splitlines() or [""]
    more = " ..." if len(lines) > 1 else ""
    return lines[0][:300] + more


def write_summary(terminalreporter: Any, warnings: RankWarnings) -> None:
    """Print the rank warnings summary (nothing when no rank warned), then forget them."""
    lines = warnings.lines()
    if not lines:
        return
    terminalreporter.write_sep("=", "rank warnings summary")
    for line in lines:
        terminalreporter.write_line(line)
    warnings.clear()
