"""The short clause summary printed at the end of a pytest run."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.clauses import FAMILIES
from harness.conformance.outcomes.strict import strict_verdict
from harness.conformance.output.progress import unprefixed
from harness.report import (
    NO_CLAUSE,
    NOT_APPLICABLE,
    Report,
    clause_family_outcomes,
    clause_outcomes,
    declared_unsupported,
    refused_families,
)
from harness.report.markdown import clause_coverage_line, coverage_line
from harness.report.model import environment_note
from harness.report.outcome import Outcome
from harness.report.words import shorten

__all__ = [
    "finding_lines",
    "headline",
    "summary_lines",
    "summary_wanted",
    "uncounted",
    "write_summary",
]

_WIDTH = 160
_RANK_STORY = re.compile(r"^rank \d+ (raised|crashed|hung|timed out)\b")


def _notes(config: pytest.Config, report: Report) -> list[str]:
    lines = []
    directory = config.getoption("conformance_report")
    if directory:
        out = Path(directory)
        names = ("summary.md", "report.html", "report.json", "report.md")
        lines.append("report: " + ", ".join(str(out / name) for name in names))
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
    fixed = [c.id for c in report.checks if c.fixed]
    if fixed:
        lines.append(
            f"--expected-failures: {len(fixed)} listed checks now pass (fixed), remove their "
            f"lines: {', '.join(fixed)}"
        )
    listed = set(report.expected_failures.get("listed", []))
    refused = (Outcome.UNSUPPORTED, Outcome.ENVIRONMENT)
    stale = [c.id for c in report.checks if c.id in listed and c.outcome in refused]
    if stale:
        lines.append(
            f"--expected-failures: {len(stale)} listed checks are unsupported or environment "
            f"now (stale), remove their lines: {', '.join(stale)}"
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


def _why(check: Any, outcome: str, report: Report) -> str:
    """Why a check did not pass, in one line: for a failed or blocked check, its finding's
    headline (what is wrong first, as the findings above say it); else (a hang's or a
    desync's story, an error, a reason) its failure's first line."""
    finding = next((f for f in report.findings if f.id == check.finding), None)
    if finding is None or outcome not in ("failed", "blocked"):
        return headline(check.failure)
    return f"{finding.id}: {unprefixed(finding.message, finding.clauses)}"


def _clip(line: str) -> str:
    return shorten(line, _WIDTH)


def finding_lines(report: Report) -> list[str]:
    """``N findings``, then per finding: its clauses, message, place, checks, reproducer."""
    if not report.findings:
        return []
    first = min(f.found_after_s for f in report.findings)
    lines = [f"{len(report.findings)} findings (first failure after {first:.1f} s):"]
    for f in report.findings:
        late = " (after the checks' properties: their verdicts stand)" if f.late else ""
        message = unprefixed(f.message, f.clauses)
        lines.append(f"  {f.id} {', '.join(f.clauses)}: {message}{late}")  # whole: the point
        if f.where:
            raised = f" (raised in {f.raised_in})" if f.raised_in else ""
            lines.append(_clip(f"     at {f.where}{raised}"))
        shown = ", ".join(f.checks[:3]) + (
            f" (+{len(f.checks) - 3} more)" if len(f.checks) > 3 else ""
        )
        lines.append(_clip(f"     {len(f.checks)} checks: {shown}"))
        if f.reproduce:
            lines.append(f"     reproduce: {f.reproduce}")
    return lines


def summary_lines(config: pytest.Config, report: Report) -> list[str]:
    """Counts, the findings, one line per clause that did not pass (its worst check and
    why, per family where checks name one), notes."""
    clauses = clause_outcomes(report.checks, report.findings)
    by_family = clause_family_outcomes(report.checks, report.findings)
    counts = ", ".join(f"{n} {o}" for o, n in report.counts().items() if n)
    named = len([c for c in clauses if c != NO_CLAUSE])
    lines = [f"checks: {counts or 'none'} ({len(report.checks)} checks, {named} clauses)"]
    if report.coverage:
        lines.append(coverage_line(report.coverage))
        if report.coverage.get("by_clause"):
            lines.append(clause_coverage_line(report.coverage))
    lines += finding_lines(report)
    inapplicable = [c for c, (o, _) in clauses.items() if o == NOT_APPLICABLE]
    for clause, (outcome, members) in clauses.items():
        if outcome == NOT_APPLICABLE:
            continue  # one line below for all of them
        families = by_family.get(clause, {})
        split = " ".join(f"{fam}={o}" for fam, o in families.items()) if len(families) > 1 else ""
        if outcome == "passed":
            declared = declared_unsupported(members, reasons=False)
            notes = [f"declared unsupported: {', '.join(declared)}"] if declared else []
            if environment_note(clause, members):  # the checks that need another machine
                notes.append(environment_note(clause, members).strip(" ()") + " (not run here)")
            if notes:  # a strategy that offers part of the space: say which part it left
                lines.append(_clip(f"  {clause:<16} {'passed':<12} {'; '.join(notes)}"))
                if split and set(families.values()) != {"passed"}:  # a family it left out
                    lines.append(f"  {'':<16} {'':<12} by family: {split}")
            continue
        worst = next((c for c in members if c.clause_outcome(clause) == outcome), None)
        why = f"{worst.id}: {_why(worst, outcome, report)}" if worst else "see the findings"
        if outcome == "failed" and worst is None:
            why = next(
                (f"{f.id}: {f.message}" for f in report.findings if clause in f.clauses), why
            )
        lines.append(_clip(f"  {clause:<16} {outcome:<12} {why}"))
        if split:
            lines.append(f"  {'':<16} {'':<12} by family: {split}")
    if inapplicable:  # [Note: not applicable] in harness.report.model
        offered = ", ".join(f for f in FAMILIES if f not in refused_families(report.checks))
        lines.append(
            _clip(
                f"  not applicable ({len(inapplicable)} clause{'s' * (len(inapplicable) > 1)}; "
                f"the strategy offers only "
                f"{offered}): {', '.join(inapplicable)}"
            )
        )
    declared = declared_unsupported(report.checks)
    if declared:
        lines.append(_clip(f"declared unsupported by the strategy: {'; '.join(declared)}"))
    return lines + _notes(config, report)


def summary_wanted(config: pytest.Config, checks: Iterable[Any]) -> bool:
    """Whether the run is a conformance run: a shardcheck report option, or checks that
    declare clauses."""
    options = ("clauses", "expected_failures", "conformance_strict", "conformance_report")
    return any(config.getoption(o) for o in options) or any(c.clauses for c in checks)


def write_summary(terminalreporter: Any, config: pytest.Config, report: Report) -> None:
    """Write the summary section; under ``--conformance-strict`` also the verdict.

    A strict run with non-conforming checks also adds ``N nonconforming`` to pytest's last
    line, so that line is never green when the run fails (see
    :mod:`harness.conformance.outcomes.strict`).
    """
    tr = terminalreporter
    tr.section("shardcheck conformance")
    for line in summary_lines(config, report):
        tr.write_line(line)
    if not config.getoption("conformance_strict"):
        _write_late(tr, report)
        return
    decided = strict_verdict(report, bool(config.getoption("require_whole_space")))
    if decided.passed:
        tr.write_line(f"conformance-strict: {decided.sentence}")
        return
    tr.write_line(f"conformance-strict: FAILED: {decided.sentence}", red=True, bold=True)
    _count(tr, "nonconforming", uncounted(report, decided.nonconforming))


def uncounted(report: Report, ids: Iterable[str]) -> list[str]:
    """Those of ``ids`` that pytest's last line does not count already: a check whose
    outcome fails the run is a failed (or errored) test case there, so the strict verdict
    adds only the others (unsupported checks, checks not run, late findings)."""
    counted = {c.id for c in report.checks if Outcome(c.outcome).fails_run}
    return [i for i in ids if i not in counted]


def _write_late(tr: Any, report: Report) -> None:
    """Outside strict mode, say why a run whose test cases all passed still exits 1: a late
    finding the expected-failures file does not list (see docs/findings.md)."""
    expected = set(report.expected_failures.get("late_findings_expected", []))
    late = [f for f in report.findings if f.late and not set(f.clauses) <= expected]
    if not late:
        return
    ids = ", ".join(f"{f.id} ({', '.join(f.clauses)})" for f in late)
    tr.write_line(
        f"late findings fail the run: {ids} recorded after their checks' properties passed",
        red=True,
        bold=True,
    )
    _count(tr, "late finding", [f.id for f in late])


def _count(tr: Any, word: str, ids: list[str]) -> None:
    """Add ``len(ids)`` to pytest's last line as ``N word`` (nothing for none)."""
    if ids:
        tr.stats.setdefault(word, []).extend(
            SimpleNamespace(nodeid=i, when="call", outcome=word) for i in ids
        )
