"""Triage of one session's failures: findings, clause isolation, and when to stop.

The conformance plugin hands every failing check's exception to :class:`Triage`, which gives
it its clause(s) and its finding (:mod:`~harness.conformance.findings.grouping`), makes the check
``blocked`` when another clause's violation kept it from its property, records violations
noted after a check's property (``harness.clause(..., after=True)``), steers shrinking
(:class:`~harness.conformance.outcomes.economy.ShrinkPolicy`) and stops a run whose first checks all
fail with one finding.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import pytest

from harness.conformance.findings.examples import finding_example
from harness.conformance.findings.grouping import Finding, Findings, kind_order
from harness.conformance.findings.one_cause import joined_clauses
from harness.conformance.findings.signatures import attribute, late_attribution
from harness.conformance.outcomes.checks import Check
from harness.conformance.outcomes.economy import SHRINK_SECONDS, ShrinkPolicy, attributed_clauses
from harness.report import CheckResult, FindingResult
from harness.verdicts.attribution import TRAINING_METHODS, LateViolation

__all__ = ["LATE_PREFIX", "SAME_FINDING_STOP", "Triage", "shrink_budget"]

#: an expected-failures line ``finding:CLAUSE  reason`` expects a late finding of CLAUSE
LATE_PREFIX = "finding:"
#: checks in a row that fail alike, with none passed, before the run stops (one bug everywhere)
SAME_FINDING_STOP = 3


def shrink_budget(config: pytest.Config) -> float | None:
    """The shrink budget of this run: ``--shrink-budget``, else the loaded profile's."""
    value = config.getoption("shrink_budget", None)
    if value is not None:
        return None if value <= 0 else float(value)
    from hypothesis import settings

    return SHRINK_SECONDS.get(settings.get_current_profile_name())


class Triage:
    """The session's findings and what follows from them.

    Args:
        expected_late: clauses whose late findings the expected-failures file accepts.
    """

    def __init__(self, expected_late: dict[str, str]) -> None:
        self.expected_late = expected_late
        self.findings = Findings()
        self.policy = ShrinkPolicy(None, self.findings)
        self.started = time.perf_counter()
        self.session: pytest.Session | None = None
        self.passed_any = False
        self.done: list[Check] = []  # checks that ended, in order

    def start(self, session: pytest.Session, budget_s: float | None) -> None:
        """The session began: start the clock (time to the first failure), set the budget."""
        self.session, self.started = session, time.perf_counter()
        self.policy.budget_s = budget_s

    def finished(self, check: Check) -> None:
        """A check ended (its teardown phase was reported)."""
        self.done.append(check)
        self.passed_any = self.passed_any or check.outcome == "passed"
        self._stop_if_one_bug_everywhere()

    def attribute(self, check: Check, exc: BaseException) -> Finding:
        """Give the check's failure its clause(s) and its finding."""
        attribution = self.findings.settle(attribute(exc, check.clauses), check.clauses)
        clauses, blocked_by = attributed_clauses(check.clauses, attribution)
        # a training step of a job that loaded a checkpoint ran on what the load left: a
        # known load finding explains it even when the step's own clause tagged it
        after_load = attribution.method in TRAINING_METHODS
        explained = self.findings.explaining(attribution) if not blocked_by or after_load else None
        same = self.findings.same_cause(attribution, clauses) if explained is None else None
        if explained is not None:
            # met looking through a method a finding already explains: blocked by it
            finding = explained
            blocked_by = next(c for c in attribution.through if c in finding.clauses)
            clauses = [blocked_by]
            finding.add_check(check.id)
        elif same is not None:
            # the same raise a finding of another clause holds ([Note: one cause, one finding])
            finding = same
            clauses, blocked_by = joined_clauses(finding.clauses, check.clauses)
            finding.add_check(check.id)
        else:
            elapsed = time.perf_counter() - self.started
            finding = self.findings.record(attribution, clauses, check.id, elapsed_s=elapsed)
        check.finding, check.failed_clauses, check.blocked_by = finding.id, clauses, blocked_by
        if finding.first_check != check.id:
            check.found_in = finding.first_check
        return finding

    def known_finding_line(self, check: Check) -> str:
        """For a failure an earlier check's finding already explains, the one line that
        points at it (printed instead of its traceback); else ``""``."""
        if not (check.found_in and check.finding):
            return ""
        finding = next((f for f in self.findings if f.id == check.finding), None)
        if finding is None:
            return ""
        how = f"blocked by {check.blocked_by}" if check.blocked_by else "failed"
        return (
            f"{how}: {finding.id} ({', '.join(finding.clauses)}), first found in "
            f"{finding.first_check}: {finding.attribution.message}"
        )

    def note_late(self, check: Check, noted: list[tuple[int, LateViolation]]) -> None:
        """Findings from violations recorded after the check's property (its verdict stands).

        Args:
            check: the check whose jobs reported them.
            noted: ``(rank, violation)`` pairs, from the harness session.
        """
        for _rank, violation in noted:
            elapsed = time.perf_counter() - self.started
            finding = self.findings.record(
                late_attribution(violation),
                [violation.clause],
                check.id,
                late=True,
                elapsed_s=elapsed,
            )
            if finding.id not in check.late_findings:
                check.late_findings.append(finding.id)

    def _stop_if_one_bug_everywhere(self) -> None:
        """Stop the run when the first checks all fail alike, with an error (not a suite's
        comparison), and none has passed."""
        ran = [c for c in self.done if c.outcome not in ("unsupported", "environment")]
        recent = ran[-SAME_FINDING_STOP:]
        if self.passed_any or len(recent) < SAME_FINDING_STOP or self.session is None:
            return
        if len({c.finding for c in recent}) != 1 or not recent[0].finding:
            return
        finding = next(f for f in self.findings if f.id == recent[0].finding)
        if finding.attribution.kind == "assertion":
            # a wrong value, not an error everywhere: the checks of other clauses still tell
            # the user something (a load bug fails every round trip, and only those)
            return
        self.session.shouldfail = (
            f"the first {len(ran)} checks that ran all failed with finding {finding.id} "
            f"({finding.signature}) and none passed: the strategy fails the same way "
            "everywhere; fix that and run again"
        )

    def late_unmatched(self) -> list[str]:
        """``finding:CLAUSE`` lines of the expected-failures file that no late finding met."""
        seen = {c for f in self.findings if f.seen_late for c in f.clauses}
        return sorted(f"{LATE_PREFIX}{c}" for c in self.expected_late if c not in seen)

    def finding_results(
        self,
        checks: list[CheckResult],
        texts: dict[str, str],
        params: Mapping[str, Mapping[str, str]] | None = None,
    ) -> list[FindingResult]:
        """The findings for the report (``texts``: each check's full failure text by id;
        ``params``: each check's parameters by id, the example of a finding without a
        Hypothesis example)."""
        params = params or {}
        by_id = {c.id: c for c in checks}
        results = []
        # worst kind first (lost data before a convention), found order within a kind
        for f in sorted(self.findings, key=lambda f: kind_order(f.kind)):
            first = by_id.get(f.first_check)
            results.append(
                FindingResult(
                    id=f.id,
                    clauses=list(f.clauses),
                    signature=f.signature,
                    message=f.attribution.message,
                    where=f.attribution.where,
                    raised_in=f.attribution.raised_in,
                    checks=list(f.checks),
                    example=finding_example(
                        texts.get(f.first_check, ""), f.first_check, params.get(f.first_check, {})
                    ),
                    reproduce=first.reproducer if first else "",
                    late=f.late,
                    found_after_s=f.found_after_s,
                    kind=f.kind,
                )
            )
        return results
