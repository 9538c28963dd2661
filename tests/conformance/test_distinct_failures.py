"""Hypothesis' several distinct failures of one check: the report tells each of them (its
headline, failing example and replay option), not only "Hypothesis found N distinct
failures"."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from harness.conformance.outcomes.distinct import describe

if TYPE_CHECKING:
    from tests.conformance.conftest import Run

RunSuite = Callable[..., "Run"]

SUITE = """
import pytest
from hypothesis import given, settings, strategies as st

@pytest.mark.clause("CKPT-RT-1")
@settings(report_multiple_bugs=True, database=None, derandomize=True, max_examples=200)
@given(st.integers(min_value=0, max_value=100))
def test_two(x):
    if x > 50:
        raise ValueError(f"CKPT-RT-1: too big {x}")
    if x % 2 == 1:
        raise KeyError(f"odd {x}")
"""


def test_each_distinct_failure_is_told_in_every_report(run_suite: RunSuite) -> None:
    run = run_suite(SUITE)
    assert run.ret == 1
    check = run.check("test_fake.test_two")
    failure = check["failure"]
    lines = failure.splitlines()
    assert lines[0] == (
        "ValueError: CKPT-RT-1: too big 51 (1 of 2 distinct failures Hypothesis found)"
    )
    assert lines[1] == "  failing example: test_two(x=51)"
    assert lines[2].startswith("  replay it: --reproduce-failure=")
    assert lines[3] == "2 of 2: KeyError: 'odd 1'"
    assert lines[4] == "  failing example: test_two(x=1)"
    assert lines[5].startswith("  replay it: --reproduce-failure=") and lines[5] != lines[2]
    assert "distinct failures. (2 sub-exceptions)" not in failure
    # the finding is the first one; the reproduce line replays that one
    (finding,) = run.report()["findings"]
    assert finding["message"] == "CKPT-RT-1: too big 51"
    assert finding["example"].endswith(": test_two(\n    x=51,\n)")  # its example too
    assert check["reproducer"].endswith(lines[2].removeprefix("  replay it: "))
    markdown = run.markdown()
    assert "2 of 2: KeyError: 'odd 1'" in markdown and "test_two(x=1)" in markdown
    html = (run.report_dir / "report.html").read_text()
    assert "too big 51 (1 of 2 distinct failures Hypothesis found)" in html  # its first line


def test_one_failure_adds_no_listing() -> None:
    assert describe(ValueError("one")) is None
    # Hypothesis' group: a builtin from Python 3.11, a backport before
    group_type = getattr(builtins, "ExceptionGroup", None)
    if group_type is None:
        group_type = pytest.importorskip("exceptiongroup").ExceptionGroup
    group = group_type("Hypothesis found 2 distinct failures.", [ValueError("a"), KeyError("b")])
    told = describe(group)
    assert told is not None and told.notes == ""  # no notes: no example, nothing to replay
    assert told.listing.splitlines() == [
        "ValueError: a (1 of 2 distinct failures Hypothesis found)",
        "2 of 2: KeyError: 'b'",
    ]
