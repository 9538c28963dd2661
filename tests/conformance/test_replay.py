"""``--reproduce-failure VERSION:BLOB``: the reproducer line replays a check's exact failing
example without an edit to the suite."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import hypothesis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.conformance.replay import apply, as_option, parse


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


def test_apply_refuses_several_tests_and_tests_without_given() -> None:
    def plain() -> None:
        pass

    item: Any = SimpleNamespace(obj=plain, nodeid="suites/t.py::test_machine")
    with pytest.raises(pytest.UsageError, match="replays one check's example, but 2 tests"):
        apply("6.1.0:AXic", [item, item])
    with pytest.raises(pytest.UsageError, match="not a Hypothesis @given test"):
        apply("6.1.0:AXic", [item])
