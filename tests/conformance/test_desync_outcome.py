"""Desyncs and hangs are verdicts of their own kind in the conformance report."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.conformance.outcomes.checks import classify_report
from harness.report import CONFORMING, SEVERITY, CheckResult, clause_outcomes


def _failed_call(message: str) -> SimpleNamespace:
    crash = SimpleNamespace(message=message)
    return SimpleNamespace(
        when="call",
        passed=False,
        skipped=False,
        longrepr=SimpleNamespace(reprcrash=crash),
        longreprtext=message,
    )


@pytest.mark.parametrize(
    "message,outcome",
    [
        ("harness.verdicts.failures.CollectiveDesync: desync: rank 0 entered BARRIER", "desync"),
        ("CollectiveDesync: desync: rank 1 entered ALLREDUCE shapes=[4, 2]", "desync"),
        ("harness.verdicts.failures.CollectiveHang: rank(s) 1 finished; rank 0 waits", "hang"),
        ("AssertionError: CollectiveDesync was expected", "failed"),
        ("harness.verdicts.outcomes.RankFailure: rank 1 raised", "failed"),
    ],
)
def test_the_exception_type_names_the_outcome(message: str, outcome: str) -> None:
    assert classify_report(_failed_call(message)) == (outcome, message)


def test_desync_and_hang_fail_strict_runs_and_outrank_errors() -> None:
    assert not {"desync", "hang"} & CONFORMING
    assert SEVERITY.index("failed") < SEVERITY.index("desync") < SEVERITY.index("error")
    checks = [
        CheckResult("t.test_a", ["CKPT-STRICT-2"], "error"),
        CheckResult("t.test_b", ["CKPT-STRICT-2"], "desync"),
        CheckResult("t.test_c", ["CKPT-STRICT-2"], "passed"),
    ]
    outcome, members = clause_outcomes(checks)["CKPT-STRICT-2"]
    assert outcome == "desync" and len(members) == 3
