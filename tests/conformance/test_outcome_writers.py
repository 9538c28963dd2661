"""Every writer agrees with :class:`harness.report.outcome.Outcome` on what fails, what joins a
finding and what counts against a clause: one report holding every outcome, desync and hang
included, rendered by the terminal summary, ``summary.md``, ``report.md``, ``report.html``,
the JUnit properties and ``report.json``."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest

from harness.conformance.outcomes.checks import Check
from harness.conformance.output import junit
from harness.conformance.output.summary import summary_lines
from harness.report import (
    CheckResult,
    FindingResult,
    Report,
    clause_outcomes,
    render_html,
    render_markdown,
    render_summary,
    verdict,
)
from harness.report.outcome import CHECK_OUTCOMES, Outcome
from harness.report.verdict import FAILING

if TYPE_CHECKING:
    from tests.conformance.conftest import Run

RunSuite = Callable[..., "Run"]

#: one check per outcome, each under a clause of its own (``C-<outcome>``)
FINDING_OF = {"failed": "F1", "desync": "F2", "hang": "F3", "blocked": "F1", "xfailed": "F4"}


def _check(outcome: Outcome) -> CheckResult:
    word = outcome.value.replace(" ", "_")
    return CheckResult(
        id=f"test_all.test_{word}",
        clauses=[f"C-{word}"],
        outcome=outcome.value,
        failure=None if outcome is Outcome.PASSED else f"why {word}",
        reproducer=f"pytest test_all.py::test_{word}",
        finding=FINDING_OF.get(outcome.value),
    )


def every_outcome() -> Report:
    checks = [_check(o) for o in CHECK_OUTCOMES]
    pairs = (("failed", "F1"), ("desync", "F2"), ("hang", "F3"), ("xfailed", "F4"))
    findings = [
        FindingResult(fid, [f"C-{w}"], f"sig {fid}", f"msg {fid}", checks=[f"test_all.test_{w}"])
        for w, fid in pairs
    ]
    return Report("0.1.0", {"torch": "2.x"}, {"factory": "m:f", "options": {}}, checks,
                  findings=findings)  # fmt: skip


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def test_the_outcome_type_tells_each_rule() -> None:
    assert {o.value for o in Outcome if o.fails_run} == set(FAILING)
    assert {o for o in Outcome if o.fails_run} == {
        Outcome.FAILED, Outcome.DESYNC, Outcome.HANG, Outcome.ERROR, Outcome.BLOCKED
    }  # fmt: skip
    assert Outcome.DESYNC.joins_finding and Outcome.HANG.joins_finding
    assert not Outcome.ERROR.joins_finding
    assert not Outcome.ENVIRONMENT.counts_against_clause
    assert not Outcome.UNSUPPORTED.counts_against_clause
    assert Outcome.XFAILED.conforms() and not Outcome.UNSUPPORTED.conforms(whole_space=True)


def test_report_md_lists_every_failure_desync_and_hang_included() -> None:
    failures = _section(render_markdown(every_outcome()), "Failures")
    for outcome in CHECK_OUTCOMES:
        heading = f"### test_all.test_{outcome.value.replace(' ', '_')}: {outcome.value}"
        assert (heading in failures) == outcome.is_failure, outcome
    assert "### test_all.test_desync: desync (C-desync, finding F2)" in failures
    assert "### test_all.test_hang: hang (C-hang, finding F3)" in failures


def test_summary_md_names_the_desync_and_the_hang() -> None:
    report = every_outcome()
    text = render_summary(report)
    assert text.startswith("## shardcheck conformance: FAILED\n")
    assert "1 failed, 1 desync, 1 hang, 1 error, 1 blocked" in verdict(report).sentence
    for outcome in CHECK_OUTCOMES:
        row = f"| C-{outcome.value.replace(' ', '_')} | {outcome.value} |"
        # a clause whose only check did not pass has a row, whatever the outcome
        assert (row in text) == (outcome is not Outcome.PASSED), outcome
    assert "| `test_all.test_desync` |" in text and "| `test_all.test_hang` |" in text


def test_terminal_summary_names_the_desync_and_the_hang() -> None:
    config = SimpleNamespace(getoption=lambda name, default=None: None)
    lines = summary_lines(config, every_outcome())  # type: ignore[arg-type]
    assert any(line.split()[:2] == ["C-desync", "desync"] for line in lines)
    assert any(line.split()[:2] == ["C-hang", "hang"] for line in lines)
    assert any("test_all.test_hang: why hang" in line for line in lines)


def test_html_colours_each_outcome_by_the_same_rule() -> None:
    page = render_html(every_outcome())
    assert '<span class="o o-bad">desync</span>' in page
    assert '<span class="o o-bad">hang</span>' in page
    assert '<span class="o o-warn">blocked</span>' in page
    assert '<span class="o o-idle">environment</span>' in page


@pytest.mark.parametrize("outcome", CHECK_OUTCOMES, ids=lambda o: o.value)
def test_junit_gives_a_finding_to_the_outcomes_that_join_one(outcome: Outcome) -> None:
    check = Check("test_all.test_x", "test_all.py::test_x", ["C-x"])
    check.settle(outcome.value, "why")
    check.finding = "F9"
    properties = dict(junit.outcome_properties(check))
    assert properties["outcome"] == outcome.value
    assert ("finding" in properties) == outcome.joins_finding


def test_report_json_agrees() -> None:
    document = json.loads(json.dumps(every_outcome().to_dict()))
    assert document["counts"] == {o.value: 1 for o in CHECK_OUTCOMES}
    assert document["clauses"]["C-desync"] == "desync" and document["clauses"]["C-hang"] == "hang"
    findings = {c["id"]: c["finding"] for c in document["checks"] if c["finding"]}
    assert findings["test_all.test_desync"] == "F2" and findings["test_all.test_hang"] == "F3"


def test_environment_does_not_count_against_checks_that_passed() -> None:
    """A clause whose runnable checks passed and whose other checks need another machine
    reads passed, with the environment checks noted (summary.md, terminal, report.md)."""
    checks = [
        CheckResult("t.test_cpu", ["TRAIN-1"], "passed"),
        CheckResult("t.test_cuda", ["TRAIN-1"], "environment", failure="environment: no GPU"),
        CheckResult("t.test_gpu_only", ["PREC-9"], "environment", failure="environment: no GPU"),
    ]
    report = Report("0.1.0", {}, {"factory": "m:f", "options": {}}, checks)
    table = clause_outcomes(report.checks)
    assert table["TRAIN-1"][0] == "passed" and table["PREC-9"][0] == "environment"
    assert "Passed (1): TRAIN-1 (1 environment)" in render_summary(report)
    config = SimpleNamespace(getoption=lambda name, default=None: None)
    lines = summary_lines(config, report)  # type: ignore[arg-type]
    assert any(
        line.split()[:2] == ["TRAIN-1", "passed"] and "1 environment" in line for line in lines
    )
    assert "| TRAIN-1 | passed | 2 | t.test_cuda (environment) |" in render_markdown(report)


# -- end to end: a run with a desync and a hang -----------------------------------------------

DESYNC_AND_HANG = """
import pytest
from harness.verdicts.failures import CollectiveDesync, CollectiveHang
from harness.verdicts.outcomes import Outcome, RemoteError

def ranks(kind):
    error = RemoteError("RuntimeError", "mismatched collectives", "") if kind == "raised" else None
    return [Outcome(0, kind, error=error, detail="waits in ALLREDUCE"), Outcome(1, "ok")]

@pytest.mark.clause("SYNC-1")
def test_desync():
    message = "desync: rank 0 entered BARRIER, rank 1 entered ALLREDUCE"
    raise CollectiveDesync(message, ranks("raised"))

@pytest.mark.clause("CKPT-SAVE-5")
def test_hang():
    raise CollectiveHang("rank(s) 1 finished; rank 0 waits in ALLREDUCE", ranks("hung"))

@pytest.mark.clause("API-1")
def test_fine():
    pass
"""


def test_a_run_with_a_desync_and_a_hang_shows_both_in_every_writer(run_suite: RunSuite) -> None:
    run = run_suite(DESYNC_AND_HANG, "--junitxml", "junit.xml")
    assert run.ret == pytest.ExitCode.TESTS_FAILED
    assert run.outcomes() == {
        "test_fake.test_desync": "desync",
        "test_fake.test_hang": "hang",
        "test_fake.test_fine": "passed",
    }
    failures = _section(run.markdown(), "Failures")
    assert "### test_fake.test_desync: desync (SYNC-1" in failures
    assert "### test_fake.test_hang: hang (CKPT-SAVE-5" in failures
    summary = (run.report_dir / "summary.md").read_text()
    assert summary.startswith("## shardcheck conformance: FAILED\n")
    assert "(1 desync, 1 hang)" in summary
    assert "| SYNC-1 | desync |" in summary and "| CKPT-SAVE-5 | hang |" in summary
    run.result.stdout.fnmatch_lines(["*SYNC-1*desync*test_fake.test_desync*"])
    root = ET.parse(run.report_dir.parent / "junit.xml").getroot()
    cases = {c.get("name"): c for c in root.iter("testcase")}
    for name, outcome in (("test_desync", "desync"), ("test_hang", "hang")):
        case = cases[name]
        assert case.find("failure") is not None, name
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert properties["outcome"] == outcome and properties.get("finding"), properties
