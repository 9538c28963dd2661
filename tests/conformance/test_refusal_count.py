"""One refused example is recorded once, whichever way its refusal reaches the session: the
suites' dispatch calls ``session.refuse`` itself (the rejection then carries the
``Unsupported`` as its context up through the check's wrapper), or the wrapper meets the
``Unsupported``."""

from __future__ import annotations

from typing import Any

import hypothesis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import harness.run.session
from harness import Unsupported
from harness.conformance.outcomes.checks import Check
from harness.conformance.outcomes.unsupported import CheckWatch, rejecting
from harness.refusals import Refusal


class CountingWatch(CheckWatch):
    """A check's observer that counts the refusals recorded on it."""

    def __init__(self, check: Check) -> None:
        super().__init__(check)
        self.records: list[Refusal] = []

    def refused(self, refusal: Refusal) -> None:
        self.records.append(refusal)
        super().refused(refusal)


REMEMBERED = Unsupported("odd numbers only", "n", "even")  # one object, raised again


def _refusing_test(path: str, refused: list[int]) -> Any:
    @settings(max_examples=10, database=None, derandomize=True)
    @given(st.integers(0, 100))
    def test(n: int) -> None:
        if n % 2:
            return  # this example ran
        refusal = REMEMBERED if path == "remembered" else Unsupported("odd only", "n", n)
        refused.append(n)
        if path in ("dispatch", "remembered"):  # as suites/lib/controller/dispatch.run does
            try:
                raise refusal
            except Unsupported as exc:
                harness.run.session.current().refuse(exc)
        if path == "suite_reject":  # a suite that rejects the example itself
            try:
                raise refusal
            except Unsupported:
                hypothesis.reject()
        raise refusal  # the check's wrapper meets it

    return test


@pytest.mark.parametrize("path", ["dispatch", "remembered", "suite_reject", "wrapper"])
def test_each_refused_example_is_recorded_once(path: str) -> None:
    check = Check("test_x.test_y", "test_x.py::test_y", ["API-1"])
    watch = CountingWatch(check)
    refused: list[int] = []
    test = _refusing_test(path, refused)
    handle: Any = test.hypothesis  # type: ignore[attr-defined]
    handle.inner_test = rejecting(handle.inner_test, check)
    with harness.run.session.current().observing(watch):
        test()
    assert refused, "no example was refused"
    assert len(watch.records) == len(refused), (path, len(watch.records), len(refused))
