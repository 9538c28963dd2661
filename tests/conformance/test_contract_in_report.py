"""The contract reaches the user: ``--list-clauses`` and each failing clause's text in report.md."""

from __future__ import annotations

from typing import Any

import pytest

from harness.clauses import clause_text
from harness.report import CheckResult, Report, render_markdown


def test_list_clauses_prints_the_selection_and_runs_nothing(run_suite: Any) -> None:
    never = "def test_never():\n    raise AssertionError('this test ran')\n"
    run = run_suite(never, "--list-clauses", "--clauses", "CLIP-1,API-*")
    assert run.ret == 0
    out = run.result.stdout.str()
    assert "CLIP-1" in out and "API-8" in out and "SYNC-1" not in out
    assert "this test ran" not in out and "1 passed" not in out and "test_never" not in out


def test_list_clauses_refuses_a_pattern_that_matches_nothing(run_suite: Any) -> None:
    result = run_suite(None, "--list-clauses", "--clauses", "NOPE-*").result
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--clauses: no clause matches 'NOPE-[*]'*--list-clauses*"])


def test_report_md_says_what_each_failing_clause_requires() -> None:
    checks = [
        CheckResult("t.test_clip", ["CLIP-1", "X-9"], "failed", failure="AssertionError: norm"),
        CheckResult("t.test_sync", ["SYNC-1"], "passed"),
    ]
    env = {"torch": "2.13.0", "python": "3.11", "backend": "gloo", "device": "cpu"}
    text = render_markdown(Report("0.1.0", env, {"factory": "m:f", "options": {}}, checks))
    section = text.split("## What the failing clauses require", 1)[1]
    assert f"- **CLIP-1**: {clause_text('CLIP-1')}" in section
    assert "- **X-9**: (not a clause of CONTRACT.md)" in section
    assert "SYNC-1" not in section


def test_report_md_without_failures_has_no_clause_texts() -> None:
    checks = [CheckResult("t.test_sync", ["SYNC-1"], "passed")]
    env = {"torch": "2.13.0", "python": "3.11", "backend": "gloo", "device": "cpu"}
    text = render_markdown(Report("0.1.0", env, {"factory": "m:f", "options": {}}, checks))
    assert "What the failing clauses require" not in text
