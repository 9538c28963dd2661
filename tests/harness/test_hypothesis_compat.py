"""Every private Hypothesis name shardcheck uses exists, and works, in the installed
Hypothesis; the supported range in pyproject.toml is the compat module's."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import tomllib
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import hypothesis_compat as compat

ROOT = Path(__file__).resolve().parents[2]
QUIET = settings(database=None, max_examples=30, deadline=None, derandomize=True)


def test_the_declared_range_is_the_compat_modules_and_holds_the_installed_one() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    line = next(d for d in dependencies if d.startswith("hypothesis"))
    found = re.fullmatch(r"hypothesis>=([\d.]+),<([\d.]+)", line.split("#")[0].strip())
    assert found is not None, f"pyproject.toml's {line!r} is not 'hypothesis>=A,<B'"
    oldest, before = (tuple(int(p) for p in (v + ".0.0").split(".")[:3]) for v in found.groups())
    assert (oldest, before) == (compat.OLDEST, compat.BEFORE)
    assert compat.check_hypothesis_version() == "", compat.check_hypothesis_version()
    assert ".".join(map(str, compat.hypothesis_version())) == hypothesis.__version__


def test_outside_a_range_the_version_check_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compat, "hypothesis_version", lambda: (7, 1, 0))
    assert compat.check_hypothesis_version() == (
        "hypothesis 7.1.0 is installed; shardcheck supports hypothesis>=6.100.0,<7.0.0 "
        "(pip install 'hypothesis>=6.100.0,<7.0.0')."
    )


def test_the_engines_fields_are_found_and_editable_inside_a_search() -> None:
    seen: list[dict[str, Any]] = []

    @QUIET
    @given(st.integers(0, 10))
    def search(x: int) -> None:
        runner = compat.running_engine()
        seen.append({"runner": runner is not None, "found": compat.first_bug_found_time(runner)})
        assert x < 3  # fails: Hypothesis then shrinks

    with pytest.raises(AssertionError):
        search()
    assert compat.running_engine() is None  # outside a search
    assert any(s["runner"] for s in seen)
    assert seen[0]["found"] is None  # before the first failure
    assert any(isinstance(s["found"], float) for s in seen)  # after it


def test_ending_the_search_and_shrinking_stop_hypothesis_early() -> None:
    runs: list[int] = []

    @QUIET
    @given(st.integers(0, 1000))
    def search(x: int) -> None:
        runs.append(x)
        runner = compat.running_engine()  # None in Hypothesis' final replay
        if x > 10:
            if runner is not None:
                assert compat.shrink_no_more(runner) and compat.end_search(runner)
            raise AssertionError("big")

    with pytest.raises(AssertionError, match="big"):
        search()
    failing = [x for x in runs if x > 10]
    assert len(failing) <= 2  # the failure, and Hypothesis' replay of it: no shrinking
    assert not compat.shrink_no_more(None) and not compat.end_search(None)


def test_the_reproduce_failure_attribute_is_what_the_decorator_sets() -> None:
    def test() -> None:
        pass

    decorated = hypothesis.reproduce_failure(hypothesis.__version__, b"AXic")(test)
    assert getattr(decorated, compat.REPRODUCE_FAILURE_ATTRIBUTE) == (
        hypothesis.__version__,
        b"AXic",
    )


def test_the_other_private_names_exist() -> None:
    from hypothesis.internal.conjecture import engine

    assert isinstance(engine.MAX_SHRINKS, int)
    assert compat.SLOW_SHRINK_WARNING in inspect.getsource(engine)
    stop = compat.stop_test_type()
    assert issubclass(stop, BaseException) and not issubclass(stop, Exception)
    drawn: list[bool] = []

    @QUIET
    @given(st.data())
    def draws(data: Any) -> None:
        drawn.append(compat.is_data_object(data))

    draws()
    assert drawn and all(drawn) and not compat.is_data_object(object())


def test_a_base_exception_hypothesis_wraps_is_recognised() -> None:
    class Stop(BaseException):
        pass

    @settings(database=None, max_examples=5, deadline=None)
    @given(st.integers())
    def raises(x: int) -> None:
        raise Stop

    try:
        raises()
    except BaseException as exc:  # the wrapper, or the BaseException itself
        caught = exc
    wrapped = compat.is_wrapped_base_exception(caught)
    assert wrapped == (type(caught).__name__ == "_WrappedBaseException")
    assert wrapped or isinstance(caught, Stop)
