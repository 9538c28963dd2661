"""``python -m harness.report baseline REPORT_DIR`` writes the file ``--expected-failures``
reads, and ``diff`` exits 1 only when something got worse."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.conformance.outcomes.checks import load_expected_failures
from harness.report import CheckResult, FindingResult, Report, main, write_report
from harness.report.baseline import baseline_lines, steady
from harness.report.model import FAILED_WITH, LISTED_PREFIX, XPASS_PREFIX

#: what a listed check that passed reads in a report (its outcome is ``failed``)
XPASS = f"{XPASS_PREFIX} (strict xpass): {LISTED_PREFIX}F1 (CKPT-RT-1, failed): lr differs"


def _check(cid: str, outcome: str) -> CheckResult:
    """A check of CKPT-RT-1; ``xpass``: one the expected-failures file lists that passed."""
    if outcome == "xpass":
        return CheckResult(id=cid, clauses=["CKPT-RT-1"], outcome="failed", failure=XPASS)
    failing = outcome in ("failed", "blocked")
    return CheckResult(
        id=cid,
        clauses=["CKPT-RT-1"],
        outcome=outcome,
        finding="F1" if failing else None,
        attributed_to=["CKPT-RT-1"] if failing else [],
    )


def _report(outcomes: dict[str, str], findings: list[FindingResult] | None = None) -> Report:
    checks = [_check(cid, outcome) for cid, outcome in outcomes.items()]
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
        ({"t.a": "xfailed"}, {"t.a": "xpass"}, [], 0),  # a listed check passes: a fix
        ({"t.a": "xfailed"}, {"t.a": "passed"}, [], 0),  # and its line is gone
        ({"t.a": "failed"}, {"t.a": "xfailed"}, [], 0),  # listed now
        ({"t.a": "xfailed"}, {"t.a": "failed"}, [], 0),  # unlisted, failing as it did
        # stale: a listed check refused now; worse only where its clause has no check left
        ({"t.a": "xfailed", "t.b": "passed"}, {"t.a": "unsupported", "t.b": "passed"}, [], 0),
        ({"t.a": "xfailed"}, {"t.a": "environment"}, [], 1),
        ({"t.a": "passed"}, {"t.a": "unsupported"}, [], 1),  # its clause untested now
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


def test_baseline_leaves_out_a_fixed_check_and_nests_no_earlier_reason() -> None:
    """A listed check that passed (a strict xpass) is a fix: no line; a listed check that
    failed again reads the failure it met, not ``expected failure: <the old reason>; ...``."""
    listed = "CKPT-RT-1: lr differs in <tmp>/ckpt"
    again = (
        f"{LISTED_PREFIX}{listed}{FAILED_WITH}AssertionError: lr differs in /tmp/tmpq1w2e3r4/ckpt"
    )
    report = _report({"t.fixed": "xpass", "t.again": "xfailed", "t.new": "failed"})
    report.checks[1].failure = again
    report.findings = [LOAD_BUG]
    lines = baseline_lines(report)
    assert [line.split()[0] for line in lines] == ["t.again", "t.new"]
    assert lines[0] == "t.again  AssertionError: lr differs in <tmp>/ckpt"
    assert not any("expected failure" in line or "passed although" in line for line in lines)


@pytest.mark.parametrize(
    ("text", "steady_text"),
    [
        ("in /tmp/pytest-of-root/pytest-12/test_rt0/ckpt", "in <tmp>/test_rt0/ckpt"),
        ("in /tmp/tmpab12_xyz/state.pt", "in <tmp>/state.pt"),
        ("/scratch/shardcheck-k2j3h4g5/jobs/job-42/ckpt: bad", "<tmp>/ckpt: bad"),
        ("job 4: rank 1 raised X after 0.08 s", "job N: rank 1 raised X after N s"),
        ("store 127.0.0.1:29500 refused", "store HOST:PORT refused"),
        ("at /home/me/mypkg/strategy.py", "at /home/me/mypkg/strategy.py"),  # the strategy's own
    ],
)
def test_a_reason_masks_what_changes_from_run_to_run(text: str, steady_text: str) -> None:
    assert steady(text) == steady_text
