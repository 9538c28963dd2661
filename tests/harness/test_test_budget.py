"""The harness's verdict comes before pytest-timeout's: a test of several slow jobs, each under
its own deadline, whose sum outlasts the test's timeout, ends as a hang with every rank's
story (see [Note: the test's time budget] in harness/run/budget.py)."""

from __future__ import annotations

import os
import re
import time
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import harness
from harness import RankContext, run_on_ranks
from harness.pool.rankpool import PoolStartError
from harness.run.budget import TestBudget, TestTimeSpent, pytest_timeout_of, reserve
from harness.verdicts.failures import CollectiveHang
from harness.verdicts.outcomes import BUDGET_DETAIL

REPO = str(Path(harness.__file__).resolve().parent.parent)
INSTALLED = any(ep.value == "harness.plugin" for ep in entry_points(group="pytest11"))
PLUGIN = [] if INSTALLED else ["-p", "harness.plugin"]

#: four jobs of 3 s each, every one under its 5 s deadline: 12 s in all, in a test that
#: pytest-timeout ends at 12 s (``-o timeout=12``); the ranks start in the test before it,
#: whatever that takes on a busy machine
SLOW_CHECK = """
import time
import pytest
from hypothesis import given, settings, strategies as st
from harness import run_on_ranks

def quick_job(ctx):
    return ctx.rank

def slow_job(ctx):
    time.sleep(3)
    return ctx.rank

@pytest.mark.timeout(300)
def test_start_the_ranks():
    assert run_on_ranks(quick_job, world_size=2) == [0, 1]

def test_plain_check():
    for _ in range(4):
        assert run_on_ranks(slow_job, world_size=2, timeout=5) == [0, 1]

@settings(max_examples=1, database=None, deadline=None)
@given(st.just(0))
def test_hypothesis_check(x):
    for _ in range(4):
        assert run_on_ranks(slow_job, world_size=2, timeout=5) == [0, 1]
"""


@pytest.fixture
def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("SHARDCHECK_STRATEGY", raising=False)
    monkeypatch.delenv("PYTEST_TIMEOUT", raising=False)
    for var in ("CI", "TF_BUILD", "GITHUB_ACTIONS", "BUILDKITE", "CIRCLECI", "GITLAB_CI"):
        monkeypatch.delenv(var, raising=False)  # Hypothesis loads its `ci` profile on CI

    def run(*args: str) -> pytest.RunResult:
        pytester.makepyfile(test_subject=SLOW_CHECK)
        return pytester.runpytest_subprocess(
            *PLUGIN, "-p", "no:cacheprovider", "--durations=0", "--durations-min=0", *args
        )

    return run


def _call_seconds(out: str, test: str) -> float:
    found = re.search(rf"^([\d.]+)s call\s+test_subject.py::{test}$", out, re.M)
    assert found is not None, out[-3000:]
    return float(found.group(1))


@pytest.mark.parametrize("test", ["test_plain_check", "test_hypothesis_check"])
def test_a_check_of_slow_jobs_ends_as_a_hang_before_pytest_timeout(run: Any, test: str) -> None:
    first = "test_subject.py::test_start_the_ranks"
    # under ci a Hypothesis test's limit is the ini value as it is (not scaled to more examples)
    limit = ["-o", "timeout=12", "--hypothesis-profile=ci"]
    result = run(first, f"test_subject.py::{test}", *limit)
    out = result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)
    assert "Timeout (>" not in out and "pytest-timeout" not in out.replace("of pytest-timeout", "")
    assert "FlakyFailure" not in out
    # the verdict: a hang, cut off when the test's time ran out, with every rank's story
    budget = f"{BUDGET_DETAIL} (7.0 s into the test, of pytest-timeout's 12 s; the harness "
    verdict = f"CollectiveHang: hang: every rank was {budget}"
    assert verdict in out, out[-4000:]
    for rank in (0, 1):
        assert f"rank {rank} hung: {budget}" in out
    assert "ranks 0, 1: same stacks (rank 0's)" in out
    assert re.search(r'File "\S+test_subject\.py", line \d+ in slow_job', out)
    assert _call_seconds(out, test) < 12  # before pytest-timeout's 12 s
    if test == "test_hypothesis_check":  # Hypothesis' replay got the verdict without a job
        assert "(raised again without running the job: the test's time is spent)" in out


# -- single process: the limit read as pytest-timeout reads it, and the budget's words ------


def _item(marker: Any = None, option: Any = None, ini: Any = "300") -> Any:
    def getini(name: str) -> Any:
        if ini is KeyError:
            raise ValueError(f"unknown configuration value: {name!r}")
        return ini

    config = SimpleNamespace(getoption=lambda name, default=None: option, getini=getini)
    return SimpleNamespace(get_closest_marker=lambda name: marker, config=config)


def test_the_limit_is_pytest_timeouts_mark_option_environment_or_ini(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYTEST_TIMEOUT", raising=False)
    assert pytest_timeout_of(_item()) == 300.0
    monkeypatch.setenv("PYTEST_TIMEOUT", "90")
    assert pytest_timeout_of(_item()) == 90.0
    assert pytest_timeout_of(_item(option=45)) == 45.0
    assert pytest_timeout_of(_item(pytest.mark.timeout(12).mark, option=45)) == 12.0
    assert pytest_timeout_of(_item(pytest.mark.timeout(timeout=0).mark, option=45)) == 0.0
    monkeypatch.delenv("PYTEST_TIMEOUT")
    assert pytest_timeout_of(_item(ini=KeyError)) == 0.0  # no pytest-timeout: no limit
    assert pytest_timeout_of(_item(ini="")) == 0.0
    assert TestBudget.of(_item(ini="")) is None


def test_the_reserve_is_a_twentieth_of_the_limit_at_least_five_seconds() -> None:
    assert reserve(300) == 15.0
    assert reserve(1250) == 62.5
    assert reserve(40) == 5.0
    assert reserve(4) == 2.0  # never more than half
    budget = TestBudget(300.0, started=100.0)
    assert budget.ends_at == 385.0
    assert budget.why() == (
        f"{BUDGET_DETAIL} (285.0 s into the test, of pytest-timeout's 300 s; the harness "
        "keeps the last 15.0 s for its verdict)"
    )


def test_a_verdict_raised_again_keeps_its_type_and_story_and_says_it_did_not_run() -> None:
    start = PoolStartError("forming process group 3 of 2 local ranks failed: rank 1 hung")
    budget = TestBudget(20.0, time.monotonic() - 30.0, verdict=start)
    again = budget.again()
    assert type(again) is PoolStartError
    assert str(again) == (
        "forming process group 3 of 2 local ranks failed: rank 1 hung\n"
        "(raised again without running the job: the test's time is spent)"
    )
    budget.verdict = CollectiveHang("hang: every rank was ...", [])
    twice = TestBudget(20.0, 0.0, verdict=budget.again()).again()
    assert type(twice) is CollectiveHang and str(twice).count("raised again") == 1


# -- real ranks, in process: a job cut off, the verdict raised again, a job not sent -------


def sleep_job(ctx: RankContext, seconds: float) -> int:
    time.sleep(seconds)
    return ctx.rank


def test_jobs_past_the_budget_get_the_verdict_and_a_test_without_one_sends_none() -> None:
    from harness.run.session import current

    session = current()
    run_on_ranks(sleep_job, 0.0, world_size=2)  # the pool is up: time the jobs alone
    saved = session.budget
    try:
        session.budget = TestBudget(8.0, time.monotonic())  # ends 4 s from now
        assert run_on_ranks(sleep_job, 1.0, world_size=2, timeout=20) == [0, 1]
        began = time.monotonic()
        with pytest.raises(CollectiveHang) as info:
            run_on_ranks(sleep_job, 10.0, world_size=2, timeout=20)
        assert time.monotonic() - began < 8  # cut off at the budget, not at its 20 s deadline
        assert all(
            o.kind == "hung" and o.detail == session.budget.why() for o in info.value.outcomes
        )
        assert "sleep_job" in info.value.outcomes[0].stacks
        began = time.monotonic()
        with pytest.raises(CollectiveHang) as again:
            run_on_ranks(sleep_job, 0.0, world_size=2)
        assert time.monotonic() - began < 0.5  # nothing ran
        assert str(again.value).startswith(str(info.value).splitlines()[0])
        assert str(again.value).endswith("without running the job: the test's time is spent)")
        session.budget = TestBudget(8.0, time.monotonic() - 6.0)  # spent, and no failure
        with pytest.raises(TestTimeSpent, match=r"was not sent: the test's time is spent"):
            run_on_ranks(sleep_job, 0.0, world_size=2)
    finally:
        session.budget = saved
    assert run_on_ranks(sleep_job, 0.0, world_size=2) == [0, 1]  # the pool healed
