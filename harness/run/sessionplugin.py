"""The harness session as a pytest plugin: its hooks, registered as ``shardcheck-session``.

:func:`harness.plugin.pytest_configure` makes one :class:`SessionPlugin` per pytest session
(see [Note: the session object] in :mod:`harness.run.session`). Its hooks bound each test's
jobs by its pytest-timeout limit, route each job's rank output to the report of the test
that ran it, turn a Hypothesis test none of whose examples could run here into the refusal's
skip, stop the run when a pool is lost, print the rank warnings summary, and stop every pool
when the session ends.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from functools import partial
from typing import Any

import pytest
from hypothesis.errors import Unsatisfiable

from harness.pool.heals import describe_heals
from harness.pool.progress import moved_line
from harness.pool.rankpool import switches_line
from harness.pool.usage import leak_warning, usage_line
from harness.refusals import EnvironmentRefusal
from harness.run.budget import TestBudget
from harness.run.session import HarnessSession, activate, deactivate
from harness.verdicts.outcomes import Outcome
from harness.verdicts.rankwarnings import write_summary

__all__ = ["SessionPlugin", "attach_output"]


def attach_output(item: pytest.Item, when: str, outcomes: Sequence[Outcome]) -> None:
    """Add each rank's captured output to the test's report sections."""
    for o in outcomes:
        for name, text in (("stdout", o.stdout), ("stderr", o.stderr)):
            if text:
                item.add_report_section(when, f"rank {o.rank} {name}", text)


class SessionPlugin:
    """The pytest hooks of one harness session.

    Args:
        session: the harness session; made the current one until ``pytest_unconfigure``.
    """

    def __init__(self, session: HarnessSession) -> None:
        self.session = session
        self.pytest_session: pytest.Session | None = None
        activate(session)

    def _with_sink(self, item: pytest.Item, when: str) -> Generator[None, Any, Any]:
        previous = self.session.output_sink
        self.session.output_sink = partial(attach_output, item, when)
        try:
            return (yield)
        finally:
            self.session.output_sink = previous

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, Any, Any]:
        """Bound the test's jobs by its pytest-timeout limit, so that the harness's verdict
        comes first (see [Note: the test's time budget] in :mod:`harness.run.budget`)."""
        self.session.budget = TestBudget.of(item)
        try:
            return (yield)
        finally:
            self.session.budget = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, Any]:
        """Attach rank output of jobs run during setup (fixtures) to the report."""
        return (yield from self._with_sink(item, "setup"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        """Attach rank output of the test's jobs to the report; a Hypothesis test none of
        whose examples fits the run (each refused as ``environment``) is that skip."""
        self.session.forget_refusals()
        try:
            return (yield from self._with_sink(item, "call"))
        except Unsatisfiable:
            refusal = self.session.take_refusal(EnvironmentRefusal.outcome)
            if refusal is not None:
                pytest.skip(refusal.describe())
            raise

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, Any, Any]:
        """Attach rank output of jobs run during teardown to the report."""
        return (yield from self._with_sink(item, "teardown"))

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Remember the pytest session (it is stopped when a pool is lost)."""
        self.pytest_session = session

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        """In attach mode, end the session once a rank is gone (nothing can run any more)."""
        lost = self.session.lost_reason()
        session = self.pytest_session
        if lost and session is not None and not session.shouldstop:
            first = lost.splitlines()[0]
            session.shouldstop = f"shardcheck attach mode: the run cannot go on ({first})"

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Stop the pools as soon as the session ends (also after Ctrl-C and -x)."""
        self.session.shutdown()

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Print the rank warnings summary (nothing when no rank warned), last: after the
        conformance summary and findings."""
        for line in describe_heals(self.session.heals):  # see [Note: heals are counted]
            terminalreporter.write_line(line if line.startswith(" ") else f"shardcheck: {line}")
        moved = moved_line(self.session.cutoffs_moved)  # see [Note: slow is not hung]
        if moved:
            terminalreporter.write_line(f"shardcheck: {moved}")
        attached = self.session.config.attach is not None
        switched = switches_line(self.session.switches, attached)  # see [Note: sub-worlds]
        if switched:
            terminalreporter.write_line(f"shardcheck: {switched}")
        usage = usage_line(self.session.usage)  # see [Note: bounded ranks]
        if usage:
            terminalreporter.write_line(f"shardcheck: {usage}")
        leak = leak_warning(self.session.usage, self.session.config.strategy)
        if leak:
            terminalreporter.write_line(f"shardcheck: warning: {leak}", yellow=True)
        write_summary(terminalreporter, self.session.warnings)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """Stop every pool and the forkserver: no process outlives the session."""
        self.session.shutdown(final=True)
        deactivate(self.session)
