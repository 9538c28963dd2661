"""The files beside ``report.json``: ``summary.md`` (capped), ``report.html`` (self-contained),
and ``report.json``'s ``run`` facts; built from synthetic reports, no ranks."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.report import (
    SUMMARY_LIMIT,
    CheckResult,
    FindingResult,
    Report,
    load_report,
    render_html,
    render_summary,
    verdict,
    write_report,
)
from harness.report.matrix import COVERED, NEVER, OUTSIDE, REACHED, coverage_matrix

NASTY = "<script>alert('x')</script> & </td> | `tick` ```fence```"
RUN = {
    "hypothesis_profile": "ci",
    "hypothesis_seed": 12,
    "started_at": "2026-01-02T03:04:05Z",
    "wall_time_s": 61.5,
}
COVERAGE = {
    "pairs_covered": 3,
    "pairs_supported": 4,
    "pairs_declared": 6,
    "never_reached": [["precision", "16-true", "world_size", "4"]],
    "never_reached_count": 1,
    "values": {"precision": ["32-true", "bf16-mixed"], "world_size": ["2", "4"]},
    "by_axes": [
        {"axes": ["precision", "world_size"], "covered": 3, "supported": 4, "missing": []}
    ],
    "by_clause": {
        "CKPT-RT-1": {
            "precision": {"covered": ["32-true"], "reached": ["32-true", "bf16-mixed"],
                          "never": ["16-true"]},
            "world_size": {"covered": ["2", "4"], "reached": ["2", "4"], "never": []},
        },
        "TRAIN-1": {"world_size": {"covered": ["2"], "reached": ["2"], "never": []}},
    },
}  # fmt: skip


def small_report(**overrides: object) -> Report:
    checks = [
        CheckResult("test_ckpt.test_rt[fsdp-full]", ["CKPT-RT-1"], "failed", failure=NASTY,
                    finding="F1", attributed_to=["CKPT-RT-1"], family="fsdp"),
        CheckResult("test_ckpt.test_rt[mp-full]", ["CKPT-RT-1"], "passed",
                    family="model_parallel"),
        CheckResult("test_train.test_parity", ["TRAIN-1"], "passed"),
        CheckResult("test_train.test_clip", ["CLIP-1"], "unsupported",
                    failure="unsupported: clip=norm (no)"),
    ]  # fmt: skip
    findings = [
        FindingResult("F1", ["CKPT-RT-1"], "CKPT-RT-1: AssertionError: x", NASTY,
                      where="mine.py:3 load", checks=[checks[0].id],
                      example="Failing test case: test_rt(\n    n=7,\n)", reproduce="pytest x")
    ]  # fmt: skip
    report = Report(
        "0.1.0",
        {"torch": "2.13.0", "python": "3.11.7", "backend": "gloo", "device": "cpu",
         "world_sizes": [2, 4]},
        {"factory": "mine:make_strategy", "options": {}},
        checks, findings=findings, coverage=COVERAGE, run=dict(RUN),
    )  # fmt: skip
    for key, value in overrides.items():
        setattr(report, key, value)
    return report


def huge_report(checks: int, findings: int) -> Report:
    """Thousands of failing checks over hundreds of clauses, each with its own finding, and
    long messages full of characters Markdown and HTML care about."""
    results = [
        CheckResult(
            f"test_suite_{i % 50}.test_property_with_a_long_name[fsdp-FULL_SHARD-bf16-mixed-{i}]",
            [f"CLAUSE-{i % 400}", f"OTHER-{i % 300}"],
            "failed" if i % 7 else "blocked",
            failure=f"AssertionError: rank {i}: {NASTY} " + "x" * 500,
            finding=f"F{i % findings + 1}",
        )
        for i in range(checks)
    ]
    found = [
        FindingResult(
            f"F{j + 1}", [f"CLAUSE-{j % 400}"], f"sig {j}", f"message {j}: {NASTY} " + "y" * 400,
            checks=[c.id for c in results[j::findings]], example="Failing test case: t(\n)",
        )
        for j in range(findings)
    ]  # fmt: skip
    return Report("0.1.0", {"torch": "2.13.0"}, {"factory": "m:f", "options": {}}, results,
                  findings=found, run=dict(RUN))  # fmt: skip


# -- summary.md -----------------------------------------------------------------------------


def test_summary_of_a_small_run_has_verdict_findings_clauses_and_pointer() -> None:
    text = render_summary(small_report())
    assert text.startswith("## shardcheck conformance: FAILED\n")
    assert "1 of 4 checks did not pass (1 failed); 1 finding." in text
    assert "profile `ci` · seed 12 · started 2026-01-02T03:04:05Z · 61.5 s" in text
    row = next(line for line in text.splitlines() if line.startswith("| F1 |"))
    assert row.startswith("| F1 |  | CKPT-RT-1 | ``") and row.endswith(
        "| `test_ckpt.test_rt[fsdp-full]` | 1 |"
    )
    assert "\\|" in row  # the pipe of the message does not split the table
    clause = next(line for line in text.splitlines() if line.startswith("| CKPT-RT-1 |"))
    assert "fsdp=failed, model_parallel=passed" in clause and "1 of 2" in clause
    assert "\n| CLIP-1 | unsupported |" in text  # its only check was declared unsupported
    assert "Passed (1): TRAIN-1" in text
    assert "`report.md`" in text and "`report.html`" in text


def test_summary_stays_under_the_cap_with_thousands_of_failures() -> None:
    report = huge_report(checks=6000, findings=1500)
    text = render_summary(report)
    assert len(text.encode()) <= SUMMARY_LIMIT < 64 * 1024
    lines = text.splitlines()
    findings = [line for line in lines if re.match(r"\| F\d+ \|", line)]
    assert 10 < len(findings) < 1500  # as many as fit, not none
    assert re.search(r"^\.\.\. and \d+ more findings \(see report\.md\)$", text, re.M)
    shown = int(re.search(r"and (\d+) more findings", text).group(1))  # type: ignore[union-attr]
    assert len(findings) + shown == 1500
    assert re.search(r"^\.\.\. and \d+ more clauses \(see report\.md\)$", text, re.M)
    assert text.startswith("## shardcheck conformance: FAILED")
    assert text.rstrip().endswith("`python -m harness.report diff OLD.json NEW.json`).")
    assert max(len(line) for line in lines) < 1000  # every cell clipped


def test_summary_cut_holds_any_limit_and_refuses_a_useless_one() -> None:
    report = huge_report(checks=300, findings=100)
    for limit in (1000, 3000, 20_000):
        assert len(render_summary(report, limit).encode()) <= limit
    with pytest.raises(ValueError, match=r"limit=10 bytes is too small; pass at least 1000"):
        render_summary(report, 10)


def test_verdict_words() -> None:
    assert verdict(small_report()).word == "failed"
    passing = small_report(findings=[])
    passing.checks = [c for c in passing.checks if c.outcome != "failed"]
    assert verdict(passing).word == "passed"
    assert verdict(passing).sentence == "2 of 3 checks passed; 1 unsupported"
    passing.checks.append(CheckResult("t.stopped", ["API-1"], "not run"))
    assert verdict(passing).word == "incomplete"


# -- report.html ------------------------------------------------------------------------------


class _Page(HTMLParser):
    """Collects tags, links to anything outside the page, and the text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.external: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.external.append(value)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_html_is_self_contained_escaped_and_has_every_part() -> None:
    page = render_html(small_report())
    parser = _Page()
    parser.feed(page)
    assert page.startswith("<!DOCTYPE html>")
    assert "script" not in parser.tags and "link" not in parser.tags and "img" not in parser.tags
    assert parser.external == [] and "http" not in page and "@import" not in page
    assert "<script>" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    text = "".join(parser.text)
    assert NASTY in text  # the message reads as it was, once unescaped
    for part in ("FAILED", "Findings (1)", "Clauses (3)", "Configuration coverage",
                 "Checks that did not pass (2)", "Failing test case: test_rt("):  # fmt: skip
        assert part in text
    assert '<td class="c-covered" title="CKPT-RT-1 precision=32-true: covered">' in page
    assert '<td class="c-never" title="CKPT-RT-1 precision=16-true: never reached">' in page
    assert '<td class="c-reached" title="CKPT-RT-1 precision=bf16-mixed: not passed">' in page


def test_html_of_a_run_without_coverage_or_findings() -> None:
    report = small_report(findings=[], coverage={}, run={})
    page = render_html(report)
    assert "No job of this run reported its configuration axes." in page
    assert "<h2>Findings</h2>" in page and "<p>None.</p>" in page


def test_coverage_matrix_states() -> None:
    matrix = coverage_matrix(COVERAGE)
    assert matrix is not None
    assert matrix.columns == [
        ("precision", "16-true"), ("precision", "32-true"), ("precision", "bf16-mixed"),
        ("world_size", "2"), ("world_size", "4"),
    ]  # fmt: skip
    assert dict(matrix.rows) == {
        "CKPT-RT-1": [NEVER, COVERED, REACHED, COVERED, COVERED],
        "TRAIN-1": [OUTSIDE, OUTSIDE, OUTSIDE, COVERED, OUTSIDE],
    }
    assert matrix.axes() == [("precision", 3), ("world_size", 2)]
    assert coverage_matrix({}) is None


# -- the files and report.json --------------------------------------------------------------


def test_write_report_writes_four_files_and_run_round_trips(tmp_path: Path) -> None:
    files = write_report(small_report(), tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "report.html", "report.json", "report.md", "summary.md",
    ]  # fmt: skip
    assert files.summary.read_text().startswith("## shardcheck conformance: FAILED")
    document = json.loads(files.json.read_text())
    assert document["run"] == RUN
    assert document["findings"][0]["example"] == "Failing test case: test_rt(\n    n=7,\n)"
    assert load_report(files.json).run == RUN


def test_a_report_without_run_facts_still_loads(tmp_path: Path) -> None:
    document = small_report().to_dict()
    del document["run"]  # written by an earlier shardcheck
    path = tmp_path / "old.json"
    path.write_text(json.dumps(document))
    report = load_report(path)
    assert report.run == {}
    assert "profile" not in render_summary(report) and "started" not in render_html(report)
