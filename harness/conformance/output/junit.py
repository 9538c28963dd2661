"""Clause ids, outcomes and findings in pytest's ``--junitxml`` test cases.

pytest's junitxml plugin writes a test case's ``<properties>`` from the ``user_properties``
of the report it closes the test case with: the teardown phase's report, or the call phase's
when both the call and the teardown failed (then the teardown gets a test case of its own).
A report takes a copy of ``item.user_properties`` when it is made, so:

- what is known at collection (the check id, its clauses) goes on the item
  (:func:`collected`), and every phase's report carries it;
- what is known once a phase is over (the check's shardcheck outcome, its finding) goes on
  that phase's report (:func:`annotate`), from the conformance plugin's
  ``pytest_runtest_logreport``, which runs before junitxml's (``tryfirst``) and after the
  phase was folded into the check.

The properties: ``check`` (the check id), ``clauses`` (comma-separated), ``outcome`` (the
shardcheck outcome: ``blocked``, ``unsupported``... where JUnit says only failure or
skipped), ``finding`` (``F3``, for the outcomes that
:attr:`~harness.report.outcome.Outcome.joins_finding`),
``attributed_to`` (the clauses the failure broke) and ``late_findings`` (findings recorded
after the check's property).
"""

from __future__ import annotations

from typing import Any

from harness.conformance.outcomes.checks import Check
from harness.report.outcome import Outcome

__all__ = ["annotate", "collected", "outcome_properties"]


def collected(item: Any, check: Check) -> None:
    """Put what collection knows on the item: its check id and its clauses."""
    item.user_properties.append(("check", check.id))
    if check.clauses:
        item.user_properties.append(("clauses", ",".join(check.clauses)))


def outcome_properties(check: Check) -> list[tuple[str, str]]:
    """The check's outcome as it stands, its finding and the clauses its failure broke."""
    if check.outcome is None:
        return []
    properties = [("outcome", check.outcome)]
    if Outcome(check.outcome).joins_finding and check.finding:
        properties.append(("finding", check.finding))
        if check.failed_clauses:
            properties.append(("attributed_to", ",".join(check.failed_clauses)))
    if check.late_findings:
        properties.append(("late_findings", ",".join(check.late_findings)))
    return properties


def annotate(report: Any, check: Check) -> None:
    """Add the check's outcome properties to a report junitxml may close a test case with
    (teardown; a failed call, whose teardown may fail too)."""
    if report.when == "teardown" or (report.when == "call" and report.failed):
        report.user_properties.extend(outcome_properties(check))
