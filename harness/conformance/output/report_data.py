"""The conformance report of one session (:class:`harness.report.Report`), built from its
checks, its findings and the facts of the run.

The plugin (:class:`harness.conformance.session.ConformancePlugin`) builds it at the end of
the session from what it kept; :mod:`harness.report` writes it (``report.json``,
``report.md``, ``summary.md``, ``report.html``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

import pytest

from harness.conformance.outcomes.checks import Check
from harness.conformance.outcomes.triage import Triage
from harness.conformance.output import facts
from harness.conformance.output.coverage import coverage_of
from harness.report import NOT_RUN, CheckResult, Report
from harness.report.cost import cost_of
from harness.report.outcome import Outcome
from harness.run.session import HarnessSession

__all__ = ["build_report"]


def _joins(check: Check) -> bool:
    """Whether the check's outcome makes it part of a finding."""
    return Outcome(check.outcome or Outcome.ERROR).joins_finding


def _result(config: pytest.Config, check: Check) -> CheckResult:
    """One check's entry in the report."""
    return CheckResult(
        id=check.id,
        clauses=list(check.clauses),
        outcome=check.outcome or "error",
        duration_s=round(check.duration_s, 4),
        failure=check.failure,
        reproducer=facts.reproducer(config, check.nodeid, check.text),
        finding=check.finding or None if _joins(check) else None,
        attributed_to=list(check.failed_clauses) if _joins(check) else [],
        family=check.family,
        rank_jobs=check.rank_jobs,
        unsupported=list(check.unsupported),
    )


def build_report(
    config: pytest.Config,
    checks: Collection[Check],
    triage: Triage,
    harness: HarnessSession,
    *,
    selection: Mapping[str, Any],
    expected_failures: Mapping[str, Any],
    started_at: datetime,
    wall_time_s: float,
) -> Report:
    """The report of a session, from its checks as they stand.

    Args:
        config: the run's config.
        checks: the session's checks (deselected ones left out), in collection order.
        triage: the session's findings.
        harness: the run's harness session (its configuration space, costs, pools).
        selection: the report's ``selection`` (``--clauses``, what it deselected).
        expected_failures: the report's ``expected_failures`` (the file, what it listed).
        started_at: when the session started (timezone-aware, UTC).
        wall_time_s: seconds from the session's start until now.
    """
    results = [_result(config, c) for c in checks]
    skipped = ("environment", "error", NOT_RUN)
    ran = [c for c in checks if c.outcome not in skipped]
    return Report(
        suite_version=facts.suite_version(),
        environment=facts.environment(config, (s for c in ran for s in c.world_sizes)),
        strategy=facts.strategy(config),
        checks=results,
        selection=dict(selection),
        expected_failures=dict(expected_failures),
        findings=triage.finding_results(
            results, {c.id: c.text for c in checks}, {c.id: c.params for c in checks}
        ),
        coverage=coverage_of(checks, harness.universe),
        cost=cost_of(harness.costs),
        run=facts.run(config, started_at, wall_time_s),
    )
