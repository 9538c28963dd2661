"""Sending a job to the ranks from the controller.

:func:`run` calls ``harness.run_on_ranks`` and hands an ``Unsupported`` configuration to the
harness session's refusal path inside a Hypothesis test (recorded, then rejected). The jobs
themselves are module-level functions on the rank side, in :mod:`suites.lib.ranks` (never in a
test module: see the rule in its docstring).

Each job that reaches the ranks reports what it exercised, for the coverage table: the axis
values of the scenarios among its arguments (:func:`~suites.lib.shared.axes.scenario_axes`)
and the values it passes to the contract's methods' arguments, as the job declares them
(:func:`~suites.lib.shared.arguments.passes`). :func:`report` does the same for a job run
another way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import is_dataclass
from typing import Any

from suites.lib.shared.arguments import passed_by
from suites.lib.shared.axes import scenario_axes
from suites.lib.shared.specs import Scenario

__all__ = ["exercised", "report", "run"]


def run(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int,
    families: tuple[str, ...] = (),
    by_reference: Scenario | None = None,
) -> list[Any]:
    """``harness.run_on_ranks``, with ``Unsupported`` taking the session's refusal path
    inside a Hypothesis test (recorded and rejected; re-raised outside one, for the plugin to
    report).

    A scenario among ``args`` whose option value the strategy already refused in this session
    is refused again without a rank job (see :mod:`harness.run.remembered`).

    Args:
        fn: the rank job.
        args: its arguments after the rank context.
        world_size: the ranks to run it on.
        families: for a job that builds no scenario but each of these families the strategy
            offers (:func:`suites.lib.ranks.construction.supported_families`, refused only
            when it offers none): a refusal of one of them is remembered, and the job is
            refused without a rank job once every one is; the refusal is marked as one that
            every example of the check meets (:func:`harness.run.remembered.built_families`),
            so the check gives up after a few.
        by_reference: a scenario among ``args`` that the job does not build with the
            strategy under test where that strategy refuses its family: the job builds it
            with the reference strategy of its family
            (:func:`suites.lib.ranks.checkpoint_jobs.save_rank_or_reference`), or does not
            build it at all (the load of what that job wrote). A remembered refusal of it
            does not refuse the job, and the job's refusals are not remembered for it.
    """
    __tracebackhide__ = True  # a failure's traceback shows the check and the ranks, not this
    from harness import RankFailure, Unsupported, run_on_ranks
    from harness.run.remembered import mark_built_families
    from harness.run.session import current

    session = current()
    scenarios = [s for s in _scenarios_in(args) if s is not by_reference]
    try:
        for scenario in scenarios:
            known = session.remembered.refused(scenario.family, scenario.options())
            if known is not None:
                raise known  # a remembered refusal: no rank job
        known = session.remembered.refused_every(families)
        if known is not None:
            raise mark_built_families(known, families)  # no rank job either
        try:
            values = run_on_ranks(fn, *args, world_size=world_size)
        except Unsupported as exc:
            for scenario in scenarios:
                session.remembered.remember(scenario.family, scenario.options(), exc)
            for family in families:
                session.remembered.remember(family, {}, exc)
            if families:
                mark_built_families(exc, families)
            raise
        except RankFailure:  # the job ran and failed: its configuration reached the ranks
            for axes in exercised(fn, args):
                session.note_exercised(axes)
            raise
        for axes in exercised(fn, args):
            session.note_exercised(axes)
        return values
    except Unsupported as exc:
        from hypothesis.control import currently_in_test_context

        if currently_in_test_context():
            session.refuse(exc)  # also where the plugin cannot wrap the test (stateful)
        raise


def report(entry: Mapping[str, Sequence[str]]) -> None:
    """Report what a job run without :func:`run` exercised (axis and argument values), for
    the running check (a job shared by several checks: each reports its own part)."""
    from harness.run.session import current

    current().note_exercised(entry)


def exercised(fn: Callable[..., Any], args: tuple[Any, ...]) -> list[dict[str, tuple[str, ...]]]:
    """The entries a job reports: each scenario's axis values with the argument values the
    job passes (those alone when no scenario is among ``args``)."""
    passed = passed_by(fn, args)
    found = [{**axes, **passed} for axes in _axes_in(args)]
    return found or ([passed] if passed else [])


def _axes_in(args: tuple[Any, ...]) -> list[dict[str, tuple[str, ...]]]:
    """The axis values of the scenarios among ``args`` (a checkpoint plan's or a session
    segment's with its format, and the moments it saves at: its ``moments``)."""
    found: list[dict[str, tuple[str, ...]]] = []
    for arg in args:
        if isinstance(arg, Scenario):
            found.append(scenario_axes(arg))
        elif is_dataclass(arg) and not isinstance(arg, type):
            fmt = getattr(arg, "fmt", None)
            fmt = fmt if isinstance(fmt, str) else None
            moments = tuple(getattr(arg, "moments", None) or ())
            for v in vars(arg).values():
                if isinstance(v, Scenario):
                    axes = scenario_axes(v, fmt)
                    if moments:
                        axes["moment"] = tuple(sorted(set(moments)))
                    found.append(axes)
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
