"""Each finding says what kind of failure it is, and the report lists the worst kinds first."""

from __future__ import annotations

from harness.conformance.findings.grouping import KINDS, failure_kind
from harness.conformance.findings.signatures import Attribution
from harness.conformance.outcomes.checks import Check
from harness.conformance.outcomes.triage import Triage
from harness.report import CheckResult


def _a(kind: str, message: str, method: str = "", clause: str = "") -> Attribution:
    return Attribution(clause, kind, "AssertionError", message, "", message, method=method)


def test_each_kind_of_failure_is_told_apart() -> None:
    cases = [
        (_a("assertion", "optimizer['state'][…]: N of N elements differ"), ["CKPT-RT-1"]),
        (_a("assertion", "gathered parameters: 3 of 4 elements differ"), ["TRAIN-1"]),
        (_a("assertion", "gathered parameters differ between ranks"), ["SHARD-2"]),
        (_a("hung", "the rank did not answer before its deadline"), ["API-5"]),
        (_a("raised", "Detected mismatch between collectives on ranks"), ["CKPT-RT-2"]),
        (_a("crashed", "rank crashed: exit code -11"), ["CLIP-1"]),
        (_a("raised", "stack expects each tensor to be equal size"), ["API-4"]),
        (_a("raised", "Attempting to broadcast"), ["CKPT-RT-1"]),  # a load or the step after it
        (
            _a("assertion", "the directory held ['ckpt'] before, ['ckpt', 'x'] after"),
            ["CKPT-SAVE-6"],
        ),
        (
            _a("assertion", "strict=True, unexpected model keys: nothing was raised"),
            ["CKPT-STRICT-1"],
        ),
        (_a("assertion", "checkpoint_io was readable"), ["API-7"]),
        (_a("assertion", "rank 1 holds 4.1 MiB of gradients, its share 1.0 MiB"), ["MEM-1"]),
        (
            _a("assertion", "optimizer 0 is not in the standard form (ids 0..n-1 ...)"),
            ["CKPT-TRAINER-1"],  # the data is there, keyed by names: a layout convention
        ),
    ]
    kinds = [failure_kind(attribution, clauses) for attribution, clauses in cases]
    assert kinds == [
        "lost or corrupted data",
        "wrong result",
        "race between ranks",
        "hang or desync",
        "hang or desync",
        "crash",
        "crash",
        "lost or corrupted data",
        "leftover files",
        "refusal with the wrong exception",
        "convention",
        "cost",
        "convention",
    ]
    assert set(kinds) == set(KINDS)


def test_the_report_lists_findings_worst_kind_first() -> None:
    def fail(check_id: str, clause: str, message: str) -> None:
        check = Check(id=check_id, nodeid=check_id, clauses=[clause])
        try:
            raise AssertionError(f"{clause}: {message}")
        except AssertionError as exc:
            triage.attribute(check, exc.with_traceback(None))
        checks.append(CheckResult(id=check_id, clauses=[clause], outcome="failed"))

    triage, checks = Triage({}), []
    fail("t.strict", "CKPT-STRICT-1", "unexpected model keys: nothing was raised")
    fail("t.clip", "CLIP-1", "clip norms: 1 of 2 elements differ")
    fail("t.rt", "CKPT-RT-1", "optimizer['state']['w']['exp_avg']: 1 of 4 elements differ")
    results = triage.finding_results(checks, {})
    assert [(f.id, f.kind) for f in results] == [
        ("F3", "lost or corrupted data"),
        ("F2", "wrong result"),
        ("F1", "refusal with the wrong exception"),
    ]
