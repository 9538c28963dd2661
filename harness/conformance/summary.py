"""The short clause summary printed at the end of a pytest run."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.report import CONFORMING, NO_CLAUSE, Report, clause_outcomes

__all__ = ["headline", "summary_lines", "write_summary"]

_WIDTH = 160
_RANK_STORY = re.compile(r"^rank \d+ (raised|crashed|hung|timed out)\b")


def _notes(config: pytest.Config, report: Report) -> list[str]:
    lines = []
    directory = config.getoption("conformance_report")
    if directory:
        out = Path(directory)
        lines.append(f"report: {out / 'report.json'}, {out / 'report.md'}")
    deselected = report.selection.get("deselected", [])
    if deselected:
        # promise a list only where one is written
        where = (
            f"listed in {Path(directory) / 'report.json'}"
            if directory
            else "--conformance-report DIR lists them"
        )
        lines.append(f"deselected: {len(deselected)} checks ({where})")
    for pattern in report.selection.get("unmatched_patterns", []):
        lines.append(f"--clauses: {pattern!r} matched no clause of any collected check")
    unmatched = report.expected_failures.get("unmatched", [])
    if unmatched:
        lines.append(
            f"--expected-failures: {len(unmatched)} ids matched no test: {', '.join(unmatched)}"
        )
    return lines


def headline(failure: str | None) -> str:
    """The most telling line of a failure: for a RankFailure, the first rank's story."""
    lines = [line.strip() for line in (failure or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if "RankFailure" in lines[0]:
        story = next((x for x in lines[1:] if _RANK_STORY.match(x)), None)
        if story:
            return story
    return lines[0]


def summary_lines(config: pytest.Config, report: Report) -> list[str]:
    """Counts, one line per clause that did not pass (its worst check and why), notes."""
    clauses = clause_outcomes(report.checks)
    counts = ", ".join(f"{n} {o}" for o, n in report.counts().items() if n)
    named = len([c for c in clauses if c != NO_CLAUSE])
    lines = [f"checks: {counts or 'none'} ({len(report.checks)} checks, {named} clauses)"]
    for clause, (outcome, members) in clauses.items():
        if outcome == "passed":
            continue
        worst = next(c for c in members if c.outcome == outcome)
        line = f"  {clause:<16} {outcome:<12} {worst.id}: {headline(worst.failure)}"
        lines.append(line if len(line) <= _WIDTH else line[: _WIDTH - 3] + "...")
    return lines + _notes(config, report)


def write_summary(terminalreporter: Any, config: pytest.Config, report: Report) -> None:
    """Write the summary section; under ``--conformance-strict`` also the verdict.

    A strict run with non-conforming checks also adds ``N nonconforming`` to pytest's last
    line, so that line is never green when the run fails.
    """
    tr = terminalreporter
    tr.section("shardcheck conformance")
    for line in summary_lines(config, report):
        tr.write_line(line)
    if not config.getoption("conformance_strict"):
        return
    bad = [c for c in report.checks if c.outcome not in CONFORMING]
    if not bad:
        tr.write_line("conformance-strict: every check passed or needs another environment")
        return
    counts = {o: n for o, n in report.counts().items() if n and o not in CONFORMING}
    listing = ", ".join(f"{n} {o}" for o, n in counts.items())
    tr.write_line(
        f"conformance-strict: FAILED: {len(bad)} checks are neither passed nor environment "
        f"({listing})",
        red=True,
        bold=True,
    )
    tr.stats.setdefault("nonconforming", []).extend(
        SimpleNamespace(nodeid=c.id, when="call", outcome="nonconforming") for c in bad
    )
