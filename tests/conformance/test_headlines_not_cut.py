"""A finding's headline is printed whole in the terminal and in summary.md: what is wrong
comes first, and its value (often past 160 characters, after torch's words) is the point."""

from __future__ import annotations

from harness.conformance.progress import Progress
from harness.report import CheckResult, FindingResult, Report
from harness.report.summary import render_summary

HEADLINE = (
    "CKPT-RT-1: Attempting to broadcast a dimension of length 3 at -2! Mismatching argument at "
    "index 1 had torch.Size([3, 3]); but expected shape should be broadcastable to [2, 3] "
    "(rank 0, saved at world size 2 (model_parallel, full), loaded at world size 2)"
)


def test_the_terminal_prints_the_whole_headline() -> None:
    lines: list[str] = []
    Progress(lines.append).finding("F1", ["CKPT-RT-1"], HEADLINE, "test_rt[full]")
    assert len(HEADLINE) > 200
    assert lines[0] == f"shardcheck: F1 new finding, CKPT-RT-1: {HEADLINE.split(': ', 1)[1]}"


def test_summary_md_shows_the_whole_headline() -> None:
    check = CheckResult(id="t.rt[full]", clauses=["CKPT-RT-1"], outcome="failed", finding="F1")
    env = {"torch": "2.13.0", "python": "3.11", "backend": "gloo", "device": "cpu"}
    report = Report("0.1.0", env, {"factory": "team:make_strategy", "options": {}}, [check])
    report.findings = [
        FindingResult(
            id="F1",
            clauses=["CKPT-RT-1"],
            signature="s",
            message=HEADLINE,
            checks=["t.rt[full]"],
            kind="lost or corrupted data",
        )
    ]
    row = next(line for line in render_summary(report).splitlines() if line.startswith("| F1 |"))
    assert HEADLINE in row and "| lost or corrupted data |" in row
