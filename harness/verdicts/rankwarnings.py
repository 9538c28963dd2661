"""Warnings from the ranks, each distinct one shown once with counts at the end of the run.

A rank job's warnings would otherwise be attached to every test report, per rank and per job
(the same few torch deprecations thousands of times). The session's :class:`RankWarnings`
(``HarnessSession.warnings``) counts them across ranks and jobs, folded by *shape*: warnings of
one category whose messages are equal once numbers, quoted names and dotted paths are
placeholders (and whitespace is ignored) are one entry, wherever they were raised:
"FSDP is switching to use `NO_SHARD` instead of ShardingStrategy.FULL_SHARD ..." and its
``SHARD_GRAD_OP`` twin, or "blocks.0 has both parameters ..." for every module. The first one
seen is the example; the others are counted as "N more like it". The plugin prints them in one
"rank warnings summary" at the very end of the run, after the conformance summary
(:func:`write_summary`), as pytest does for its own warnings.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.verdicts.outcomes import Outcome

__all__ = ["RankWarnings", "shape", "write_summary"]

Key = tuple[str, str, str, int]

#: what varies between warnings of one shape, replaced in this order
_VARYING = (
    (re.compile(r"``[^`]*``|`[^`]*`|'[^'\n]*'|\"[^\"\n]*\""), "<Q>"),  # quoted names
    (re.compile(r"\b[A-Za-z_]\w*(?:\.\w+)+"), "<P>"),  # dotted paths: blocks.1.inner.0, a.B.C
    (re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", re.I), "<N>"),  # numbers
    (re.compile(r"\s+"), ""),  # spacing ("will be" and torch's "willbe")
)


def shape(message: str) -> str:
    """The message with numbers, quoted names and dotted paths as placeholders, without
    whitespace: two warnings of one shape are folded into one entry of the summary."""
    for pattern, placeholder in _VARYING:
        message = pattern.sub(placeholder, message)
    return message


@dataclass
class _Seen:
    example: Key
    count: int = 0
    ranks: set[int] = field(default_factory=set)
    jobs: int = 0
    variants: set[Key] = field(default_factory=set)


@dataclass
class RankWarnings:
    """Rank warnings folded by shape, in the order first seen, with how often they came."""

    seen: dict[tuple[str, str], _Seen] = field(default_factory=dict)

    def add(self, outcomes: Sequence[Outcome]) -> None:
        """Count the warnings of one job (every rank)."""
        in_job: set[tuple[str, str]] = set()
        for o in outcomes:
            for key in o.warning_records:
                folded = (key[0], shape(key[1]))
                entry = self.seen.get(folded)
                if entry is None:
                    entry = self.seen[folded] = _Seen(example=key)
                entry.count += 1
                entry.ranks.add(o.rank)
                entry.variants.add(key)
                in_job.add(folded)
        for folded in in_job:
            self.seen[folded].jobs += 1

    def clear(self) -> None:
        """Forget everything (a new session)."""
        self.seen.clear()

    def lines(self) -> list[str]:
        """The summary: two lines per shape of warning (its first example, then the counts
        and how many other messages or places it stands for), most frequent first."""
        out: list[str] = []
        for s in sorted(self.seen.values(), key=lambda s: -s.count):
            category, message, filename, lineno = s.example
            ranks = ", ".join(map(str, sorted(s.ranks)))
            more = len(s.variants) - 1
            like = f"; {more} more like it" if more else ""
            out.append(f"{filename}:{lineno}: {category}: {_first_line(message)}")
            out.append(f"  {s.count}x, on rank(s) {ranks}, in {s.jobs} job(s){like}")
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
