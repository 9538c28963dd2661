"""``--reproduce-failure VERSION:BLOB``: the reproducer line replays a check's exact failing
example without an edit to the suite."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import hypothesis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from harness.conformance.outcomes.replay import apply, as_option, parse
from harness.hypothesis_compat import REPRODUCE_FAILURE_ATTRIBUTE

if TYPE_CHECKING:
    from tests.conformance.conftest import Run


def _blob_of_a_failure() -> str:
    """Run a failing @given test once, printing its blob; return ``VERSION:BLOB``."""

    @settings(print_blob=True, database=None, derandomize=True)
    @given(st.integers(min_value=0, max_value=1000))
    def fails_above_500(x: int) -> None:
        assert x < 500

    with pytest.raises(AssertionError) as info:
        fails_above_500()
    text = "\n".join(getattr(info.value, "__notes__", []))
    option = as_option(text)
    assert option.startswith("--reproduce-failure=")
    return option.partition("=")[2]


def test_the_option_replays_exactly_the_failing_example() -> None:
    value = _blob_of_a_failure()
    seen: list[int] = []

    @settings(database=None)
    @given(st.integers(min_value=0, max_value=1000))
    def same_test(x: int) -> None:
        seen.append(x)
        assert x < 500

    apply(value, [SimpleNamespace(obj=same_test, nodeid="t.py::same_test")])  # type: ignore[list-item]
    with pytest.raises(AssertionError):
        same_test()
    assert seen == [500]  # the shrunk example, once: no search


def test_parse_reads_version_and_blob_and_refuses_anything_else() -> None:
    assert parse(f"{hypothesis.__version__}:AXicY2BkAAAABQAC") == (
        hypothesis.__version__,
        b"AXicY2BkAAAABQAC",
    )
    with pytest.raises(pytest.UsageError, match="is not VERSION:BLOB"):
        parse("AXicY2BkAAAABQAC")


class _Counter(RuleBasedStateMachine):
    """Fails once its count passes 3; ``runs`` counts the machines Hypothesis built."""

    runs = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).runs += 1
        self.count = 0

    @rule(step=st.integers(min_value=1, max_value=3))
    def add(self, step: int) -> None:
        self.count += step
        assert self.count <= 3


def _machine_blob() -> str:
    """Run the failing machine once, printing its blob; return ``VERSION:BLOB``."""
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(
            _Counter, settings=settings(print_blob=True, database=None, derandomize=True)
        )
    option = as_option("\n".join(getattr(info.value, "__notes__", [])))
    assert option.startswith("--reproduce-failure=")
    return option.partition("=")[2]


def test_the_option_replays_a_state_machine_run_by_a_plain_test() -> None:
    value = _machine_blob()

    def test_machine() -> None:  # builds its class on the spot, as the session suites do
        machine = cast("type[_Counter]", type("Counter_fsdp", (_Counter,), {"runs": 0}))
        try:
            run_state_machine_as_test(machine, settings=settings(database=None))
        finally:
            seen.append(machine.runs)

    seen: list[int] = []
    cleanups: list[Callable[[], None]] = []
    item: Any = SimpleNamespace(
        obj=test_machine,
        nodeid="suites/t.py::test_machine",
        config=SimpleNamespace(add_cleanup=cleanups.append),
    )
    apply(value, [item])
    with pytest.raises(AssertionError):
        test_machine()
    assert seen == [1]  # the failing run, once: no search
    for cleanup in cleanups:
        cleanup()
    assert REPRODUCE_FAILURE_ATTRIBUTE not in RuleBasedStateMachine.__dict__
    again = cast("type[_Counter]", type("Again", (_Counter,), {"runs": 0}))
    with pytest.raises(AssertionError):  # after the run, machines search again
        run_state_machine_as_test(again, settings=settings(database=None))
    assert again.runs > 1


def test_apply_refuses_several_tests() -> None:
    def plain() -> None:
        pass

    item: Any = SimpleNamespace(obj=plain, nodeid="suites/t.py::test_machine")
    with pytest.raises(pytest.UsageError, match="replays one check's example, but 2 tests"):
        apply("6.1.0:AXic", [item, item])


MACHINE_SUITE = """
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

class Counter(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.count = 0
        with open("machines.txt", "a") as out:
            out.write("m")

    @rule(step=st.integers(min_value=1, max_value=3))
    def add(self, step):
        self.count += step
        assert self.count <= 3, f"CKPT-RT-1: count {self.count}"

@pytest.mark.clause("CKPT-RT-1")
@pytest.mark.parametrize("family", ["fsdp"])
def test_session(family):
    machine = type(f"Counter_{family}", (Counter,), {})
    run_state_machine_as_test(machine, settings=settings(print_blob=True, database=None))
"""


def test_a_state_machine_checks_reproduce_line_replays_its_failure(
    run_suite: Callable[..., Run], pytester: pytest.Pytester
) -> None:
    first = run_suite(MACHINE_SUITE)
    (check,) = first.report()["checks"]
    line = check["reproducer"]
    assert check["outcome"] == "failed" and "--reproduce-failure=" in line, line
    machines = pytester.path / "machines.txt"
    machines.unlink()
    replay = line.split("--reproduce-failure=")[1].split()[0]
    again = run_suite(None, "test_fake.py::test_session[fsdp]", f"--reproduce-failure={replay}")
    assert again.ret == 1, again.text[-2000:]
    failure = again.check("test_fake.test_session[fsdp]")["failure"]
    assert failure.splitlines()[0] == check["failure"].splitlines()[0]  # CKPT-RT-1: count 4
    assert machines.read_text() == "m"  # the failing machine alone: no search


NOTHING_TO_REPLAY = """
import pytest
from hypothesis import given, settings, strategies as st

@pytest.mark.clause("CKPT-RT-1")
def test_plain():
    pass

@pytest.mark.clause("CKPT-RT-1")
@settings(database=None)
@given(st.integers(min_value=0, max_value=1000))
def test_fixed(x):
    assert x < 5000
"""


def test_a_replay_that_shows_no_failure_says_so_and_makes_no_finding(
    run_suite: Callable[..., Run],
) -> None:
    replay = f"--reproduce-failure={_blob_of_a_failure()}"
    # a plain test that runs no state machine: nothing reads the blob, the test passes
    plain = run_suite(NOTHING_TO_REPLAY, "test_fake.py::test_plain", replay)
    assert plain.ret == 1, plain.text[-2000:]
    check = plain.check("test_fake.test_plain")
    assert check["outcome"] == "error"
    assert (
        "NothingReplayed: --reproduce-failure replayed nothing: test_fake.test_plain passed"
        in (check["failure"])
    )
    assert plain.report()["findings"] == []
    # the example replayed and passed (the bug is fixed): said so, not a finding of CKPT-RT-1
    fixed = run_suite(None, "test_fake.py::test_fixed", replay)
    assert fixed.ret == 1, fixed.text[-2000:]
    check = fixed.check("test_fake.test_fixed")
    assert check["outcome"] == "error"
    assert "replayed the example of test_fake.test_fixed, and it did not fail" in check["failure"]
    assert "Expected the test to raise an error" in check["failure"]  # Hypothesis' own words
    assert fixed.report()["findings"] == []
