"""``python -m harness.report baseline REPORT_DIR`` writes the file ``--expected-failures``
reads, and ``diff`` exits 1 only when something got worse."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.conformance.checks import load_expected_failures
from harness.report import CheckResult, FindingResult, Report, main, write_report


def _report(outcomes: dict[str, str], findings: list[FindingResult] | None = None) -> Report:
    checks = [
        CheckResult(
            id=cid,
            clauses=["CKPT-RT-1"],
            outcome=outcome,
            finding="F1" if outcome in ("failed", "blocked") else None,
            attributed_to=["CKPT-RT-1"] if outcome in ("failed", "blocked") else [],
        )
        for cid, outcome in outcomes.items()
    ]
    env = {"torch": "2.13.0", "python": "3.11", "backend": "gloo", "device": "cpu"}
    report = Report("0.1.0", env, {"factory": "team:make_strategy", "options": {}}, checks)
    report.findings = list(findings or [])
    return report


LOAD_BUG = FindingResult(
    id="F1",
    clauses=["CKPT-RT-1"],
    signature="CKPT-RT-1: AssertionError: optimizer['state'][…]: N where N was saved",
    message="CKPT-RT-1: optimizer['state'][…]['exp_avg']: float32(1,) where float32(4,) was saved",
)
TEARDOWN = FindingResult(
    id="F2",
    clauses=["API-8"],
    signature="API-8: RuntimeError: x",
    message="teardown raised",
    late=True,
)


def test_baseline_lists_each_nonconforming_check_with_its_finding(tmp_path: Path) -> None:
    outcomes = {
        "t.a[full]": "failed",
        "t.b[full]": "blocked",
        "t.c": "passed",
        "t.d": "unsupported",
    }
    write_report(_report(outcomes, [LOAD_BUG, TEARDOWN]), tmp_path)
    assert main(["baseline", str(tmp_path)]) == 0
    written = tmp_path / "expected-failures.txt"
    entries = load_expected_failures(str(written))
    assert sorted(entries) == ["finding:API-8", "t.a[full]", "t.b[full]"]
    # the clauses and headline, no finding number: it depends on what else failed
    assert entries["t.a[full]"] == (
        "CKPT-RT-1: optimizer['state'][…]['exp_avg']: float32(1,) where float32(4,) was saved"
    )
    assert entries["finding:API-8"] == "late: teardown raised"


def test_baseline_of_a_conforming_run_lists_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_report(_report({"t.c": "passed"}), tmp_path)
    assert main(["baseline", str(tmp_path / "report.json"), "-o", "-"]) == 0
    out = capsys.readouterr().out
    assert "nothing is expected to fail" in out
    assert all(line.startswith("#") for line in out.splitlines())


@pytest.mark.parametrize(
    ("old", "new", "findings", "status"),
    [
        ({"t.a": "passed"}, {"t.a": "failed"}, [LOAD_BUG], 1),  # passed, now fails
        ({"t.a": "failed"}, {"t.a": "failed"}, [LOAD_BUG], 1),  # same check, a new finding
        ({}, {"t.a": "failed"}, [], 1),  # a new check that fails
        ({"t.a": "failed"}, {"t.a": "passed"}, [], 0),  # fixed: better, not worse
        ({"t.a": "passed"}, {"t.a": "passed", "t.b": "passed"}, [], 0),  # a new check passes
        ({"t.a": "unsupported"}, {"t.a": "passed"}, [], 0),
    ],
)
def test_diff_exits_1_when_something_got_worse(
    tmp_path: Path,
    old: dict[str, str],
    new: dict[str, str],
    findings: list[FindingResult],
    status: int,
) -> None:
    was = _report(old)  # the old run had no finding
    write_report(was, tmp_path / "old")
    write_report(_report(new, findings), tmp_path / "new")
    assert main(["diff", str(tmp_path / "old"), str(tmp_path / "new")]) == status
