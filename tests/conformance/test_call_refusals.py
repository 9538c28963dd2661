"""A method that refuses an argument of its call (``load_checkpoint(strict=False)``) refuses
every example of the check alike: the check stops after a few such refusals in a row, not
after the twenty a configuration refusal gets."""

from __future__ import annotations

import pytest

from harness.conformance import unsupported
from harness.conformance.checks import Check
from harness.conformance.economy import CALL_REFUSALS_IN_A_ROW, REMEMBERED_IN_A_ROW
from harness.contract import Unsupported


def _check() -> Check:
    return Check(id="t.strict[model_parallel]", nodeid="t", clauses=["CKPT-STRICT-2"])


def _refusals(check: Check, exc: Unsupported, times: int) -> int:
    """How many refusals the check took before it gave up (``times`` + 1: it did not)."""
    for n in range(1, times + 1):
        try:
            unsupported._refused(check, exc)
        except pytest.skip.Exception as skip:
            assert "strict" in str(skip) or "family" in str(skip)
            return n
    return times + 1


def test_a_call_refusal_ends_the_check_after_a_few_in_a_row() -> None:
    call = Unsupported("non-strict loads are not implemented", "strict", False)
    assert unsupported.is_call_refusal(call)
    assert _refusals(_check(), call, 50) == CALL_REFUSALS_IN_A_ROW < REMEMBERED_IN_A_ROW


def test_a_configuration_refusal_still_gets_its_twenty() -> None:
    config = Unsupported("no tensor parallelism", "family", "model_parallel")
    assert not unsupported.is_call_refusal(config)
    assert not unsupported.is_call_refusal(Unsupported("no hybrid", "sharding_strategy", "x"))
    assert _refusals(_check(), config, 50) == REMEMBERED_IN_A_ROW


def test_after_examples_ran_a_call_refusal_ends_the_search_not_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ended: list[bool] = []
    monkeypatch.setattr(unsupported, "stop_after_this_example", lambda: ended.append(True))
    check = _check()
    check.examples_ran = 2  # what ran stands
    call = Unsupported("non-strict loads are not implemented", "strict", False)
    assert _refusals(check, call, CALL_REFUSALS_IN_A_ROW) == CALL_REFUSALS_IN_A_ROW + 1
    assert ended == [True]
