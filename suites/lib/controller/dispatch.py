"""Sending a job to the ranks from the controller.

:func:`run` calls ``harness.run_on_ranks`` and hands an ``Unsupported`` configuration to the
harness session's refusal path inside a Hypothesis test (recorded, then rejected). The jobs
themselves are module-level functions on the rank side, in :mod:`suites.lib.ranks` (never in a
test module: see the rule in its docstring).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import is_dataclass
from typing import Any

from suites.lib.shared.axes import scenario_axes
from suites.lib.shared.specs import Scenario

__all__ = ["run"]


def run(fn: Callable[..., Any], *args: Any, world_size: int) -> list[Any]:
    """``harness.run_on_ranks``, with ``Unsupported`` taking the session's refusal path
    inside a Hypothesis test (recorded and rejected; re-raised outside one, for the plugin to
    report).

    A scenario among ``args`` whose option value the strategy already refused in this session
    is refused again without a rank job (see :mod:`harness.run.remembered`).
    """
    from harness import RankFailure, Unsupported, run_on_ranks
    from harness.run.session import current

    session = current()
    scenarios = _scenarios_in(args)
    try:
        for scenario in scenarios:
            known = session.remembered.refused(scenario.family, scenario.options())
            if known is not None:
                raise known  # a remembered refusal: no rank job
        try:
            values = run_on_ranks(fn, *args, world_size=world_size)
        except Unsupported as exc:
            for scenario in scenarios:
                session.remembered.remember(scenario.family, scenario.options(), exc)
            raise
        except RankFailure:  # the job ran and failed: its configuration reached the ranks
            for axes in _axes_in(args):
                session.note_exercised(axes)
            raise
        for axes in _axes_in(args):
            session.note_exercised(axes)
        return values
    except Unsupported as exc:
        from hypothesis.control import currently_in_test_context

        if currently_in_test_context():
            session.refuse(exc)  # also where the plugin cannot wrap the test (stateful)
        raise


def _axes_in(args: tuple[Any, ...]) -> list[dict[str, tuple[str, ...]]]:
    """The axis values of the scenarios among ``args`` (a checkpoint plan's with its format)."""
    found: list[dict[str, tuple[str, ...]]] = []
    for arg in args:
        if isinstance(arg, Scenario):
            found.append(scenario_axes(arg))
        elif is_dataclass(arg) and not isinstance(arg, type):
            fmt = getattr(arg, "fmt", None)
            fmt = fmt if isinstance(fmt, str) else None
            found += [scenario_axes(v, fmt) for v in vars(arg).values() if isinstance(v, Scenario)]
    return found


def _scenarios_in(args: tuple[Any, ...]) -> list[Scenario]:
    """The scenarios among ``args`` and their fields (a checkpoint plan's save and load)."""
    found: list[Scenario] = []
    for arg in args:
        if isinstance(arg, Scenario):
            found.append(arg)
        elif is_dataclass(arg) and not isinstance(arg, type):
            found += [v for v in vars(arg).values() if isinstance(v, Scenario)]
    return found
