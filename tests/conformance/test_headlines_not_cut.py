"""A finding's headline is printed whole in the terminal and in summary.md: what is wrong
comes first, and its value (often past 160 characters, after torch's words) is the point.
What must be shortened (a table cell, a signature's key, a clause's line) is cut between
two words, never inside one."""

from __future__ import annotations

from harness.conformance.findings.masking import mask
from harness.conformance.output.progress import Progress
from harness.conformance.output.summary import finding_lines
from harness.report import CheckResult, FindingResult, Report
from harness.report.summary import render_summary
from harness.report.words import shorten

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


def test_the_end_of_run_summary_prints_the_whole_headline_too() -> None:
    check = CheckResult(id="t.rt[full]", clauses=["CKPT-RT-1"], outcome="failed", finding="F1")
    env = {"torch": "2.13.0", "python": "3.11", "backend": "gloo", "device": "cpu"}
    report = Report("0.1.0", env, {"factory": "team:make_strategy", "options": {}}, [check])
    report.findings = [
        FindingResult(id="F1", clauses=["CKPT-RT-1"], signature="s", message=HEADLINE, checks=[])
    ]
    lines = finding_lines(report)
    assert lines[1] == f"  F1 CKPT-RT-1: {HEADLINE.split(': ', 1)[1]}"


def test_what_must_be_shortened_is_cut_between_words() -> None:
    for limit in range(20, len(HEADLINE), 7):
        short = shorten(HEADLINE, limit)
        assert len(short) <= limit and short.endswith("...")
        kept = short.removesuffix("...")
        assert HEADLINE.startswith(kept) and HEADLINE[len(kept)] in " ,;:", (limit, short)
    assert shorten("/a/very/long/path/without/spaces", 12) == "/a/very/l..."
    key = mask("CKPT-RT-1: " + "wordy " * 40)
    assert key.endswith("wordy") and len(key) <= 160


def test_summary_md_shortens_a_cell_between_words() -> None:
    long = "CKPT-RT-1: " + " ".join(["shape"] * 90)
    check = CheckResult(id="t.rt[full]", clauses=["CKPT-RT-1"], outcome="failed", finding="F1")
    env = {"torch": "2.13.0", "python": "3.11", "backend": "gloo", "device": "cpu"}
    report = Report("0.1.0", env, {"factory": "team:make_strategy", "options": {}}, [check])
    report.findings = [
        FindingResult(id="F1", clauses=["CKPT-RT-1"], signature="s", message=long, checks=[])
    ]
    text = render_summary(report)
    cut = [w for w in text.replace("`", " ").split() if w.endswith("...")]
    assert cut == ["shape..."], cut  # shortened (past 400 characters), between two words
