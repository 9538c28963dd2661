"""A check whose Hypothesis search met several distinct failures, one a hang or a desync and
the rest the ranks' failures, reads that verdict, not ``failed``; one failure a suite's
comparison found keeps it ``failed``."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from harness.conformance.outcomes.several import verdict_of_several
from harness.verdicts.failures import CollectiveDesync, CollectiveHang
from harness.verdicts.outcomes import Outcome, RankFailure

if TYPE_CHECKING:
    from tests.conformance.conftest import Run

SUITE = """
import pytest
from hypothesis import given, settings, strategies as st
from harness.verdicts.failures import CollectiveHang
from harness.verdicts.outcomes import Outcome, RankFailure, RemoteError

CLOSED = RemoteError("torch.distributed.DistBackendError", "closed by peer", "", None, True)
HUNG = [Outcome(0, "hung", detail="still running at the deadline (30.0 s)"), Outcome(1, "ok")]

@pytest.mark.clause("CKPT-RT-6")
@settings(report_multiple_bugs=True, database=None, derandomize=True, max_examples=200)
@given(st.integers(min_value=0, max_value=100))
def test_two(x):
    if x > 50:
        raise CollectiveHang("hang: rank(s) 1 finished the job while the others wait", HUNG)
    if x % 2 == 1:
        raise RankFailure("job 9: rank 0 raised", [Outcome(0, "raised", error=CLOSED)])
"""
#: the ranks' failure above, a suite's comparison instead
WRONG_VALUE = 'assert x % 2 == 0, "CKPT-RT-6: a wrong value"'


def test_a_hang_among_the_ranks_failures_reads_hang(run_suite: Callable[..., Run]) -> None:
    run = run_suite(SUITE)
    assert run.ret == 1
    check = run.check("test_fake.test_two")
    assert check["outcome"] == "hang", check["failure"][:600]
    assert "(1 of 2 distinct failures Hypothesis found)" in check["failure"]
    assert run.report()["clauses"]["CKPT-RT-6"] == "hang"
    # with a wrong value among them, the check failed (what the suite compared comes first)
    ranks = 'raise RankFailure("job 9: rank 0 raised", [Outcome(0, "raised", error=CLOSED)])'
    wrong = run_suite(SUITE.replace(ranks, WRONG_VALUE))
    check = wrong.check("test_fake.test_two")
    assert "(1 of 2 distinct failures Hypothesis found)" in check["failure"]
    assert check["outcome"] == "failed"


def _group(*leaves: BaseException) -> BaseException:
    group_type: Any = getattr(builtins, "ExceptionGroup", None)
    if group_type is None:
        group_type = pytest.importorskip("exceptiongroup").ExceptionGroup
    return group_type("Hypothesis found 2 distinct failures.", list(leaves))


def test_the_verdict_of_several_failures() -> None:
    ranks = RankFailure("job 2: rank 0 raised", [Outcome(0, "raised"), Outcome(1, "ok")])
    hang = CollectiveHang("hang: every rank was ...", [Outcome(0, "hung"), Outcome(1, "hung")])
    desync = CollectiveDesync("desync: ...", [Outcome(0, "raised"), Outcome(1, "raised")])
    assert verdict_of_several(_group(ranks, hang)) == "hang"
    assert verdict_of_several(_group(hang, desync)) == "desync"  # the worse verdict
    other = RankFailure("job 3: rank 1 raised", [Outcome(0, "ok"), Outcome(1, "raised")])
    assert verdict_of_several(_group(ranks, other)) == ""  # no verdict of its own kind
    assert verdict_of_several(_group(hang, AssertionError("CKPT-RT-1: wrong"))) == ""
    assert verdict_of_several(hang) == ""  # one failure: its own type says it
