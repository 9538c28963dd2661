"""A method that refuses an argument of its call (``load_checkpoint(strict=False)``) refuses
every example of the check alike: the check stops after a few such refusals in a row, not
after the twenty a configuration refusal gets. So does a refusal of the family the check is
parametrized with."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from harness.conformance.outcomes import unsupported
from harness.conformance.outcomes.checks import Check
from harness.conformance.outcomes.economy import CALL_REFUSALS_IN_A_ROW, REMEMBERED_IN_A_ROW
from harness.contract import Unsupported
from harness.run.remembered import mark_built_families

if TYPE_CHECKING:
    from tests.conformance.conftest import Run


def _check() -> Check:
    return Check(id="t.strict[model_parallel]", nodeid="t", clauses=["CKPT-STRICT-2"])


def _refusals(check: Check, exc: Unsupported, times: int) -> int:
    """How many refusals the check took before it gave up (``times`` + 1: it did not)."""
    for n in range(1, times + 1):
        try:
            unsupported._refused(check, exc)
        except pytest.skip.Exception as skip:
            assert exc.describe() in str(skip)
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


def test_a_refusal_of_the_checks_family_parameter_ends_it_after_a_few() -> None:
    check = _check()
    check.family_parameter = "model_parallel"  # test_x[model_parallel]: every example builds it
    family = Unsupported("no tensor parallelism", "family", "model_parallel")
    assert unsupported.refuses_its_family(check, family)
    assert _refusals(check, family, 50) == CALL_REFUSALS_IN_A_ROW
    other = _check()
    other.family_parameter = "fsdp"  # another family's refusal: examples may still draw others
    assert not unsupported.refuses_its_family(other, family)
    assert _refusals(other, family, 50) == REMEMBERED_IN_A_ROW


FAMILY_SUITE = """
import pytest
from hypothesis import given, strategies as st
from harness.contract import Unsupported
from harness.run.remembered import mark_built_families

CALLS = []

@pytest.mark.clause("CKPT-RT-1")
@pytest.mark.parametrize("family", ["fsdp", "model_parallel"])
@given(st.integers())
def test_refused(family, x):
    CALLS.append(family)
    with open(f"calls-{family}.txt", "a") as out:
        out.write("x")
    raise Unsupported("not implemented yet", "family", family)
"""


def test_a_parametrized_family_refused_is_unsupported_after_a_few_examples(
    run_suite: Callable[..., Run],
) -> None:
    run = run_suite(FAMILY_SUITE)
    assert run.ret == 0, run.text[-2000:]
    for family in ("fsdp", "model_parallel"):
        check = run.check(f"test_fake.test_refused[{family}]")
        assert check["outcome"] == "unsupported"
        assert check["unsupported"] == [f"unsupported: family={family} (not implemented yet)"]
        calls = (run.report_dir.parent / f"calls-{family}.txt").read_text()
        assert len(calls) == CALL_REFUSALS_IN_A_ROW


def test_a_refusal_of_a_family_the_job_declares_it_builds_ends_it_after_a_few() -> None:
    # a job that draws no configuration but builds these families (suites' dispatch.run)
    family = mark_built_families(Unsupported("no FSDP2", "family", "fsdp2"), ("fsdp", "fsdp2"))
    assert unsupported.refuses_its_family(_check(), family)
    assert _refusals(_check(), family, 50) == CALL_REFUSALS_IN_A_ROW
    # the job's refusal of an option value it drew may not be every example's
    option = mark_built_families(Unsupported("no hybrid", "sharding_strategy", "HYBRID"), ("fsdp",))
    assert not unsupported.refuses_its_family(_check(), option)
    assert _refusals(_check(), option, 50) == REMEMBERED_IN_A_ROW


DECLARED_SUITE = """
import pytest
from hypothesis import given, strategies as st

import harness
from harness.contract import Unsupported
from harness.run.remembered import mark_built_families
from suites.lib.controller.dispatch import run


def refuse(fn, *args, world_size):
    with open(f"jobs-{fn.__name__}.txt", "a") as out:
        out.write("x")
    raise Unsupported("not implemented yet", "family", "fsdp2")


@pytest.fixture(scope="module", autouse=True)
def no_ranks():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(harness, "run_on_ranks", refuse)
        yield


def learns(ctx, x): ...
def both(ctx, x): ...
def fsdp2_only(ctx, x): ...


@pytest.mark.clause("CFG-3")
@given(st.integers())
def test_learns(x):
    run(learns, x, world_size=2, families=("fsdp", "fsdp2"))


@pytest.mark.clause("CFG-4")
@given(st.integers())
def test_both(x):
    run(both, x, world_size=2, families=("fsdp", "fsdp2"))


@pytest.mark.clause("CFG-7")
@given(st.integers())
def test_fsdp2_only(x):
    run(fsdp2_only, x, world_size=2, families=("fsdp2",))
"""


def test_a_declared_family_refused_is_refused_again_without_a_job(
    run_suite: Callable[..., Run],
) -> None:
    run = run_suite(DECLARED_SUITE)
    assert run.ret == 0, run.text[-2000:]
    jobs = {}
    for name in ("learns", "both", "fsdp2_only"):
        check = run.check(f"test_fake.test_{name}")
        assert check["outcome"] == "unsupported"
        assert check["unsupported"] == ["unsupported: family=fsdp2 (not implemented yet)"]
        calls = run.report_dir.parent / f"jobs-{name}.txt"
        jobs[name] = len(calls.read_text()) if calls.exists() else 0
    # the check that learned fsdp2's refusal stops after a few; one that also builds fsdp
    # (not known refused) still asks the ranks; one that builds fsdp2 alone asks nothing
    assert jobs == {
        "learns": CALL_REFUSALS_IN_A_ROW,
        "both": CALL_REFUSALS_IN_A_ROW,
        "fsdp2_only": 0,
    }
