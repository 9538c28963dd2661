"""pytest wiring for conformance: clause markers, outcomes, selection, strictness, the report.

Loaded as its own plugin (entry point ``shardcheck_conformance``, or ``-p harness.conformance``).
Every collected test is a *check* with a stable id (``<suite module>.<test>[<param id>]``)
and the contract's clauses (:mod:`harness.clauses`, ``CONTRACT.md``) of its
``@pytest.mark.clause(...)`` markers. Each check ends with one outcome (``passed``,
``failed``, ``error``, ``unsupported``, ``environment``, ``xfailed``, or ``not run`` for a
check an interrupted or stopped session never reached); a deselected check is listed in the
report's ``selection``. Failures are grouped into findings, one per root cause, each under the
clause it breaks (:mod:`~harness.conformance.findings.grouping`); a check stopped by another
clause's violation is ``blocked``. ``--list-clauses`` prints the contract and exits.

This module is the plugin pytest loads: its options and hooks, light enough for every pytest
run ([Note: the plugins' cost] in :mod:`harness.entry.inplay`); the rest is imported when a
run uses shardcheck. :mod:`~harness.conformance.session` holds the hooks of one session
(:class:`ConformancePlugin`), and three sub-packages the rest, by role:

- :mod:`harness.conformance.findings`: how failures become findings (what one failure is,
  its headline, failures grouped by root cause);
- :mod:`harness.conformance.outcomes`: how each check gets its outcome (ids, refusals, shrink
  budgets, triage, replays) and the strict verdict;
- :mod:`harness.conformance.output`: what the run prints and writes (progress lines, the
  summary, JUnit properties, the report's data, facts and coverage).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.entry import inplay
from harness.entry.lazy import lazy_exports

if TYPE_CHECKING:
    from harness.conformance.outcomes.checks import check_id
    from harness.conformance.outcomes.unsupported import (
        record_unsupported,
        skip_or_reject_unsupported,
    )
    from harness.conformance.session import ConformancePlugin

__all__ = [
    "ConformancePlugin",
    "check_id",
    "record_unsupported",
    "skip_or_reject_unsupported",
]

PLUGIN_NAME = "shardcheck-conformance-session"

#: where each exported name lives: imported on first use, so that this plugin module costs
#: nothing in a run that does not use shardcheck ([Note: the plugins' cost] in harness.entry.inplay)
_HOMES = {
    "ConformancePlugin": "harness.conformance.session",
    "check_id": "harness.conformance.outcomes.checks",
    "record_unsupported": "harness.conformance.outcomes.unsupported",
    "skip_or_reject_unsupported": "harness.conformance.outcomes.unsupported",
}


__getattr__ = lazy_exports(globals(), _HOMES)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--clauses``, ``--expected-failures``, ``--conformance-strict/-report``."""
    group = parser.getgroup("shardcheck-conformance", "shardcheck conformance report")
    group.addoption(
        "--clauses",
        default=None,
        metavar="LIST",
        help="run only checks declaring a matching clause: comma-separated ids or globs "
        "(e.g. CKPT-RT-3,CLIP-1 or 'CKPT-*'); the others are deselected.",
    )
    group.addoption(
        "--list-clauses",
        action="store_true",
        default=False,
        help="print the contract's clauses (only those --clauses selects, if given) and exit.",
    )
    group.addoption(
        "--expected-failures",
        default=None,
        metavar="FILE",
        help="file of 'CHECK_ID  reason' lines (# comments): those checks are strict xfails; "
        "'finding:CLAUSE  reason' expects a late finding of CLAUSE (a raising teardown).",
    )
    group.addoption(
        "--conformance-strict",
        action="store_true",
        default=False,
        help="fail the run if any check is not passed, environment or unsupported (xfailed, "
        "error, failed, blocked...), or if the strategy declared every check unsupported, so "
        "an all-skipped run never looks green. A strategy that offers part of the space "
        "conforms when what it offers passes; --require-whole-space makes unsupported fail.",
    )
    group.addoption(
        "--require-whole-space",
        action="store_true",
        default=False,
        help="with --conformance-strict: a check the strategy declared unsupported fails the "
        "run too (the strategy must offer the whole configuration space).",
    )
    group.addoption(
        "--shrink-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds Hypothesis may spend shrinking one failing check (0: no limit); default "
        "by profile: ci 20, dev 120, nightly Hypothesis' own limits. A failure another check "
        "already found is not shrunk again.",
    )
    group.addoption(
        "--conformance-report",
        default=None,
        metavar="DIR",
        help="write report.json and report.md (outcomes by check and by clause), summary.md "
        "(short, for a PR comment) and report.html (for a browser) into DIR.",
    )
    group.addoption(
        "--reproduce-failure",
        default=None,
        metavar="VERSION:BLOB",
        help="replay the exact failing example of the one selected check (a finding's "
        "reproduce line carries it; Hypothesis prints it as @reproduce_failure).",
    )
    inplay.remember_options(group)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """``--reproduce-failure``: give the one selected check its example to replay."""
    value = session.config.getoption("reproduce_failure", None)
    if value:
        from harness.conformance.outcomes.replay import apply

        apply(value, session.items)


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``clause`` marker; in a run that uses shardcheck, :func:`start`."""
    config.addinivalue_line(
        "markers",
        "clause(*ids): the contract's clause ids this check verifies (e.g. 'CKPT-RT-3').",
    )
    if not (config.option.help or config.option.version) and inplay.wanted(config):
        inplay.activate(config)


def start(config: pytest.Config, pytest_session: pytest.Session | None = None) -> None:
    """Register this session's :class:`ConformancePlugin` (once); ``pytest_session``: the
    running session, when the run's first use of shardcheck came during collection."""
    from harness.conformance.session import ConformancePlugin

    if config.pluginmanager.has_plugin(PLUGIN_NAME):
        return
    plugin = ConformancePlugin(config)
    config.pluginmanager.register(plugin, PLUGIN_NAME)
    if pytest_session is not None:
        plugin.pytest_sessionstart(pytest_session)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Keep the pytest session, for a start during collection."""
    inplay.remember_session(session)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Start once a collected test module has imported the harness."""
    if not inplay.is_active(item.config) and inplay.newly_imported(item.config):
        inplay.activate(item.config)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """A check (a test with a ``clause`` or ``world_size`` marker) in a run not started yet:
    start now, and do what the conformance plugin does with the items (its hook is not in this
    call)."""
    markers = ("clause", "world_size")
    if inplay.is_active(config) or not any(i.get_closest_marker(m) for i in items for m in markers):
        return
    inplay.activate(config)
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    if plugin is not None:
        plugin.pytest_collection_modifyitems(session, config, items)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """Check ``--clauses`` and ``--conformance-report`` before any plugin is configured (so
    before any rank starts); ``--list-clauses``: print the contract (or the ``--clauses``
    selection) and exit 0."""
    if getattr(config.option, "help", False) or getattr(config.option, "version", False):
        return None
    replay = config.getoption("reproduce_failure", None)
    if replay:
        from harness.conformance.outcomes.replay import parse

        parse(replay)
    patterns = config.getoption("clauses")
    if patterns is None and not config.getoption("list_clauses"):
        check_report_dir(config.getoption("conformance_report"))
        return None
    from harness.clauses import UnknownClauseError, select
    from harness.clauses.markdown import render_listing

    try:
        ids = select(patterns) if _parsed(patterns) else None
    except UnknownClauseError as exc:
        raise pytest.UsageError(f"--clauses: {exc}") from None
    if config.getoption("list_clauses"):
        print(render_listing(ids), end="")
        return 0
    check_report_dir(config.getoption("conformance_report"))
    return None


def check_report_dir(directory: str | None) -> None:
    """Make ``--conformance-report DIR`` if missing and prove it writable (a probe file is
    created and removed), so an unwritable one is refused at start-up, not after the run.

    Raises:
        pytest.UsageError: the directory cannot be made or written to.
    """
    if not directory:
        return
    step = "create the directory"
    try:
        if os.path.lexists(directory) and not os.path.isdir(directory):
            raise NotADirectoryError(errno.ENOTDIR, "it exists and is not a directory")
        Path(directory).mkdir(parents=True, exist_ok=True)
        step = "create a file in it"
        handle, probe = tempfile.mkstemp(prefix=".shardcheck-probe-", dir=directory)
        os.close(handle)
        os.remove(probe)
    except OSError as exc:
        why = f"[Errno {exc.errno}] {exc.strerror}" if exc.strerror else str(exc)
        raise pytest.UsageError(
            f"--conformance-report={directory!r}: cannot {step}: {why}; pass a directory "
            "you can write to, e.g. --conformance-report ./conformance-report."
        ) from None


def _parsed(patterns: str | None) -> list[str]:
    if patterns is None:
        return []
    from harness.conformance.session import _parse_clauses

    return _parse_clauses(patterns)
