"""The Hypothesis versions shardcheck supports, and every private Hypothesis name it touches.

shardcheck steers Hypothesis where no public setting says what it needs: it ends a search
whose shrink budget is spent, stops shrinking a hang (one bug whatever the example's size),
replays a printed failure from the command line, and unwraps the ``BaseException`` Hypothesis
wraps. Private names change between releases without notice, so each one is read here and
nowhere else, with a ``[Note: ...]`` naming the versions it was checked on. A Hypothesis that
renames one breaks this module only, and ``tests/harness/test_hypothesis_compat.py`` names it.

The supported range is declared in ``pyproject.toml`` (``hypothesis>=OLDEST,<BEFORE``);
:func:`check_hypothesis_version` says in one line when the installed one is outside it.
"""

from __future__ import annotations

import math
import sys
import time
from types import FrameType
from typing import Any

__all__ = [
    "BEFORE",
    "OLDEST",
    "REPRODUCE_FAILURE_ATTRIBUTE",
    "SLOW_SHRINK_WARNING",
    "check_hypothesis_version",
    "end_search",
    "first_bug_found_time",
    "hypothesis_version",
    "is_data_object",
    "is_wrapped_base_exception",
    "running_engine",
    "shrink_no_more",
    "stop_test_type",
]

#: the oldest Hypothesis shardcheck supports, and the first release it is not checked on
OLDEST = (6, 100, 0)
BEFORE = (7, 0, 0)

# [Note: the engine's fields] Hypothesis' search runs in ``ConjectureRunner``
# (``hypothesis.internal.conjecture.engine``). Checked on 6.100 to 6.170.17: it counts the
# smaller failing examples it found in ``shrinks`` and stops shrinking once that reaches the
# module's ``MAX_SHRINKS`` (an int, 500); it checks ``finish_shrinking_deadline`` (a
# ``time.perf_counter()`` value, or None before shrinking starts) after every example and
# ends the search once it has passed; ``first_bug_found_time`` is the ``time.monotonic()`` of
# its first failing example (``math.inf`` before one).
_ENGINE_CLASS = "ConjectureRunner"
_ENGINE_MODULE = "hypothesis.internal.conjecture.engine"

# [Note: the reproduce-failure attribute] ``@reproduce_failure(version, blob)`` sets this
# attribute on the test function (``hypothesis/core.py``, 6.100 to 6.170.17), and ``@given``
# reads it from there: setting it does what the decorator does.
REPRODUCE_FAILURE_ATTRIBUTE = "_hypothesis_internal_use_reproduce_failure"

# [Note: the slow-shrinking warning] The start of what the engine reports when its own
# five-minute shrinking limit passes (6.100 to 6.170.17).
SLOW_SHRINK_WARNING = "WARNING: Hypothesis has spent more than five minutes"

# [Note: the wrapped BaseException] A ``BaseException`` a test raised (pytest-timeout's) is
# re-raised by Hypothesis inside the private ``hypothesis.errors._WrappedBaseException``,
# with the original as ``__cause__`` (6.100 to 6.170.17).
_WRAPPED_BASE_EXCEPTION = "_WrappedBaseException"


def stop_test_type() -> type[BaseException]:
    """``hypothesis.errors.StopTest``: it ends an example that has run out of data and must
    pass through the harness untouched.

    [Note: StopTest] not part of the documented API (checked on 6.100 to 6.170.17); read
    when needed, so importing this module does not import Hypothesis.
    """
    from hypothesis.errors import StopTest

    return StopTest


def hypothesis_version() -> tuple[int, int, int]:
    """The installed Hypothesis' version as three integers."""
    from hypothesis.version import __version_info__

    major, minor, patch = (int(part) for part in __version_info__[:3])
    return major, minor, patch


def check_hypothesis_version() -> str:
    """``""`` when the installed Hypothesis is in the supported range, else one line saying
    which version is installed, the range, and what to do."""
    version = hypothesis_version()
    if OLDEST <= version < BEFORE:
        return ""
    shown = ".".join(map(str, version))
    oldest, before = ".".join(map(str, OLDEST)), ".".join(map(str, BEFORE))
    return (
        f"hypothesis {shown} is installed; shardcheck supports hypothesis>={oldest},<{before} "
        f"(pip install 'hypothesis>={oldest},<{before}')."
    )


def running_engine() -> Any:
    """The running ``ConjectureRunner`` on this thread's stack, or ``None`` (outside
    Hypothesis' search, or a Hypothesis whose engine is not found as expected)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        runner: Any = frame.f_locals.get("self")
        if type(runner).__name__ == _ENGINE_CLASS and isinstance(
            getattr(runner, "shrinks", None), int
        ):
            return runner
        frame = frame.f_back
    return None


def shrink_no_more(runner: Any) -> bool:
    """Tell ``runner`` it has shrunk as often as it ever will; whether that worked."""
    limit = getattr(sys.modules.get(_ENGINE_MODULE), "MAX_SHRINKS", None)
    if runner is None or not isinstance(limit, int):
        return False
    runner.shrinks = max(runner.shrinks, limit)
    return True


def end_search(runner: Any) -> bool:
    """Move ``runner``'s shrinking deadline into the past: the search ends after the running
    example. Whether that worked."""
    if runner is None or not hasattr(runner, "finish_shrinking_deadline"):
        return False
    runner.finish_shrinking_deadline = time.perf_counter() - 1.0
    return True


def first_bug_found_time(runner: Any) -> float | None:
    """When ``runner`` found its first failing example (``time.monotonic()``), or None."""
    found = getattr(runner, "first_bug_found_time", None) if runner is not None else None
    return found if isinstance(found, float) and math.isfinite(found) else None


def is_data_object(value: Any) -> bool:
    """Whether ``value`` is what ``st.data()`` draws: a test that gets one draws in its body.

    [Note: the data object] its class is ``DataObject`` in the private
    ``hypothesis.strategies._internal.core`` (6.100 to 6.170.17); matched by name.
    """
    return type(value).__name__ == "DataObject"


def is_wrapped_base_exception(exc: BaseException) -> bool:
    """Whether ``exc`` is Hypothesis' wrapper of a ``BaseException`` a test raised."""
    return type(exc).__name__ == _WRAPPED_BASE_EXCEPTION and exc.__cause__ is not None
