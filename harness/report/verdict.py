"""The run's verdict in one word and one sentence, for ``summary.md`` and ``report.html``.

``failed``: a check failed, desynced, hung, errored or was blocked (the outcomes that
:attr:`~harness.report.outcome.Outcome.fails_run`), or a violation was recorded
after a check's property that the expected-failures file does not expect (the run exits 1 on
each), or checks were unsupported where that does not conform (``nonconforming``: every
check, or any under ``--require-whole-space``; a check that failed as the expected-failures
file lists ran, so it counts as offered). ``incomplete``: none of that, but the run
stopped before some checks. ``passed``: every check that could run passed (or failed as
expected); the sentence names what did not run.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.report.model import NOT_RUN, Report, nonconforming
from harness.report.outcome import Outcome

__all__ = ["FAILING", "Verdict", "verdict"]

#: outcomes that fail the run whatever the options (:attr:`Outcome.fails_run`), worst first
FAILING = tuple(o.value for o in sorted(Outcome, key=lambda o: o.severity) if o.fails_run)


@dataclass(frozen=True)
class Verdict:
    """``word``: ``failed``, ``incomplete`` or ``passed``; ``sentence``: why."""

    word: str
    sentence: str


def _listing(counts: dict[str, int], outcomes: tuple[str, ...]) -> str:
    return ", ".join(f"{counts[o]} {o}" for o in outcomes if counts.get(o))


def verdict(report: Report) -> Verdict:
    """The verdict of ``report`` (see the module's docstring)."""
    counts = report.counts()
    total = len(report.checks)
    bad = sum(counts[o] for o in FAILING)
    expected = set(report.expected_failures.get("late_findings_expected", []))
    late = [f.id for f in report.findings if f.late and not set(f.clauses) <= expected]
    findings = len(report.findings)
    if bad:
        return Verdict(
            "failed",
            f"{bad} of {total} checks did not pass ({_listing(counts, FAILING)}); "
            f"{findings} finding{'s' if findings != 1 else ''}",
        )
    if late:
        return Verdict(
            "failed",
            f"every check passed, but findings {', '.join(late)} were recorded after their "
            "checks' properties",
        )
    if counts[NOT_RUN]:
        return Verdict(
            "incomplete", f"{counts[NOT_RUN]} of {total} checks did not run (the run stopped)"
        )
    whole = bool(report.run.get("require_whole_space"))
    refused = [c for c in nonconforming(report.checks, whole) if c.outcome == "unsupported"]
    if refused:  # see [Note: a strategy that offers a subset]
        why = (
            "--require-whole-space is given"
            if whole
            else "the strategy declared every check it met unsupported"
        )
        return Verdict("failed", f"{len(refused)} of {total} checks unsupported and {why}")
    rest = _listing(counts, ("xfailed", "unsupported", "environment"))
    return Verdict(
        "passed",
        f"{counts['passed']} of {total} checks passed" + (f"; {rest}" if rest else ""),
    )
